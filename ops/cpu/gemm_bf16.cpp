// The bfloat16 GEMM (ops/cpu/gemm_bf16.h). Its AVX512-BF16 kernel follows the float32 one's blocking
// (ops/cpu/sgemm_kernel.inc) with pairs of k as the unit:
//
//   for each block of kBlockPairs pairs of k (c accumulates across them)
//     convert op(A) for those pairs, row by row, each pair of a row one 32-bit word
//     for each block of kBlockColumns columns of op(B)
//       pack them into panels of kPanelColumns columns, per pair one word per column
//       for each strip, for each panel: the micro-kernel
//
// (where op(B) has one block of columns, its panels are packed first and op(A) converted kBlockRows
// rows at a time).
//
// vdpbf16ps adds, in each of 16 float32 lanes, the products of two bfloat16 pairs; the micro-kernel
// keeps a kStripRows x 32 tile of c in 24 registers, loads a panel's two vectors per pair, broadcasts
// a row's pair, and issues two dot products per row. Packing converts with vcvtne2ps2bf16 (to nearest,
// ties to even; subnormal inputs read as zero), so every operand element is converted once per block.
#include "ops/cpu/gemm_bf16.h"

#include "core/dtype.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/float_vectors.h"

#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace mf::cpu {
namespace {

/// The `stored_rows` x `stored_cols` matrix at `x` (rows `ld` apart), each element rounded to a
/// bfloat16 value (held as a float, which it fits exactly), packed densely into `buffer`: row by row
/// in the layout it is stored in, so that every read is contiguous whether or not the GEMM transposes
/// it.
const float* rounded_copy(const float* x, int64_t ld, int64_t stored_rows, int64_t stored_cols,
                          std::vector<float>& buffer) {
  if (buffer.size() < static_cast<size_t>(stored_rows * stored_cols))
    buffer.resize(static_cast<size_t>(stored_rows * stored_cols));
  for (int64_t i = 0; i < stored_rows; ++i) {
    const float* row = x + i * ld;
    float* rounded = buffer.data() + i * stored_cols;
    for (int64_t j = 0; j < stored_cols; ++j) rounded[j] = static_cast<float>(bfloat16(row[j]));
  }
  return buffer.data();
}

/// The other path: op(a) and op(b) rounded to bfloat16 values, then the float32 GEMM with the same
/// transposes. The copies live in buffers kept by each thread between calls, as the dot products'
/// packed operands do.
void gemm_rounded_float32(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                          const GemmEpilogue<float>& epilogue) {
  thread_local std::vector<float> a_buffer, b_buffer;
  const int64_t a_width = trans_a ? rows : depth, b_width = trans_b ? depth : cols;
  const float* a_rounded = rounded_copy(a, lda, trans_a ? depth : rows, a_width, a_buffer);
  const float* b_rounded = rounded_copy(b, ldb, trans_b ? cols : depth, b_width, b_buffer);
  gemm_full_precision<float>(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, rows, cols,
                             depth, a_rounded, a_width, b_rounded, b_width, c, ldc, epilogue);
}

#if defined(__x86_64__) && defined(__GNUC__)
MF_BEGIN_TARGET("avx512f,avx512bw,avx512bf16")

constexpr int64_t kStripRows = 12;
constexpr int64_t kPanelColumns = 32;
constexpr int64_t kBlockPairs = 256;     // 512 values of k
constexpr int64_t kBlockRows = 144;      // op(A) converted 144 rows at a time when B is one block: 144 KiB
constexpr int64_t kBlockColumns = 512;   // a packed block of B: 256 pairs x 512 columns x 4 bytes = 512 KiB

// Packing reads operands that a backward pass often finds in memory, not in cache (an activation
// saved by the forward pass), and reads several rows side by side, which the hardware prefetchers
// follow poorly: it asks for the lines it reads next this far ahead itself.
constexpr int64_t kAheadRows = 4;      // down B's rows, a pair at a time: the same columns 4 rows on
constexpr int64_t kAheadColumns = 64;  // along A^T's rows, 16 columns at a time: 64 columns (256 bytes) on

[[gnu::always_inline]] inline void prefetch(const float* x) { __builtin_prefetch(x, 0, 3); }

/// A 64-byte aligned buffer of `words` words, kept between calls (one per thread).
inline uint32_t* aligned_words(std::vector<uint32_t>& buffer, int64_t words) {
  if (buffer.size() < static_cast<size_t>(words + 16)) buffer.resize(static_cast<size_t>(words + 16));
  void* start = buffer.data();
  size_t space = buffer.size() * sizeof(uint32_t);
  return static_cast<uint32_t*>(std::align(64, static_cast<size_t>(words) * sizeof(uint32_t), start, space));
}

/// 16 pairs (lo[t], hi[t]) as bfloat16, one 32-bit word each: the low half of each word is lo's.
inline __m512i interleaved_pairs(__m512 lo, __m512 hi) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/// 16 consecutive pairs of a row, x[2t], x[2t + 1] for t < 16, from `count` (<= 32) floats at x.
inline __m512i row_pairs(const float* x, int64_t count) {
  __m512 first = _mm512_maskz_loadu_ps(Avx512Floats::first_lanes(count), x);
  __m512 second = _mm512_maskz_loadu_ps(Avx512Floats::first_lanes(count - 16), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(second, first);  // bfloat16 k order: word t holds k = 2t, 2t + 1
}

/// op(a)'s rows [0, rows) over pairs [0, pairs) of the block starting at k = k0 (depth values of k in
/// all) as bfloat16 pairs, row r's pair q at words[r * pairs + q]. A row of a is a run of its pairs:
/// vector loads and stores. A row of a^T is a column of a: 16 rows of 16 pairs are transposed in
/// registers, so both are written with whole vectors.
void convert_a(bool trans_a, int64_t rows, int64_t pairs, int64_t k0, int64_t depth, const float* a, int64_t lda,
               uint32_t* words) {
  if (!trans_a) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t q = 0; q < pairs; q += 16) {
        if (i + 1 < rows) {  // the next row's run, a row's conversion ahead
          prefetch(a + (i + 1) * lda + k0 + 2 * q);
          prefetch(a + (i + 1) * lda + k0 + 2 * q + 16);
        }
        _mm512_mask_storeu_epi32(words + i * pairs + q, Avx512Floats::first_lanes(pairs - q),
                                 row_pairs(a + i * lda + k0 + 2 * q, depth - (k0 + 2 * q)));
      }
    return;
  }
  for (int64_t q = 0; q < pairs; q += 16) {
    for (int64_t i = 0; i < rows; i += 16) {
      const __mmask16 present = Avx512Floats::first_lanes(rows - i);
      __m512 tile[16];  // tile[t]: pair q + t of rows i to i + 15; transposed, row i + t's pairs q to q + 15
      for (int64_t t = 0; t < 16; ++t) {
        const int64_t k = k0 + 2 * (q + t);
        if (q + t < pairs && k + 1 < depth && i + kAheadColumns < rows) {
          prefetch(a + k * lda + i + kAheadColumns);
          prefetch(a + (k + 1) * lda + i + kAheadColumns);
        }
        __m512 lo = q + t < pairs ? _mm512_maskz_loadu_ps(present, a + k * lda + i) : _mm512_setzero_ps();
        __m512 hi = q + t < pairs && k + 1 < depth ? _mm512_maskz_loadu_ps(present, a + (k + 1) * lda + i)
                                                   : _mm512_setzero_ps();
        tile[t] = _mm512_castsi512_ps(interleaved_pairs(lo, hi));
      }
      Avx512Floats::transpose(tile);
      for (int64_t t = 0; t < std::min<int64_t>(16, rows - i); ++t)
        _mm512_mask_storeu_epi32(words + (i + t) * pairs + q, Avx512Floats::first_lanes(pairs - q),
                                 _mm512_castps_si512(tile[t]));
    }
  }
}

