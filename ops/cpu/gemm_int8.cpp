// The int8 GEMM (ops/cpu/gemm_int8.h). The AVX2 micro-kernel keeps a 4 x 8 tile of int32 sums in 8
// registers (GCC spills 6 x 8's twelve, and 4 rows ran 1.2-1.6x faster than 6 on Zen 3): per group of 4 values of k it widens a panel's 32 bytes (8 channels x 4 values) to two
// vectors of int16, broadcasts each row's 4 values (int16, widened once per call) and issues two
// vpmaddwd + vpaddd per row. Each int32 lane then holds half a channel's sum (values 0-1 or 2-3 of
// every group); a horizontal add at the end joins the halves. The epilogue is scalar and shared
// with the baseline path, so that both give the same bits.
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
constexpr int64_t kStripRows = 4;

/// c[i, j] for sums[i][c] of channel j = first + c: the formula of gemm_int8.h, on every path.
void store_tile(int64_t rows, int64_t channels, const int32_t (*sums)[kPanel], const float* x_scales,
                const float* w_scales, const float* bias, bool relu, float* c, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < channels; ++j) {
      float value = static_cast<float>(sums[i][j]) * (x_scales[i] * w_scales[j]);
      if (bias != nullptr) value += bias[j];
      c[i * ldc + j] = relu ? math::Relu{}(value) : value;
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

/// out[k] = x[k] * multiplier rounded to nearest, ties to even, clamped to [-127, 127] (|x| <= the
/// row's largest, so only the multiplier's own rounding could take a product past 127).
void quantize_values(const float* x, int64_t count, float multiplier, int8_t* out) {
  for (int64_t k = 0; k < count; ++k)
    out[k] = static_cast<int8_t>(std::clamp(std::nearbyint(x[k] * multiplier), -127.0f, 127.0f));
}

#if defined(__x86_64__) && defined(__GNUC__)
MF_BEGIN_TARGET("avx2,fma")

/// Sums of Rows rows of a (int16, lda apart, padded to whole groups with zeros) with one panel.
template <int64_t Rows>
MF_INLINE void panel_sums_avx2(int64_t quads, const int16_t* a, int64_t lda, const int8_t* panel,
                               int32_t (*sums)[kPanel]) {
  __m256i low[Rows], high[Rows];
#pragma GCC unroll 6
  for (int64_t i = 0; i < Rows; ++i) low[i] = high[i] = _mm256_setzero_si256();
  for (int64_t g = 0; g < quads; ++g) {
    const int8_t* quad = panel + g * kQuadBytes;
    __m256i b_low = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quad)));
    __m256i b_high = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quad + 16)));
#pragma GCC unroll 6
    for (int64_t i = 0; i < Rows; ++i) {
      int64_t values;
      std::memcpy(&values, a + i * lda + 4 * g, sizeof values);
      __m256i a_i = _mm256_set1_epi64x(values);
      low[i] = _mm256_add_epi32(low[i], _mm256_madd_epi16(a_i, b_low));
      high[i] = _mm256_add_epi32(high[i], _mm256_madd_epi16(a_i, b_high));
    }
  }
  // low's lanes: channels 0,0,1,1 | 2,2,3,3 (values 0-1, 2-3 of each group); high's the same for 4-7.
  // hadd gives 0,1,4,5 | 2,3,6,7; the 64-bit permute puts them in order.
#pragma GCC unroll 6
  for (int64_t i = 0; i < Rows; ++i) {
    __m256i joined = _mm256_permute4x64_epi64(_mm256_hadd_epi32(low[i], high[i]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums[i]), joined);
  }
}

void strip_sums_avx2(int64_t rows, int64_t quads, const int16_t* a, int64_t lda, const int8_t* panel,
                     int32_t (*sums)[kPanel]) {
  static_assert(kStripRows == 4);
  switch (rows) {
    case 1: return panel_sums_avx2<1>(quads, a, lda, panel, sums);
    case 2: return panel_sums_avx2<2>(quads, a, lda, panel, sums);
    case 3: return panel_sums_avx2<3>(quads, a, lda, panel, sums);
    default: return panel_sums_avx2<4>(quads, a, lda, panel, sums);
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
void quantize_row_avx2(const float* row, int64_t depth, float multiplier, int8_t* out) {
  const __m256 scale = _mm256_set1_ps(multiplier), high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
  int64_t k = 0;
  for (; k + 8 <= depth; k += 8) {
    __m256 rounded = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(row + k), scale),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i words = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rounded, low), high));
    __m128i halves = _mm_packs_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + k), _mm_packs_epi16(halves, halves));
  }
  quantize_values(row + k, depth - k, multiplier, out + k);
}

