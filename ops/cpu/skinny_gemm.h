// C = A W^T (+ bias, then ReLU) for few rows of A: the shape of a linear layer (and the tied output
// projection) during incremental decoding, where sgemm would pack all of W on every call and spend
// about as long packing as multiplying. It pays from one vector of rows (a full slice of A^T: 16 on
// AVX-512, 8 on AVX2) to kSkinnyMaxRows; sgemm takes the rest (BENCHMARKS.md has the measurements).
// It gives sgemm's bits, so which kernel runs never changes a result.
#pragma once

#include "ops/cpu/sgemm.h"

#include <cstdint>

namespace mf::cpu {

/// The most rows of A skinny_gemm_nt takes.
inline constexpr int64_t kSkinnyMaxRows = 32;

/// c[i * ldc + j] = sum_p a[i * lda + p] * w[j * ldw + p] for i < n, j < m, through the epilogue's
/// bias and ReLU (sgemm.h), split over the pool. Returns false, computing nothing, when kernel_isa()
/// is narrower than AVX2, for fewer rows than one vector of floats or more than kSkinnyMaxRows, for
/// k == 0, or for an epilogue with alpha != 1 or beta != 0; the caller then uses sgemm (or BLAS).
bool skinny_gemm_nt(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                    float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});

}  // namespace mf::cpu