/// Packs op(b)'s columns [0, width) over pairs [0, pairs) of the block starting at k = k0 into panels
/// of kPanelColumns columns: panel n holds, per pair q, one word per column at packed + (n * pairs + q)
/// * kPanelColumns; columns past width are zero.
void pack_b(bool trans_b, int64_t width, int64_t pairs, int64_t k0, int64_t depth, const float* b, int64_t ldb,
            uint32_t* packed) {
  // Where column j's word for pair 0 goes: its panel, then its place in the panel's rows.
  auto column_start = [&](int64_t j) {
    return packed + (j / kPanelColumns) * pairs * kPanelColumns + j % kPanelColumns;
  };
  if (!trans_b) {
    // Pair q of every column: b's rows k and k + 1 read front to back, 16 columns at a time (read
    // down the columns instead, a weight just out of memory arrived a line per row, several times slower).
    for (int64_t q = 0; q < pairs; ++q) {
      const int64_t k = k0 + 2 * q;
      for (int64_t j = 0; j < width; j += 16) {
        if (k + kAheadRows + 1 < depth) {
          prefetch(b + (k + kAheadRows) * ldb + j);
          prefetch(b + (k + kAheadRows + 1) * ldb + j);
        }
        const __mmask16 present = Avx512Floats::first_lanes(width - j);
        __m512 lo = k < depth ? _mm512_maskz_loadu_ps(present, b + k * ldb + j) : _mm512_setzero_ps();
        __m512 hi = k + 1 < depth ? _mm512_maskz_loadu_ps(present, b + (k + 1) * ldb + j) : _mm512_setzero_ps();
        _mm512_store_si512(column_start(j) + q * kPanelColumns, interleaved_pairs(lo, hi));
      }
    }
    return;
  }
  for (int64_t j = 0; j < width; j += 16) {
    uint32_t* panel = column_start(j);
    const __mmask16 present = Avx512Floats::first_lanes(width - j);
    // op(b) = b^T: column j's pairs are runs of b's row j; 16 rows x 16 pairs transposed in registers.
    for (int64_t q = 0; q < pairs; q += 16) {
      __m512 tile[16];
      for (int64_t t = 0; t < 16; ++t)
        tile[t] = j + t < width ? _mm512_castsi512_ps(row_pairs(b + (j + t) * ldb + k0 + 2 * q, depth - (k0 + 2 * q)))
                                : _mm512_setzero_ps();
      Avx512Floats::transpose(tile);
      for (int64_t t = 0; t < std::min<int64_t>(16, pairs - q); ++t)
        _mm512_store_si512(panel + (q + t) * kPanelColumns,
                           _mm512_maskz_mov_epi32(present, _mm512_castps_si512(tile[t])));
    }
  }
}

