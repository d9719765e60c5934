// The int8 GEMM of quantized inference (PyTorch's dynamic quantization, CTranslate2's int8): a
// Linear's weight is quantized once, per output channel, and each call quantizes its input per row:
//
//   w[j, k] ~ w_scale[j] q_w[j, k] (q_w in [-63, 63]),  x[i, k] ~ x_scale[i] q_x[i, k] (q_x in [-127, 127])
//   y[i, j] = float(sum_k q_x[i, k] q_w[j, k]) * (x_scale[i] * w_scale[j]) (+ bias[j]) (relu)
//
// Weights take 7 bits, as oneDNN's AVX2 int8 kernels scale theirs, because
// AVX2's fast int8 product (vpmaddubsw) adds pairs of products into int16. The sums are int32 and
// exact (depth up to 133,144 cannot overflow them, shifted as the AVX2 and AVX512-VNNI paths keep
// them), and the epilogue is the same float32 arithmetic on every path: every path gives the same
// bits. The AVX512-VNNI path (vpdpbusd) runs where the CPU has it; the baseline path runs scalar loops
// over the AVX2 path's layout.
#pragma once

#include "core/isa.h"

#include <cstdint>
#include <vector>

namespace mf::cpu {

/// The largest |value| of quantized inputs and weights.
inline constexpr int kInputLimit = 127;
inline constexpr int kWeightLimit = 63;

/// Symmetric int8 quantization of `rows` rows of `depth` floats, rows `ld` apart, to [-limit, limit]
/// (kInputLimit for inputs, kWeightLimit for weights): with m the row's largest |x|, scales[i] =
/// m / limit and q[i, k] = x[i, k] * (limit / m) rounded to nearest, ties to even, into q (rows `ldq`
/// apart). A row of zeros gets scale 1; a row holding NaN or an infinity gets a NaN scale (its outputs
/// come out NaN, not silently finite).
void quantize_rows(int64_t rows, int64_t depth, const float* x, int64_t ld, int8_t* q, int64_t ldq, float* scales,
                   int limit);

/// The path the int8 GEMM takes for a weight packed for `requested`: that one, except that AVX-512
/// without VNNI takes AVX2's.
Isa int8_kernel_isa(Isa requested);

/// A quantized weight [cols x depth] (cols output channels, as nn::Linear's weight) in the int8
/// GEMM's layout for one kernel path: panels of panel_columns() channels (8 for AVX2 and the
/// baseline, 32 for AVX512-VNNI, two of its registers), each holding per group of 4 values of k the 4
/// values of every channel in turn, zero-padded to whole panels and quads. Built once per weight, when
/// a model is quantized or loaded.
class PackedInt8Weight {
 public:
  /// q [cols x depth] (rows ldq apart, values in [-kWeightLimit, kWeightLimit]: others throw) and its
  /// per-channel scales, for the given instruction set (the kernel path of the machine by default;
  /// tests force narrower ones).
  PackedInt8Weight(int64_t cols, int64_t depth, const int8_t* q, int64_t ldq, const float* scales,
                   Isa isa = kernel_isa());

  int64_t cols() const { return cols_; }
  int64_t depth() const { return depth_; }
  int64_t padded_depth() const { return (depth_ + 3) / 4 * 4; }
  /// The path the layout is for: int8_kernel_isa of the requested one.
  Isa isa() const { return isa_; }
  int64_t panel_columns() const { return panel_columns_; }
  const int8_t* panel(int64_t index) const { return packed_.data() + index * panel_columns_ * padded_depth(); }
  const float* scales() const { return scales_.data(); }
  /// Each channel's sum of values, for the panel's panel_columns() channels (zero past cols).
  const int32_t* column_sums(int64_t panel) const { return column_sums_.data() + panel * panel_columns_; }

 private:
  int64_t cols_, depth_;
  Isa isa_;
  int64_t panel_columns_;
  std::vector<int8_t> packed_;
  std::vector<float> scales_;
  std::vector<int32_t> column_sums_;
};

/// c[rows x cols] (rows ldc apart) = the formula above for quantized rows q_x (rows ldq apart, with
/// x_scales) times `weight`, plus bias (nullptr: none), then max(c, 0) with relu. Threads split the
/// weight's panels.
void gemm_int8(int64_t rows, const int8_t* q_x, int64_t ldq, const float* x_scales, const PackedInt8Weight& weight,
               float* c, int64_t ldc, const float* bias = nullptr, bool relu = false);

}  // namespace mf::cpu
