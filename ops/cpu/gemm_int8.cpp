// The int8 GEMM (ops/cpu/gemm_int8.h). The AVX2 micro-kernel follows oneDNN's AVX2 int8 scheme: each input row
// is shifted to unsigned (q + 128, one xor per call) so that vpmaddubsw can multiply it by the signed
// weights, adding pairs of products to int16 (at most 2 x 255 x 63 = 32,130: weights stop at +-63 so
// that this never saturates), and vpmaddwd against ones adds those pairs into int32 lanes, one per
// channel of the panel. Per group of 4 values of k a row costs a broadcast, those two and a vpaddd,
// for 32 multiply-adds; 6 rows keep their 6 x 8 sums in 6 registers. The shift adds 128 times the
// channel's weight sum to every sum, taken off at the end (the packing keeps those sums), and the
// epilogue runs on the sums still in registers. The baseline path sums the signed values directly and
// runs the same epilogue in scalars: every path gives the same bits.
#include "ops/cpu/gemm_int8.h"

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/float_vectors.h"
#include "ops/math.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace mf::cpu {
namespace {

constexpr int64_t kPanel = PackedInt8Weight::kPanelColumns;
constexpr int64_t kQuadBytes = 4 * kPanel;  // one group of 4 values of k, for a panel's 8 channels
constexpr int64_t kStripRows = 6;

/// Where a strip's sums with one panel go: c (rows ldc apart, at the strip's first row and the
/// panel's first channel) through the formula of gemm_int8.h, with the strip's x_scales and the
/// panel's w_scales and bias (nullptr: none).
struct TileOutput {
  const float* x_scales;
  const float* w_scales;
  const float* bias;
  bool relu;
  float* c;
  int64_t ldc;
};

/// c[i, j] for sums[i][j] of the panel's first `channels` channels: the formula, in scalars. The AVX2
/// path's full panels do the same float operations in the same order in vectors (no FMA: the build
/// contracts nothing), so every path gives the same bits.
void store_tile(int64_t rows, int64_t channels, const int32_t (*sums)[kPanel], const TileOutput& out) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < channels; ++j) {
      float value = static_cast<float>(sums[i][j]) * (out.x_scales[i] * out.w_scales[j]);
      if (out.bias != nullptr) value += out.bias[j];
      out.c[i * out.ldc + j] = out.relu ? math::Relu{}(value) : value;
    }
}

/// Sums of rows [0, rows) of q_x (int8, ldq apart) with one panel, scalar.
void panel_sums_baseline(int64_t rows, int64_t depth, const int8_t* q_x, int64_t ldq, const int8_t* panel,
                         int32_t (*sums)[kPanel]) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t channel = 0; channel < kPanel; ++channel) {
      int32_t sum = 0;
      for (int64_t k = 0; k < depth; ++k)
        sum += int32_t{q_x[i * ldq + k]} * int32_t{panel[k / 4 * kQuadBytes + channel * 4 + k % 4]};
      sums[i][channel] = sum;
    }
}

/// The largest |x| of a row, or infinity when it holds NaN or an infinity.
float largest_magnitude(const float* row, int64_t depth) {
  float largest = 0;
  bool finite = true;
  for (int64_t k = 0; k < depth; ++k) {
    finite = finite && std::isfinite(row[k]);
    largest = std::max(largest, std::fabs(row[k]));
  }
  return finite ? largest : std::numeric_limits<float>::infinity();
}

/// out[k] = x[k] * multiplier rounded to nearest, ties to even, clamped to [-limit, limit] (|x| <=
/// the row's largest, so only the multiplier's own rounding could take a product past the limit).
void quantize_values(const float* x, int64_t count, float multiplier, float limit, int8_t* out) {
  for (int64_t k = 0; k < count; ++k)
    out[k] = static_cast<int8_t>(std::clamp(std::nearbyint(x[k] * multiplier), -limit, limit));
}

#if defined(__x86_64__) && defined(__GNUC__)
MF_BEGIN_TARGET("avx2,fma")

/// Rows of a (q + 128 as unsigned bytes, lda apart, padded to whole groups) times one panel, the
/// shift's share (128 times each channel's weight sum) taken off, through `out` for `channels` of the
/// panel's channels: a full panel in vectors straight from the sums' registers, a partial one through
/// store_tile.
template <int64_t Rows>
MF_INLINE void panel_tile_avx2(int64_t quads, const uint8_t* a, int64_t lda, const int8_t* panel,
                               const int32_t* column_sums, int64_t channels, const TileOutput& out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[Rows];
#pragma GCC unroll 6
  for (int64_t i = 0; i < Rows; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t g = 0; g < quads; ++g) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + g * kQuadBytes));