/// Asks for the cache lines of a tile's row of c, [row, row + kPanelColumns), before its sums: the
/// epilogue reads and writes them (it adds to c after the first block of k), and the sums take
/// thousands of cycles, time for lines in L3 or memory to arrive that it would otherwise wait for.
[[gnu::always_inline]] inline void prefetch_row(const float* row) {
  for (int64_t i = 0; i < kPanelColumns; i += 16) __builtin_prefetch(row + i, 1, 3);
  __builtin_prefetch(row + kPanelColumns - 1, 1, 3);
}

/// acc plus, in each float32 lane, the products of a's and b's bfloat16 pairs (vdpbf16ps). Written as
/// the instruction itself: clang 16 crashes optimizing _mm512_dpbf16_ps's bfloat16 vector operands.
[[gnu::always_inline]] inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

/// c[0:Rows, 0:32 masked] = the epilogue applied to the strip's rows (op(A)'s rows of `pairs` words,
/// convert_a's) times the panel over those pairs: alpha sums (+ beta c unless beta == 0) (+ bias, the
/// tile's first column's), then ReLU, in sgemm's order.
template <int64_t Rows>
[[gnu::always_inline]] inline void tile(int64_t pairs, const uint32_t* strip, const uint32_t* panel, float* c,
                                        int64_t ldc, __mmask16 low_mask, __mmask16 high_mask,
                                        const GemmEpilogue<float>& epilogue) {
  __m512 low[Rows], high[Rows];
#pragma GCC unroll 12
  for (int64_t r = 0; r < Rows; ++r) {
    low[r] = high[r] = _mm512_setzero_ps();
    prefetch_row(c + r * ldc);
  }
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512i b_low = _mm512_load_si512(panel + q * kPanelColumns);
    const __m512i b_high = _mm512_load_si512(panel + q * kPanelColumns + 16);
#pragma GCC unroll 12
    for (int64_t r = 0; r < Rows; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(strip[r * pairs + q]));
      low[r] = dot_pairs(low[r], a, b_low);
      high[r] = dot_pairs(high[r], a, b_high);
    }
  }
  const auto [alpha, beta, bias, relu] = epilogue;
  const __m512 alphas = _mm512_set1_ps(alpha), betas = _mm512_set1_ps(beta);
  const __m512 bias_low = bias ? _mm512_maskz_loadu_ps(low_mask, bias) : _mm512_setzero_ps();
  const __m512 bias_high = bias ? _mm512_maskz_loadu_ps(high_mask, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int64_t r = 0; r < Rows; ++r) {
    float* row = c + r * ldc;
    __m512 parts[2] = {low[r], high[r]};
    const __mmask16 masks[2] = {low_mask, high_mask};
    const __m512 biases[2] = {bias_low, bias_high};
    for (int half = 0; half < 2; ++half) {
      __m512 v = alpha != 1 ? _mm512_mul_ps(parts[half], alphas) : parts[half];
      if (beta == 1) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[half], row + 16 * half));
      else if (beta != 0) v = _mm512_fmadd_ps(betas, _mm512_maskz_loadu_ps(masks[half], row + 16 * half), v);
      if (bias) v = _mm512_add_ps(v, biases[half]);
      if (relu) v = Avx512Floats::relu(v);
      _mm512_mask_storeu_ps(row + 16 * half, masks[half], v);
    }
  }
}