MF_END_TARGET
#endif

}  // namespace

void quantize_rows(int64_t rows, int64_t depth, const float* x, int64_t ld, int8_t* q, int64_t ldq, float* scales) {
  const bool avx2 = kernel_isa() >= Isa::avx2;
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
    scales[i] = largest / 127.0f;
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2) {
      quantize_row_avx2(row, depth, 127.0f / largest, out);
      continue;
    }
#endif
    quantize_values(row, depth, 127.0f / largest, out);
  }
}

PackedInt8Weight::PackedInt8Weight(int64_t cols, int64_t depth, const int8_t* q, int64_t ldq, const float* scales,
                                   Isa isa)
    : cols_(cols), depth_(depth), isa_(isa), scales_(scales, scales + cols) {
  MF_CHECK(cols >= 0 && depth >= 0, "int8 weight: negative size [{}, {}]", cols, depth);
  MF_CHECK(depth <= 133144, "int8 weight: depth {} could overflow the int32 sums (at most 133144)", depth);
  int64_t panels = (cols + kPanel - 1) / kPanel;
  packed_.assign(static_cast<size_t>(panels * kPanel * padded_depth()), 0);
  for (int64_t j = 0; j < cols; ++j) {
    int8_t* panel_start = packed_.data() + j / kPanel * kPanel * padded_depth();
    for (int64_t k = 0; k < depth; ++k) panel_start[k / 4 * kQuadBytes + j % kPanel * 4 + k % 4] = q[j * ldq + k];
  }
}

void gemm_int8(int64_t rows, const int8_t* q_x, int64_t ldq, const float* x_scales, const PackedInt8Weight& weight,
               float* c, int64_t ldc, const float* bias, bool relu) {
  const int64_t cols = weight.cols(), depth = weight.depth(), padded = weight.padded_depth();
  const int64_t panels = (cols + kPanel - 1) / kPanel;
  if (rows == 0 || cols == 0) return;
  const bool avx2 = weight.isa() >= Isa::avx2;
  // The AVX2 path's rows as int16, padded to whole groups with zeros; kept per thread, so that
  // decoding's calls reuse one buffer instead of faulting in fresh pages each time.
  thread_local std::vector<int16_t> widened;
  if (avx2) {
    widened.assign(static_cast<size_t>(rows * padded), 0);
    for (int64_t i = 0; i < rows; ++i)
      std::copy(q_x + i * ldq, q_x + i * ldq + depth, widened.begin() + i * padded);
  }
  const int16_t* a = widened.data();
  // Panels per thread: enough work to be worth a thread (about 2^17 multiply-adds). Each thread takes
  // its panels in blocks of about 64 KiB, which stay in L2 while every strip of rows passes over them
  // (a strip's rows stay in L1), so the weight is read from memory once per call, not once per strip.
  int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, rows * padded * kPanel));
  const int64_t block = std::max<int64_t>(1, (int64_t{64} << 10) / (kPanel * padded));
  parallel_for(0, panels, grain, [&](int64_t first, int64_t last) {
    int32_t sums[kStripRows][kPanel];
    for (int64_t block_first = first; block_first < last; block_first += block) {
      const int64_t block_last = std::min(last, block_first + block);
      for (int64_t i0 = 0; i0 < rows; i0 += kStripRows) {
        int64_t strip = std::min(kStripRows, rows - i0);
        for (int64_t p = block_first; p < block_last; ++p) {
          int64_t j0 = p * kPanel, channels = std::min(kPanel, cols - j0);
#if defined(__x86_64__) && defined(__GNUC__)
          if (avx2)
            strip_sums_avx2(strip, padded / 4, a + i0 * padded, padded, weight.panel(p), sums);
          else
#endif
            panel_sums_baseline(strip, depth, q_x + i0 * ldq, ldq, weight.panel(p), sums);
          store_tile(strip, channels, sums, x_scales + i0, weight.scales() + j0, bias ? bias + j0 : nullptr, relu,
                     c + i0 * ldc + j0, ldc);
        }
      }
    }
  });
}

}  // namespace mf::cpu
