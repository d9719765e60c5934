// The int8 GEMM (ops/cpu/gemm_int8.h). The AVX2 micro-kernel follows oneDNN's AVX2 int8 scheme: each input row
// is shifted to unsigned (q + 128, one xor per call) so that vpmaddubsw can multiply it by the signed
// weights, adding pairs of products to int16 (at most 2 x 255 x 63 = 32,130: weights stop at +-63 so
// that this never saturates), and vpmaddwd against ones adds those pairs into int32 lanes, one per
// channel of the panel. Per group of 4 values of k a row costs a broadcast, those two and a vpaddd,
// for 32 multiply-adds; 6 rows keep their 6 x 8 sums in 6 registers. The AVX512-VNNI micro-kernel
// takes the same shifted rows: one vpdpbusd adds a row's 4 products per channel straight into 16 int32
// lanes, and 12 rows keep their 12 x 32 sums in 24 registers, each broadcast serving two of them.
// The shift adds 128 times the channel's weight sum to every sum, taken off at the end (the packing
// keeps those sums), and the epilogue runs on the sums still in registers. The baseline path sums the
// signed values directly and runs the same epilogue in scalars: every path gives the same bits.
#include "ops/cpu/gemm_int8.h"

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/float_vectors.h"
#include "ops/math.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace mf::cpu {
namespace {

/// Each path's panel width (channels) and strip height (rows). The baseline path reads AVX2's layout.
constexpr int64_t kAvx2Panel = 8, kAvx2StripRows = 6;
constexpr int64_t kVnniPanel = 32, kVnniStripRows = 12;

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

/// c[i, j] for the sums of the panel's first `channels` channels (row i's at sums + i * stride): the
/// formula, in scalars. The vector paths' full panels do the same float operations in the same order
/// (no FMA: the build contracts nothing), so every path gives the same bits.
void store_tile(int64_t rows, int64_t channels, const int32_t* sums, int64_t stride, const TileOutput& out) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < channels; ++j) {
      float value = static_cast<float>(sums[i * stride + j]) * (out.x_scales[i] * out.w_scales[j]);
      if (out.bias != nullptr) value += out.bias[j];
      out.c[i * out.ldc + j] = out.relu ? math::Relu{}(value) : value;
    }
}

/// Sums of rows [0, rows) of q_x (int8, ldq apart) with one panel of AVX2's layout, scalar, into
/// sums (rows kAvx2Panel apart).
void panel_sums_baseline(int64_t rows, int64_t depth, const int8_t* q_x, int64_t ldq, const int8_t* panel,
                         int32_t* sums) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t channel = 0; channel < kAvx2Panel; ++channel) {
      int32_t sum = 0;
      for (int64_t k = 0; k < depth; ++k)
        sum += int32_t{q_x[i * ldq + k]} * int32_t{panel[k / 4 * 4 * kAvx2Panel + channel * 4 + k % 4]};
      sums[i * kAvx2Panel + channel] = sum;
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
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + g * 4 * kAvx2Panel));
#pragma GCC unroll 6
    for (int64_t i = 0; i < Rows; ++i) {
      int32_t values;
      std::memcpy(&values, a + i * lda + 4 * g, sizeof values);
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(values), b);
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
    }
  }
  const __m256i shift = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(column_sums)), 7);
  if (channels < kAvx2Panel) {
    int32_t sums[Rows][kAvx2Panel];
#pragma GCC unroll 6
    for (int64_t i = 0; i < Rows; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums[i]), _mm256_sub_epi32(acc[i], shift));
    return store_tile(Rows, channels, &sums[0][0], kAvx2Panel, out);
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

/// A strip's micro-kernel, by the strip's rows: strip_tiles[rows - 1].
using StripTile = void (*)(int64_t quads, const uint8_t* a, int64_t lda, const int8_t* panel,
                           const int32_t* column_sums, int64_t channels, const TileOutput& out);