template <int64_t Rows>
[[gnu::noinline]] void strip_tile(int64_t rows, int64_t pairs, const uint32_t* strip, const uint32_t* panel, float* c,
                                  int64_t ldc, __mmask16 low_mask, __mmask16 high_mask,
                                  const GemmEpilogue<float>& epilogue) {
  if constexpr (Rows > 1)
    if (rows < Rows) return strip_tile<Rows - 1>(rows, pairs, strip, panel, c, ldc, low_mask, high_mask, epilogue);
  tile<Rows>(pairs, strip, panel, c, ldc, low_mask, high_mask, epilogue);
}

/// c's rows [0, rows) and `width` columns from c += the epilogue of convert_a's rows times pack_b's
/// panels: for each strip, for each panel, the micro-kernel.
void multiply_packed(int64_t rows, int64_t width, int64_t pairs, const uint32_t* packed_a, const uint32_t* packed_b,
                     float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  const int64_t panels = (width + kPanelColumns - 1) / kPanelColumns;
  for (int64_t first_row = 0; first_row < rows; first_row += kStripRows) {
    const uint32_t* strip = packed_a + first_row * pairs;
    for (int64_t n = 0; n < panels; ++n) {
      const int64_t first_column = n * kPanelColumns;
      const int64_t columns = std::min(kPanelColumns, width - first_column);
      GemmEpilogue<float> tile_epilogue = epilogue;
      if (epilogue.bias) tile_epilogue.bias += first_column;
      strip_tile<kStripRows>(std::min(kStripRows, rows - first_row), pairs, strip, packed_b + n * pairs * kPanelColumns,
                             c + first_row * ldc + first_column, ldc, Avx512Floats::first_lanes(columns),
                             Avx512Floats::first_lanes(columns - 16), tile_epilogue);
    }
  }
}

