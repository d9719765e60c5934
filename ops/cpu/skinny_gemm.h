// C = A W^T for few rows of A: the shape of a linear layer (and the tied output projection) during
// incremental decoding, where BLAS would pack all of W on every call and spend as long packing as
// multiplying.
#pragma once

#include <cstdint>

namespace mf::cpu {

/// The most rows of A skinny_gemm_nt takes.
inline constexpr int64_t kSkinnyMaxRows = 128;

/// c[i * ldc + j] = sum_p a[i * lda + p] * w[j * ldw + p] for i < n, j < m, split over the pool.
/// Returns false, computing nothing, when kernel_isa() is narrower than AVX2 or n > kSkinnyMaxRows;
/// the caller then uses BLAS.
bool skinny_gemm_nt(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                    float* c, int64_t ldc);

}  // namespace mf::cpu