#pragma GCC unroll 6
    for (int64_t i = 0; i < Rows; ++i) {
      int32_t values;
      std::memcpy(&values, a + i * lda + 4 * g, sizeof values);
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(values), b);
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
    }
  }
  const __m256i shift = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(column_sums)), 7);
  if (channels < kPanel) {
    int32_t sums[Rows][kPanel];
#pragma GCC unroll 6
    for (int64_t i = 0; i < Rows; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums[i]), _mm256_sub_epi32(acc[i], shift));
    return store_tile(Rows, channels, sums, out);
  }
  const __m256 w_scales = _mm256_loadu_ps(out.w_scales);
  const __m256 bias = out.bias != nullptr ? _mm256_loadu_ps(out.bias) : _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int64_t i = 0; i < Rows; ++i) {
    const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(out.x_scales[i]), w_scales);
    __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i], shift)), scales);
    if (out.bias != nullptr) value = _mm256_add_ps(value, bias);
    if (out.relu) value = Avx2Floats::relu(value);
    _mm256_storeu_ps(out.c + i * out.ldc, value);
  }
}

void strip_tile_avx2(int64_t rows, int64_t quads, const uint8_t* a, int64_t lda, const int8_t* panel,
                     const int32_t* column_sums, int64_t channels, const TileOutput& out) {
  static_assert(kStripRows == 6);
  switch (rows) {
    case 1: return panel_tile_avx2<1>(quads, a, lda, panel, column_sums, channels, out);
    case 2: return panel_tile_avx2<2>(quads, a, lda, panel, column_sums, channels, out);
    case 3: return panel_tile_avx2<3>(quads, a, lda, panel, column_sums, channels, out);
    case 4: return panel_tile_avx2<4>(quads, a, lda, panel, column_sums, channels, out);
    case 5: return panel_tile_avx2<5>(quads, a, lda, panel, column_sums, channels, out);
    default: return panel_tile_avx2<6>(quads, a, lda, panel, column_sums, channels, out);
  }
}

/// Rows of q (ldq apart) as unsigned bytes q + 128 (q xor 0x80) in out, rows `padded` apart, the
/// padding past depth 0x80 (q = 0).
void shift_rows_avx2(int64_t rows, int64_t depth, const int8_t* q, int64_t ldq, uint8_t* out, int64_t padded) {
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < rows; ++i) {
    const int8_t* row = q + i * ldq;
    uint8_t* shifted = out + i * padded;
    int64_t k = 0;
    for (; k + 32 <= depth; k += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(shifted + k),
                          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)), sign));
    for (; k < depth; ++k) shifted[k] = static_cast<uint8_t>(row[k]) ^ 0x80;
    for (; k < padded; ++k) shifted[k] = 0x80;
  }
}

/// The largest |x| of a row, or infinity when it holds NaN or an infinity.
float largest_magnitude_avx2(const float* row, int64_t depth) {
  const __m256 sign = _mm256_set1_ps(-0.0f), infinity = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 largest = _mm256_setzero_ps(), not_finite = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= depth; k += 8) {
    __m256 magnitude = _mm256_andnot_ps(sign, _mm256_loadu_ps(row + k));
    largest = _mm256_max_ps(largest, magnitude);
    not_finite = _mm256_or_ps(not_finite, _mm256_cmp_ps(magnitude, infinity, _CMP_NLT_UQ));  // inf or NaN
  }
  if (_mm256_movemask_ps(not_finite) != 0) return std::numeric_limits<float>::infinity();
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  return std::max(largest_magnitude(lanes, 8), largest_magnitude(row + k, depth - k));  // the tail: scalar
}

/// quantize_values over a row, 8 values at a time with the same arithmetic.
void quantize_row_avx2(const float* row, int64_t depth, float multiplier, float limit, int8_t* out) {
  const __m256 scale = _mm256_set1_ps(multiplier), high = _mm256_set1_ps(limit), low = _mm256_set1_ps(-limit);
  int64_t k = 0;
  for (; k + 8 <= depth; k += 8) {
    __m256 rounded = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(row + k), scale),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i words = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rounded, low), high));
    __m128i halves = _mm_packs_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + k), _mm_packs_epi16(halves, halves));
  }
  quantize_values(row + k, depth - k, multiplier, limit, out + k);
}

MF_END_TARGET
#endif

}  // namespace

void quantize_rows(int64_t rows, int64_t depth, const float* x, int64_t ld, int8_t* q, int64_t ldq, float* scales,
                   int limit) {
  MF_CHECK(limit >= 1 && limit <= 127, "quantize_rows: limit {} is outside [1, 127]", limit);
  const bool avx2 = kernel_isa() >= Isa::avx2;
  const float top = static_cast<float>(limit);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * ld;
    int8_t* out = q + i * ldq;
#if defined(__x86_64__) && defined(__GNUC__)
    float largest = avx2 ? largest_magnitude_avx2(row, depth) : largest_magnitude(row, depth);
#else
    float largest = largest_magnitude(row, depth);
#endif
    if (!std::isfinite(largest) || largest == 0) {
      scales[i] = largest == 0 ? 1.0f : std::numeric_limits<float>::quiet_NaN();
      std::fill(out, out + depth, int8_t{0});
      continue;
    }
    scales[i] = largest / top;
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2) {
      quantize_row_avx2(row, depth, top / largest, top, out);
      continue;
    }