template <size_t... Rows>
constexpr std::array<StripTile, sizeof...(Rows)> avx2_strip_tiles(std::index_sequence<Rows...>) {
  return {&panel_tile_avx2<Rows + 1>...};
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

MF_BEGIN_TARGET("avx512f,avx512bw,avx512vnni")

/// panel_tile_avx2 for AVX512-VNNI's panels of 32 channels: per group of 4 values of k, two vpdpbusd
/// per row, against the panel's two vectors.
template <int64_t Rows>
MF_INLINE void panel_tile_vnni(int64_t quads, const uint8_t* a, int64_t lda, const int8_t* panel,
                               const int32_t* column_sums, int64_t channels, const TileOutput& out) {
  __m512i acc_low[Rows], acc_high[Rows];
#pragma GCC unroll 12
  for (int64_t i = 0; i < Rows; ++i) acc_low[i] = acc_high[i] = _mm512_setzero_si512();
  for (int64_t g = 0; g < quads; ++g) {
    const __m512i low = _mm512_loadu_si512(panel + g * 4 * kVnniPanel);
    const __m512i high = _mm512_loadu_si512(panel + g * 4 * kVnniPanel + 64);
#pragma GCC unroll 12
    for (int64_t i = 0; i < Rows; ++i) {
      int32_t values;
      std::memcpy(&values, a + i * lda + 4 * g, sizeof values);
      const __m512i row = _mm512_set1_epi32(values);
      acc_low[i] = _mm512_dpbusd_epi32(acc_low[i], row, low);
      acc_high[i] = _mm512_dpbusd_epi32(acc_high[i], row, high);
    }
  }
  // Full-mask forms: GCC 12's plain ones trip -Wmaybe-uninitialized (ops/cpu/float_vectors.h says why).
  constexpr __mmask16 kAll = 0xFFFF;
  __m512i shift[2];
  for (int half = 0; half < 2; ++half)
    shift[half] = _mm512_maskz_slli_epi32(kAll, _mm512_loadu_si512(column_sums + 16 * half), 7);
  if (channels < kVnniPanel) {
    int32_t sums[Rows][kVnniPanel];
#pragma GCC unroll 12
    for (int64_t i = 0; i < Rows; ++i)
      for (int half = 0; half < 2; ++half)
        _mm512_storeu_si512(sums[i] + 16 * half, _mm512_sub_epi32(half == 0 ? acc_low[i] : acc_high[i], shift[half]));
    return store_tile(Rows, channels, &sums[0][0], kVnniPanel, out);
  }
  for (int half = 0; half < 2; ++half) {
    const __m512 w_scales = _mm512_loadu_ps(out.w_scales + 16 * half);
    const __m512 bias = out.bias != nullptr ? _mm512_loadu_ps(out.bias + 16 * half) : _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int64_t i = 0; i < Rows; ++i) {
      const __m512 scales = _mm512_mul_ps(_mm512_set1_ps(out.x_scales[i]), w_scales);
      const __m512i sum = _mm512_sub_epi32(half == 0 ? acc_low[i] : acc_high[i], shift[half]);
      __m512 value = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, sum), scales);
      if (out.bias != nullptr) value = _mm512_add_ps(value, bias);
      if (out.relu) value = Avx512Floats::relu(value);
      _mm512_storeu_ps(out.c + i * out.ldc + 16 * half, value);
    }
  }
}

template <size_t... Rows>
constexpr std::array<StripTile, sizeof...(Rows)> vnni_strip_tiles(std::index_sequence<Rows...>) {
  return {&panel_tile_vnni<Rows + 1>...};
}

MF_END_TARGET
#endif

}  // namespace

