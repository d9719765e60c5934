// The loops are GotoBLAS's, except that A is read where it lies:
//
//   for each block of kBlockK values of k (c accumulates across them)
//     for each block of columns whose packed B fits kPackedBBytes (it stays in L2)
//       pack that block of op(B) into panels of 32 columns, k-major, zero-padded
//       for each block of kBlockRows rows (op(A) = A^T only: pack their values, 12 per k)
//         for each strip of 12 rows, for each panel: the micro-kernel
//
// Where B spans several column blocks, A^T would be packed again for each of them: it is packed
// whole, once per block of k, when that fits kPackedABytes (as dW = dY^T X of a wide layer needs).
//
// The micro-kernel keeps a 12 x 32 tile of c in 24 registers; each k loads two vectors of the
// panel, broadcasts 12 values of A and issues 24 FMAs, so it is bound by the FMA units, not by
// loads. Rows of A (op(A) = A) are read in place: 12 streams the prefetchers follow, each cache
// line serving 16 values of k. Columns of A^T are not: their values for one k sit lda apart, so a
// block of rows is packed first, from contiguous runs of each row of A^T.
#include "ops/cpu/sgemm.h"

#include "ops/math.h"
#include "ops/cpu/simd.h"

#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace mf::cpu {
namespace {

constexpr int64_t kLanes = 16;                // floats per AVX-512 vector
constexpr int64_t kPanelColumns = 2 * kLanes;  // columns of a B panel and of the micro-kernel's tile
constexpr int64_t kStripRows = 12;            // rows of the micro-kernel's tile: 24 accumulators of 32
constexpr int64_t kBlockK = 512;
constexpr int64_t kBlockRows = 96;            // rows of A^T packed at a time (8 strips, 192 KiB)
constexpr int64_t kPackedBBytes = 1 << 20;
constexpr int64_t kPackedABytes = 512 << 10;  // A^T packed whole: with packed B, within a 2 MiB L2

/// A 64-byte aligned scratch buffer of `floats` floats, one per thread, kept between calls.
float* scratch(std::vector<float>& buffer, int64_t floats) {
  if (buffer.size() < static_cast<size_t>(floats + kLanes)) buffer.resize(static_cast<size_t>(floats + kLanes));
  void* start = buffer.data();
  size_t space = buffer.size() * sizeof(float);
  return static_cast<float*>(std::align(64, static_cast<size_t>(floats) * sizeof(float), start, space));
}

/// The lanes of the first `count` of a vector's 16 floats.
__mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>(count >= kLanes ? 0xFFFF : count > 0 ? (1u << count) - 1 : 0);
}

/// Lane masks for the first `width` (<= 32) columns of a panel, 16 per vector.
struct ColumnMasks {
  __mmask16 low, high;
  explicit ColumnMasks(int64_t width) : low(first_lanes(width)), high(first_lanes(width - kLanes)) {}
};