#endif
    quantize_values(row, depth, top / largest, top, out);
  }
}

PackedInt8Weight::PackedInt8Weight(int64_t cols, int64_t depth, const int8_t* q, int64_t ldq, const float* scales,
                                   Isa isa)
    : cols_(cols), depth_(depth), isa_(isa), scales_(scales, scales + cols) {
  MF_CHECK(cols >= 0 && depth >= 0, "int8 weight: negative size [{}, {}]", cols, depth);
  MF_CHECK(depth <= 133144, "int8 weight: depth {} could overflow the int32 sums (at most 133144)", depth);
  int64_t panels = (cols + kPanel - 1) / kPanel;
  packed_.assign(static_cast<size_t>(panels * kPanel * padded_depth()), 0);
  column_sums_.assign(static_cast<size_t>(panels * kPanel), 0);
  for (int64_t j = 0; j < cols; ++j) {
    int8_t* panel_start = packed_.data() + j / kPanel * kPanel * padded_depth();
    for (int64_t k = 0; k < depth; ++k) {
      const int8_t value = q[j * ldq + k];
      MF_CHECK(value >= -kWeightLimit && value <= kWeightLimit,
               "int8 weight: value {} of channel {} lies outside [-{}, {}], the range quantized weights take (so "
               "that the AVX2 kernel's pairwise int16 sums cannot saturate)", value, j, kWeightLimit, kWeightLimit);
      panel_start[k / 4 * kQuadBytes + j % kPanel * 4 + k % 4] = value;
      column_sums_[static_cast<size_t>(j)] += value;
    }
  }
}

void gemm_int8(int64_t rows, const int8_t* q_x, int64_t ldq, const float* x_scales, const PackedInt8Weight& weight,
               float* c, int64_t ldc, const float* bias, bool relu) {
  const int64_t cols = weight.cols(), depth = weight.depth(), padded = weight.padded_depth();
  const int64_t panels = (cols + kPanel - 1) / kPanel;
  if (rows == 0 || cols == 0) return;
  const bool avx2 = weight.isa() >= Isa::avx2;
  // The AVX2 path's rows as unsigned bytes q + 128, padded to whole groups; kept per thread, so that
  // decoding's calls reuse one buffer instead of faulting in fresh pages each time.
  thread_local std::vector<uint8_t> shifted;
#if defined(__x86_64__) && defined(__GNUC__)
  if (avx2) {
    if (shifted.size() < static_cast<size_t>(rows * padded)) shifted.resize(static_cast<size_t>(rows * padded));
    shift_rows_avx2(rows, depth, q_x, ldq, shifted.data(), padded);
  }
#endif
  const uint8_t* a = shifted.data();
  // Panels per thread: enough work to be worth a thread (about 2^17 multiply-adds). Each thread takes
  // its panels in blocks of about 64 KiB, which stay in L2 while every strip of rows passes over them
  // (a strip's rows stay in L1), so the weight is read from memory once per call, not once per strip.
  int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, rows * padded * kPanel));
  const int64_t block = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, kPanel * padded));
  parallel_for(0, panels, grain, [&](int64_t first, int64_t last) {
    for (int64_t block_first = first; block_first < last; block_first += block) {
      const int64_t block_last = std::min(last, block_first + block);
      for (int64_t i0 = 0; i0 < rows; i0 += kStripRows) {
        int64_t strip = std::min(kStripRows, rows - i0);
        for (int64_t p = block_first; p < block_last; ++p) {
          int64_t j0 = p * kPanel, channels = std::min(kPanel, cols - j0);
          const TileOutput out{.x_scales = x_scales + i0, .w_scales = weight.scales() + j0,
                               .bias = bias ? bias + j0 : nullptr, .relu = relu, .c = c + i0 * ldc + j0, .ldc = ldc};
#if defined(__x86_64__) && defined(__GNUC__)
          if (avx2) {
            strip_tile_avx2(strip, padded / 4, a + i0 * padded, padded, weight.panel(p), weight.column_sums(p),
                            channels, out);
            continue;
          }
#endif
          int32_t sums[kStripRows][kPanel];
          panel_sums_baseline(strip, depth, q_x + i0 * ldq, ldq, weight.panel(p), sums);
          store_tile(strip, channels, sums, out);
        }
      }
    }
  });
}

}  // namespace mf::cpu