Isa int8_kernel_isa(Isa requested) {
  return requested == Isa::avx512 && !cpu_has_avx512_vnni() ? Isa::avx2 : requested;
}

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
    : cols_(cols),
      depth_(depth),
      isa_(int8_kernel_isa(isa)),
      panel_columns_(isa_ == Isa::avx512 ? kVnniPanel : kAvx2Panel),
      scales_(scales, scales + cols) {
  MF_CHECK(cols >= 0 && depth >= 0, "int8 weight: negative size [{}, {}]", cols, depth);
  MF_CHECK(depth <= 133144, "int8 weight: depth {} could overflow the int32 sums (at most 133144)", depth);
  int64_t panels = (cols + panel_columns_ - 1) / panel_columns_;
  packed_.assign(static_cast<size_t>(panels * panel_columns_ * padded_depth()), 0);
  column_sums_.assign(static_cast<size_t>(panels * panel_columns_), 0);
  for (int64_t j = 0; j < cols; ++j) {
    int8_t* panel_start = packed_.data() + j / panel_columns_ * panel_columns_ * padded_depth();
    for (int64_t k = 0; k < depth; ++k) {
      const int8_t value = q[j * ldq + k];
      MF_CHECK(value >= -kWeightLimit && value <= kWeightLimit,
               "int8 weight: value {} of channel {} lies outside [-{}, {}], the range quantized weights take (so "
               "that the AVX2 kernel's pairwise int16 sums cannot saturate)", value, j, kWeightLimit, kWeightLimit);
      panel_start[k / 4 * 4 * panel_columns_ + j % panel_columns_ * 4 + k % 4] = value;
      column_sums_[static_cast<size_t>(j)] += value;
    }
  }
}

void gemm_int8(int64_t rows, const int8_t* q_x, int64_t ldq, const float* x_scales, const PackedInt8Weight& weight,
               float* c, int64_t ldc, const float* bias, bool relu) {
  const int64_t cols = weight.cols(), depth = weight.depth(), padded = weight.padded_depth();
  const int64_t panel_columns = weight.panel_columns(), panels = (cols + panel_columns - 1) / panel_columns;
  if (rows == 0 || cols == 0) return;
  const Isa path = weight.isa();
  const int64_t strip_rows = path == Isa::avx512 ? kVnniStripRows : kAvx2StripRows;
  // The vector paths' rows as unsigned bytes q + 128, padded to whole groups; kept per thread, so that
  // decoding's calls reuse one buffer instead of faulting in fresh pages each time.
  thread_local std::vector<uint8_t> shifted;
  const StripTile* strip_tiles = nullptr;
#if defined(__x86_64__) && defined(__GNUC__)
  static constexpr auto avx2_tiles = avx2_strip_tiles(std::make_index_sequence<kAvx2StripRows>());
  static constexpr auto vnni_tiles = vnni_strip_tiles(std::make_index_sequence<kVnniStripRows>());
  if (path >= Isa::avx2) {
    strip_tiles = path == Isa::avx512 ? vnni_tiles.data() : avx2_tiles.data();
    if (shifted.size() < static_cast<size_t>(rows * padded)) shifted.resize(static_cast<size_t>(rows * padded));
    shift_rows_avx2(rows, depth, q_x, ldq, shifted.data(), padded);
  }
#endif
  const uint8_t* a = shifted.data();
  // Panels per thread: enough work to be worth a thread (about 2^17 multiply-adds). Each thread takes
  // its panels in blocks of about 64 KiB, which stay in L2 while every strip of rows passes over them
  // (a strip's rows stay in L1), so the weight is read from memory once per call, not once per strip.
  int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, rows * padded * panel_columns));
  const int64_t block = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, panel_columns * padded));
  parallel_for(0, panels, grain, [&](int64_t first, int64_t last) {
    for (int64_t block_first = first; block_first < last; block_first += block) {
      const int64_t block_last = std::min(last, block_first + block);
      for (int64_t i0 = 0; i0 < rows; i0 += strip_rows) {
        int64_t strip = std::min(strip_rows, rows - i0);
        for (int64_t p = block_first; p < block_last; ++p) {
          int64_t j0 = p * panel_columns, channels = std::min(panel_columns, cols - j0);
          const TileOutput out{.x_scales = x_scales + i0, .w_scales = weight.scales() + j0,
                               .bias = bias ? bias + j0 : nullptr, .relu = relu, .c = c + i0 * ldc + j0, .ldc = ldc};
          if (strip_tiles != nullptr) {
            strip_tiles[strip - 1](padded / 4, a + i0 * padded, padded, weight.panel(p), weight.column_sums(p),
                                   channels, out);
            continue;
          }
          int32_t sums[kAvx2StripRows * kAvx2Panel];
          panel_sums_baseline(strip, depth, q_x + i0 * ldq, ldq, weight.panel(p), sums);
          store_tile(strip, channels, sums, kAvx2Panel, out);
        }
      }
    }
  });
}

}  // namespace mf::cpu