// The full-mask forms of the shuffles: GCC 12's plain intrinsics pass _mm512_undefined_ps through,
// which -Wmaybe-uninitialized flags once inlined (GCC bug 105593).
[[gnu::target("avx512f")]] MF_INLINE __m512 unpack_low(__m512 a, __m512 b) {
  return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b);
}
[[gnu::target("avx512f")]] MF_INLINE __m512 unpack_high(__m512 a, __m512 b) {
  return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b);
}
[[gnu::target("avx512f")]] MF_INLINE __m512 unpack_low_pairs(__m512 a, __m512 b) {
  __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
[[gnu::target("avx512f")]] MF_INLINE __m512 unpack_high_pairs(__m512 a, __m512 b) {
  __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
/// 128-bit lanes 0 and 2 of a, then of b (Lanes = 0x88), or lanes 1 and 3 (Lanes = 0xDD).
template <int Lanes>
[[gnu::target("avx512f")]] MF_INLINE __m512 pick_lanes(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, Lanes);
}

/// Transposes 16 rows of 16 floats in registers: rows[i] lane j becomes rows[j] lane i.
[[gnu::target("avx512f")]] MF_INLINE void transpose16(__m512 rows[kLanes]) {
  __m512 pairs[kLanes];
  for (int i = 0; i < 8; ++i) {  // rows 2i and 2i+1 interleaved
    pairs[2 * i] = unpack_low(rows[2 * i], rows[2 * i + 1]);
    pairs[2 * i + 1] = unpack_high(rows[2 * i], rows[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i)  // rows[4i + c]: column c of each 128-bit lane, over rows 4i..4i+3
    for (int half = 0; half < 2; ++half) {
      rows[4 * i + 2 * half] = unpack_low_pairs(pairs[4 * i + half], pairs[4 * i + 2 + half]);
      rows[4 * i + 2 * half + 1] = unpack_high_pairs(pairs[4 * i + half], pairs[4 * i + 2 + half]);
    }
  for (int i = 0; i < 2; ++i)  // gather the 128-bit lanes: two row groups at a time, then all four
    for (int c = 0; c < 4; ++c) {
      pairs[8 * i + c] = pick_lanes<0x88>(rows[8 * i + c], rows[8 * i + 4 + c]);
      pairs[8 * i + 4 + c] = pick_lanes<0xDD>(rows[8 * i + c], rows[8 * i + 4 + c]);
    }
  for (int c = 0; c < 8; ++c) {
    rows[c] = pick_lanes<0x88>(pairs[c], pairs[8 + c]);
    rows[8 + c] = pick_lanes<0xDD>(pairs[c], pairs[8 + c]);
  }
}

/// Packs op(b)[0:depth, 0:width] (b already offset to the block) into panels of 32 columns, each
/// depth x 32, k-major, columns past `width` zero.
[[gnu::target("avx512f")]] void pack_b(bool trans_b, int64_t depth, int64_t width, const float* b, int64_t ldb,
                                       float* packed) {
  for (int64_t first = 0; first < width; first += kPanelColumns) {
    ColumnMasks masks(std::min(kPanelColumns, width - first));
    float* panel = packed + first * depth;
    if (!trans_b) {  // row p of the panel is a run of row p of b
      for (int64_t p = 0; p < depth; ++p) {
        const float* row = b + p * ldb + first;
        _mm512_store_ps(panel + p * kPanelColumns, _mm512_maskz_loadu_ps(masks.low, row));
        _mm512_store_ps(panel + p * kPanelColumns + kLanes, _mm512_maskz_loadu_ps(masks.high, row + kLanes));
      }
      continue;
    }
    // op(b) = b^T: column j of the panel is a run of row first + j of b; 16 x 16 tiles transposed.
    for (int64_t p0 = 0; p0 < depth; p0 += kLanes) {
      int64_t count = std::min(kLanes, depth - p0);
      __mmask16 run = first_lanes(count);
      for (int64_t half = 0; half < 2; ++half) {
        __mmask16 present = half == 0 ? masks.low : masks.high;
        __m512 tile[kLanes];
        for (int64_t j = 0; j < kLanes; ++j)
          tile[j] = present >> j & 1 ? _mm512_maskz_loadu_ps(run, b + (first + half * kLanes + j) * ldb + p0)
                                     : _mm512_setzero_ps();
        transpose16(tile);
        for (int64_t p = 0; p < count; ++p) _mm512_store_ps(panel + (p0 + p) * kPanelColumns + half * kLanes, tile[p]);
      }
    }
  }
}

/// Packs rows [0, rows) of op(a) = a^T over k in [0, depth) (a offset to the block), strip by
/// strip: strip s holds its 12 rows' values k-major, at packed + s * 12 * depth.
[[gnu::target("avx512f")]] void pack_a_transposed(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                                  float* packed) {
  for (int64_t p = 0; p < depth; ++p)
    for (int64_t strip = 0; strip < rows; strip += kStripRows) {
      __mmask16 present = first_lanes(std::min(kStripRows, rows - strip));
      _mm512_mask_storeu_ps(packed + strip * depth + p * kStripRows, present,
                            _mm512_maskz_loadu_ps(present, a + p * lda + strip));
    }
}

/// Where the micro-kernel reads A: rows in place (row i at a + i * lda) or a packed strip.
enum class ALayout { kRows, kPackedStrip };

/// How a tile's sums land in c: c = alpha sums (+ beta c unless beta == 0) (+ bias, one value per
/// column), then max(c, 0) with relu.
struct Epilogue {
  float alpha, beta;
  const float* bias;  // nullptr, or the bias of the tile's first column
  bool relu;
};

/// c[0:Rows, 0:32 masked] = the epilogue applied to A B_panel over `depth` values of k.
template <int64_t Rows, ALayout Layout>
[[gnu::target("avx512f")]] MF_INLINE void tile(int64_t depth, const float* a, int64_t lda, const float* panel,
                                                float* c, int64_t ldc, ColumnMasks masks, Epilogue epilogue) {
  __m512 low[Rows], high[Rows];
#pragma GCC unroll 12
  for (int64_t i = 0; i < Rows; ++i) low[i] = high[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t p = 0; p < depth; ++p) {
    __m512 b_low = _mm512_load_ps(panel + p * kPanelColumns);
    __m512 b_high = _mm512_load_ps(panel + p * kPanelColumns + kLanes);
#pragma GCC unroll 12
    for (int64_t i = 0; i < Rows; ++i) {
      __m512 ai = _mm512_set1_ps(Layout == ALayout::kRows ? a[i * lda + p] : a[p * kStripRows + i]);
      low[i] = _mm512_fmadd_ps(ai, b_low, low[i]);
      high[i] = _mm512_fmadd_ps(ai, b_high, high[i]);
    }
  }
  float alpha = epilogue.alpha, beta = epilogue.beta;
  __m512 alphas = _mm512_set1_ps(alpha), betas = _mm512_set1_ps(beta);
  __m512 bias_low = _mm512_setzero_ps(), bias_high = _mm512_setzero_ps();
  if (epilogue.bias) {
    bias_low = _mm512_maskz_loadu_ps(masks.low, epilogue.bias);
    bias_high = _mm512_maskz_loadu_ps(masks.high, epilogue.bias + kLanes);
  }
#pragma GCC unroll 12
  for (int64_t i = 0; i < Rows; ++i) {
    float* row = c + i * ldc;
    if (alpha != 1) {
      low[i] = _mm512_mul_ps(low[i], alphas);
      high[i] = _mm512_mul_ps(high[i], alphas);
    }
    if (beta == 1) {
      low[i] = _mm512_add_ps(low[i], _mm512_maskz_loadu_ps(masks.low, row));
      high[i] = _mm512_add_ps(high[i], _mm512_maskz_loadu_ps(masks.high, row + kLanes));
    } else if (beta != 0) {
      low[i] = _mm512_fmadd_ps(betas, _mm512_maskz_loadu_ps(masks.low, row), low[i]);
      high[i] = _mm512_fmadd_ps(betas, _mm512_maskz_loadu_ps(masks.high, row + kLanes), high[i]);
    }
    if (epilogue.bias) {
      low[i] = _mm512_add_ps(low[i], bias_low);
      high[i] = _mm512_add_ps(high[i], bias_high);
    }
    if (epilogue.relu) {  // zero where c < 0, as math::Relu: NaN and -0 stay
      low[i] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(low[i], _mm512_setzero_ps(), _CMP_NLT_UQ), low[i]);
      high[i] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(high[i], _mm512_setzero_ps(), _CMP_NLT_UQ), high[i]);
    }
    _mm512_mask_storeu_ps(row, masks.low, low[i]);
    _mm512_mask_storeu_ps(row + kLanes, masks.high, high[i]);
  }
}

// GCC inlines every tile into the loops (calls cost time on a training step); clang,
// under the fuzz build's sanitizers and coverage, takes minutes over one function holding all 24
// tiles, so there each strip height is a function of its own.
#if defined(__clang__)
#define MF_STRIP_TILE [[gnu::target("avx512f"), gnu::noinline]]
#else
#define MF_STRIP_TILE [[gnu::target("avx512f")]] MF_INLINE
#endif

/// The tile for a strip of `rows` (<= Rows) rows: the row count is a template argument so that the
/// accumulators stay in registers.
template <int64_t Rows, ALayout Layout>
MF_STRIP_TILE void strip_tile(int64_t rows, int64_t depth, const float* a, int64_t lda, const float* panel, float* c,
                              int64_t ldc, ColumnMasks masks, Epilogue epilogue) {
  if constexpr (Rows > 1)
    if (rows < Rows) return strip_tile<Rows - 1, Layout>(rows, depth, a, lda, panel, c, ldc, masks, epilogue);
  tile<Rows, Layout>(depth, a, lda, panel, c, ldc, masks, epilogue);
}

[[gnu::target("avx512f")]] void sgemm_avx512(bool trans_a, bool trans_b, int64_t n, int64_t m, int64_t k,
                                             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                                             float beta, float* c, int64_t ldc, const float* bias, bool relu) {
  thread_local std::vector<float> packed_b_buffer, packed_a_buffer;
  int64_t block_k = std::min(k, kBlockK);
  int64_t panels_per_block =
      std::max<int64_t>(1, kPackedBBytes / static_cast<int64_t>(sizeof(float)) / block_k / kPanelColumns);
  int64_t block_columns = panels_per_block * kPanelColumns;
  int64_t panels = std::min(panels_per_block, (m + kPanelColumns - 1) / kPanelColumns);
  float* packed_b = scratch(packed_b_buffer, block_k * panels * kPanelColumns);
  int64_t strips = (n + kStripRows - 1) / kStripRows;
  bool whole_a = trans_a && m > block_columns &&
                 strips * kStripRows * block_k * static_cast<int64_t>(sizeof(float)) <= kPackedABytes;
  int64_t packed_rows = whole_a ? strips * kStripRows : kBlockRows;
  float* packed_a = trans_a ? scratch(packed_a_buffer, packed_rows * block_k) : nullptr;
  for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
    int64_t depth = std::min(kBlockK, k - p0);
    bool first = p0 == 0;  // later blocks of k add to what the first wrote; the last one clamps
    Epilogue block{.alpha = alpha, .beta = first ? beta : 1, .bias = first ? bias : nullptr,
                   .relu = relu && p0 + kBlockK >= k};
    for (int64_t j0 = 0; j0 < m; j0 += block_columns) {
      int64_t width = std::min(block_columns, m - j0);
      if (whole_a && j0 == 0) pack_a_transposed(n, depth, a + p0 * lda, lda, packed_a);
      pack_b(trans_b, depth, width, trans_b ? b + j0 * ldb + p0 : b + p0 * ldb + j0, ldb, packed_b);
      for (int64_t i0 = 0; i0 < n; i0 += kBlockRows) {
        int64_t rows = std::min(kBlockRows, n - i0);
        if (trans_a && !whole_a) pack_a_transposed(rows, depth, a + p0 * lda + i0, lda, packed_a);
        const float* strips_a = whole_a ? packed_a + i0 * depth : packed_a;
        for (int64_t strip = 0; strip < rows; strip += kStripRows) {
          int64_t strip_rows = std::min(kStripRows, rows - strip);
          for (int64_t column = 0; column < width; column += kPanelColumns) {
            ColumnMasks masks(std::min(kPanelColumns, width - column));
            const float* panel = packed_b + column * depth;
            float* out = c + (i0 + strip) * ldc + j0 + column;
            Epilogue epilogue = block;
            if (block.bias) epilogue.bias += j0 + column;
            if (trans_a)
              strip_tile<kStripRows, ALayout::kPackedStrip>(strip_rows, depth, strips_a + strip * depth, 0, panel,
                                                            out, ldc, masks, epilogue);
            else
              strip_tile<kStripRows, ALayout::kRows>(strip_rows, depth, a + (i0 + strip) * lda + p0, lda, panel, out,
                                                     ldc, masks, epilogue);
          }
        }
      }
    }
  }
}

}  // namespace

bool sgemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  if (kernel_isa() != Isa::avx512) return false;
  if (rows == 0 || cols == 0) return true;
  const auto [alpha, beta, bias, relu] = epilogue;
  if (depth == 0) {  // no products: c = beta c (+ bias), with beta == 0 writing over whatever c held
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float value = (beta == 0 ? 0.0f : beta * c[i * ldc + j]) + (bias ? bias[j] : 0.0f);
        c[i * ldc + j] = relu ? math::Relu{}(value) : value;
      }
    return true;
  }
  sgemm_avx512(trans_a, trans_b, rows, cols, depth, alpha, a, lda, b, ldb, beta, c, ldc, bias, relu);
  return true;
}

}  // namespace mf::cpu
