// W streams through once, untouched: A^T (at most 128 rows, zero-padded to whole 16-lane vectors)
// sits in a small buffer, and each 16-row slice of it meets 8 rows of W at a time in 16 (2 x 8)
// accumulators, one FMA per element of W per slice, with no horizontal sums.
#include "ops/cpu/skinny_gemm.h"

#include "core/parallel.h"
#include "ops/cpu/simd.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace mf::cpu {
namespace {

constexpr int64_t kLanes = 16;  // floats per AVX-512 vector
constexpr int64_t kWRows = 8;   // rows of W per register block

/// Rows [j0, j0 + kWRows) of W against slice s0 and, with Both, s0 + 1 of at (A^T, [k, padded]).
template <bool Both>
[[gnu::target("avx512f")]] void block(int64_t j0, int64_t s0, int64_t n, int64_t k, const float* at, int64_t padded,
                                      const float* w, int64_t ldw, float* c, int64_t ldc) {
  __m512 acc[2][kWRows];
  for (auto& slice : acc)
    for (__m512& v : slice) v = _mm512_setzero_ps();
  const float* column = at + s0 * kLanes;
  for (int64_t p = 0; p < k; ++p, column += padded) {
    __m512 a0 = _mm512_loadu_ps(column), a1 = Both ? _mm512_loadu_ps(column + kLanes) : a0;
    for (int64_t r = 0; r < kWRows; ++r) {
      __m512 weight = _mm512_set1_ps(w[(j0 + r) * ldw + p]);
      acc[0][r] = _mm512_fmadd_ps(a0, weight, acc[0][r]);
      if (Both) acc[1][r] = _mm512_fmadd_ps(a1, weight, acc[1][r]);
    }
  }
  alignas(64) float lanes[kLanes];
  for (int64_t s = 0; s < (Both ? 2 : 1); ++s)
    for (int64_t r = 0; r < kWRows; ++r) {
      _mm512_store_ps(lanes, acc[s][r]);
      for (int64_t l = 0, i = (s0 + s) * kLanes; l < kLanes && i < n; ++l, ++i) c[i * ldc + j0 + r] = lanes[l];
    }
}

}  // namespace

bool skinny_gemm_nt(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                    float* c, int64_t ldc) {
  if (kernel_isa() != Isa::avx512 || n > kSkinnyMaxRows || n == 0 || m == 0) return false;
  int64_t slices = (n + kLanes - 1) / kLanes, padded = slices * kLanes;
  // [k, padded]: A^T, zero past row n. Kept per thread: decoding calls this hundreds of times a step.
  thread_local std::vector<float> transposed;
  transposed.resize(static_cast<size_t>(k * padded));
  float* at = transposed.data();
  constexpr int64_t kTile = 16;  // transposed in tiles that stay in L1
  for (int64_t i0 = 0; i0 < padded; i0 += kTile)
    for (int64_t p0 = 0; p0 < k; p0 += kTile)
      for (int64_t i = i0; i < i0 + kTile; ++i)
        for (int64_t p = p0; p < std::min(k, p0 + kTile); ++p) at[p * padded + i] = i < n ? a[i * lda + p] : 0.0f;
  int64_t blocks = m / kWRows;
  // A block of W rows costs about k * slices FMAs; a chunk of blocks should be worth a thread.
  int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, k * slices));
  parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      int64_t s = 0;
      for (; s + 2 <= slices; s += 2) block<true>(b * kWRows, s, n, k, at, padded, w, ldw, c, ldc);
      if (s < slices) block<false>(b * kWRows, s, n, k, at, padded, w, ldw, c, ldc);
    }
  });
  for (int64_t j = blocks * kWRows; j < m; ++j)  // the last m % kWRows rows of W, one dot product each
    for (int64_t i = 0; i < n; ++i) {
      float total = 0;
      for (int64_t p = 0; p < k; ++p) total += a[i * lda + p] * w[j * ldw + p];
      c[i * ldc + j] = total;
    }
  return true;
}

}  // namespace mf::cpu