void gemm_dot_products(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       const GemmEpilogue<float>& epilogue) {
  thread_local std::vector<uint32_t> packed_a_buffer, packed_b_buffer;
  const int64_t all_pairs = (depth + 1) / 2;
  auto pack_columns = [&](int64_t j0, int64_t width, int64_t pairs, int64_t k0) {
    const int64_t panels = (width + kPanelColumns - 1) / kPanelColumns;
    uint32_t* packed = aligned_words(packed_b_buffer, panels * pairs * kPanelColumns);
    pack_b(trans_b, width, pairs, k0, depth, trans_b ? b + j0 * ldb : b + j0, ldb, packed);
    return packed;
  };
  auto convert_rows = [&](int64_t i0, int64_t count, int64_t pairs, int64_t k0) {
    uint32_t* words = aligned_words(packed_a_buffer, count * pairs);
    convert_a(trans_a, count, pairs, k0, depth, trans_a ? a + i0 : a + i0 * lda, lda, words);
    return words;
  };
  for (int64_t q0 = 0; q0 < all_pairs; q0 += kBlockPairs) {
    const int64_t pairs = std::min(kBlockPairs, all_pairs - q0), k0 = 2 * q0;
    // Later blocks of k add to what the first wrote (beta and bias once); the last one clamps.
    const bool first = q0 == 0;
    const GemmEpilogue<float> block{.alpha = epilogue.alpha, .beta = first ? epilogue.beta : 1.0f,
                                    .bias = first ? epilogue.bias : nullptr,
                                    .relu = epilogue.relu && q0 + kBlockPairs >= all_pairs};
    if (cols <= kBlockColumns) {
      // One block of B: op(A) converted kBlockRows rows at a time, each block multiplied while its
      // words are still in L2 (all of op(A) at once would pass them through memory when it is tall).
      const uint32_t* packed_b = pack_columns(0, cols, pairs, k0);
      for (int64_t i0 = 0; i0 < rows; i0 += kBlockRows) {
        const int64_t count = std::min(kBlockRows, rows - i0);
        multiply_packed(count, cols, pairs, convert_rows(i0, count, pairs, k0), packed_b, c + i0 * ldc, ldc, block);
      }
      continue;
    }
    // Many blocks of B: op(A) converted once, each block of B packed once.
    const uint32_t* packed_a = convert_rows(0, rows, pairs, k0);
    for (int64_t j0 = 0; j0 < cols; j0 += kBlockColumns) {
      GemmEpilogue<float> columns_epilogue = block;
      if (block.bias) columns_epilogue.bias += j0;
      const int64_t width = std::min(kBlockColumns, cols - j0);
      multiply_packed(rows, width, pairs, packed_a, pack_columns(j0, width, pairs, k0), c + j0, ldc, columns_epilogue);
    }
  }
}

MF_END_TARGET
#endif

}  // namespace

bool gemm_bf16_uses_dot_products() { return why_no_bfloat16_dot_products().empty(); }

bool detail::gemm_bf16_can_use_dot_products() { return kernel_isa() == Isa::avx512 && cpu_has_avx512_bf16(); }

void detail::gemm_bf16_on(bool dot_products, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                          const GemmEpilogue<float>& epilogue) {
  if (rows == 0 || cols == 0) return;
#if defined(__x86_64__) && defined(__GNUC__)
  if (dot_products && gemm_bf16_can_use_dot_products() && depth > 0)
    return gemm_dot_products(trans_a, trans_b, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
#endif
  gemm_rounded_float32(trans_a, trans_b, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
               const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  detail::gemm_bf16_on(gemm_bf16_uses_dot_products(), trans_a, trans_b, rows, cols, depth, a, lda, b, ldb, c, ldc,
                       epilogue);
}

}  // namespace mf::cpu
