// miniflow's own float GEMM for AVX-512 CPUs. OpenBLAS packs both operands on every call, and on the
// products of a training step (k of 256 to 1024, operands fresh from other kernels) that packing and
// its cache misses cost more than the product; this kernel reads A where it lies and packs only B
// (ops/cpu/sgemm.cpp says how; BENCHMARKS.md has the figures).
#pragma once

#include <cstdint>

namespace mf::cpu {

/// c = alpha op(a) op(b) + beta c (+ bias[j] in column j), then with `relu` max(c, 0) (NaN kept),
/// row-major, op(x) = x or x^T; op(a) is n x k, op(b) k x m, c n x m with rows ldc apart, bias m
/// values or nullptr. With beta == 0, c is
/// written without being read (NaN there stays out); a and b are read whatever alpha is (unlike
/// BLAS with alpha == 0, which no caller passes). Single-threaded: callers split the work. Each
/// element of c comes out the same whatever rows or columns the caller splits off. Returns false,
/// computing nothing, when the CPU lacks AVX-512; the caller then uses BLAS.
bool sgemm(bool trans_a, bool trans_b, int64_t n, int64_t m, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr,
           bool relu = false);

}  // namespace mf::cpu
