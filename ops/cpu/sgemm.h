// miniflow's own float GEMM for AVX-512 and AVX2 CPUs. OpenBLAS packs both operands on every call,
// and on the products of a training step (k of 256 to 1024, operands fresh from other kernels) that
// packing and its cache misses cost more than the product; this kernel reads A where it lies and
// packs only B (ops/cpu/sgemm_kernel.inc says how; BENCHMARKS.md has the figures).
#pragma once

#include "core/isa.h"

#include <cstdint>

namespace mf::cpu {

/// The values of k over which sgemm sums each element of c as one chain of FMAs before adding the
/// chain to c (the next block's chain is added to what the previous ones left).
inline constexpr int64_t kGemmBlockK = 512;

/// What a GEMM does beyond the product: c = alpha op(a) op(b) + beta c (+ bias[j] in column j, where
/// bias is given), then with `relu` max(c, 0) as math::Relu (NaN kept). The defaults give c = a b.
template <typename T>
struct GemmEpilogue {
  T alpha = 1;
  T beta = 0;
  const T* bias = nullptr;  // one value per column of c
  bool relu = false;
};

/// c = op(a) op(b) through `epilogue`, row-major, op(x) = x or x^T; op(a) is rows x depth, op(b)
/// depth x cols, c rows x cols with rows ldc apart (BLAS's m, n, k). With beta == 0, c is
/// written without being read (NaN there stays out); a and b are read whatever alpha is (unlike
/// BLAS with alpha == 0, which no caller passes). Single-threaded: callers split the work. Each
/// element of c comes out the same whatever rows or columns the caller splits off, and the same on
/// the AVX-512 and AVX2 paths. Returns false, computing nothing, when kernel_isa() is narrower than
/// AVX2; the caller then uses BLAS.
bool sgemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});

namespace detail {
/// sgemm on a given path (`isa` no wider than the CPU runs), for tests that compare the paths.
bool sgemm_on(Isa isa, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a,
              int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});
}  // namespace detail

}  // namespace mf::cpu
