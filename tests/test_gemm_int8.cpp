// The int8 GEMM of quantized inference (ops/cpu/gemm_int8.h): quantization against values worked out
// by hand, the kernel against exact integer sums put through the documented epilogue (bit for bit,
// on every path this CPU runs), and the whole quantized product against float64 within the bound
// that the two roundings allow.
#include "ops/cpu/gemm_int8.h"

#include "core/isa.h"
#include "miniflow.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using mf::Isa;

/// The paths this CPU can run, narrowest first (AVX-512 only with VNNI: without it, the weight takes
/// AVX2's path, which the list has already).
std::vector<Isa> int8_paths() {
  std::vector<Isa> paths{Isa::baseline};
  if (mf::kernel_isa() >= Isa::avx2) paths.push_back(Isa::avx2);
  if (mf::kernel_isa() >= Isa::avx512 && mf::cpu_has_avx512_vnni()) paths.push_back(Isa::avx512);
  return paths;
}

std::vector<int8_t> random_int8(size_t n, std::mt19937& rng, int limit) {
  std::uniform_int_distribution<int> value(-limit, limit);
  std::vector<int8_t> out(n);
  for (int8_t& v : out) v = static_cast<int8_t>(value(rng));
  return out;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> value(low, high);
  std::vector<float> out(n);
  for (float& v : out) v = value(rng);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("quantize_rows: scales and rounded values worked out by hand") {
  // Largest |x| 127: the multiplier is 127 / 127 = 1, so the values round as they stand, ties to even.
  // Eleven values: the vector loop of the AVX2 path takes the first eight, its scalar tail the rest.
  std::vector<float> x{127.0f, 2.5f, -3.5f, 0.5f, -1.5f, 126.4f, -0.5f, 4.5f, 5.5f, -126.5f, 0.49f};
  std::vector<int8_t> q(11);
  float scale = 0;
  mf::cpu::quantize_rows(1, 11, x.data(), 11, q.data(), 11, &scale, mf::cpu::kInputLimit);
  CHECK(scale == 1.0f);
  CHECK(q == std::vector<int8_t>{127, 2, -4, 0, -2, 126, 0, 4, 6, -126, 0});
  // The largest magnitude found by the tail, and a NaN hidden in the vector loop's lanes.
  x[10] = -254.0f;
  mf::cpu::quantize_rows(1, 11, x.data(), 11, q.data(), 11, &scale, mf::cpu::kInputLimit);
  CHECK(scale == 2.0f);
  CHECK(q[0] == 64);  // 127 * 0.5 = 63.5 ties to the even 64
  CHECK(q[10] == -127);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  mf::cpu::quantize_rows(1, 11, x.data(), 11, q.data(), 11, &scale, mf::cpu::kInputLimit);
  CHECK(std::isnan(scale));
  // Largest |x| 2: scale 2 / 127; 1 * 63.5 = 63.5 ties to 64, -2 gives -127, 0.25 * 63.5 = 15.875 -> 16.
  std::vector<float> y{1.0f, -2.0f, 0.25f};
  mf::cpu::quantize_rows(1, 3, y.data(), 3, q.data(), 3, &scale, mf::cpu::kInputLimit);
  CHECK(scale == 2.0f / 127.0f);
  CHECK(std::vector<int8_t>(q.begin(), q.begin() + 3) == std::vector<int8_t>{64, -127, 16});
  // Weights stop at 63: largest |x| 2, multiplier 31.5: 1 -> 31.5 ties to 32, -2 -> -63, 0.25 -> 7.875 -> 8.
  mf::cpu::quantize_rows(1, 3, y.data(), 3, q.data(), 3, &scale, mf::cpu::kWeightLimit);
  CHECK(scale == 2.0f / 63.0f);
  CHECK(std::vector<int8_t>(q.begin(), q.begin() + 3) == std::vector<int8_t>{32, -63, 8});
  // Rows of zeros get scale 1; a NaN or an infinity makes the scale NaN (outputs NaN, not finite).
  std::vector<float> rows{0, 0, 0, 1, std::numeric_limits<float>::quiet_NaN(), 2,
                          3, std::numeric_limits<float>::infinity(), 4};
  std::vector<float> scales(3);
  q.assign(9, 1);
  mf::cpu::quantize_rows(3, 3, rows.data(), 3, q.data(), 3, scales.data(), mf::cpu::kInputLimit);
  CHECK(scales[0] == 1.0f);
  CHECK(std::isnan(scales[1]));
  CHECK(std::isnan(scales[2]));
  CHECK(q == std::vector<int8_t>(9, 0));
}

TEST_CASE("gemm_int8 sums exactly and applies its epilogue, bit for bit on every path") {
  std::mt19937 rng(7);
  struct Shape {
    int64_t rows, cols, depth;
  };
  // No depth (sums of nothing), edges of the strips (6 rows for AVX2, 12 for AVX512-VNNI), the
  // panels (8 and 32 channels) and the 4-value groups, and one larger product.
  for (Shape shape : {Shape{3, 5, 0}, Shape{1, 1, 1}, Shape{5, 7, 3}, Shape{6, 8, 4}, Shape{7, 9, 5}, Shape{13, 20, 37},
                      Shape{12, 32, 8}, Shape{11, 31, 9}, Shape{25, 33, 6}, Shape{64, 130, 515}}) {
    CAPTURE(shape.rows);
    CAPTURE(shape.cols);
    CAPTURE(shape.depth);
    const int64_t ldq = shape.depth + 3, ldw = shape.depth + 1, ldc = shape.cols + 2;  // rows apart, not packed
    std::vector<int8_t> q_x = random_int8(static_cast<size_t>(shape.rows * ldq), rng, mf::cpu::kInputLimit);
    std::vector<int8_t> q_w = random_int8(static_cast<size_t>(shape.cols * ldw), rng, mf::cpu::kWeightLimit);
    std::vector<float> x_scales = random_floats(static_cast<size_t>(shape.rows), rng, 0.001f, 0.1f);
    std::vector<float> w_scales = random_floats(static_cast<size_t>(shape.cols), rng, 0.001f, 0.1f);
    std::vector<float> bias = random_floats(static_cast<size_t>(shape.cols), rng, -1, 1);
    for (bool relu : {false, true}) {
      for (bool with_bias : {false, true}) {
        // The reference: int64 sums (exact), then gemm_int8.h's formula.
        std::vector<float> want(static_cast<size_t>(shape.rows * ldc), -7.0f);
        for (int64_t i = 0; i < shape.rows; ++i)
          for (int64_t j = 0; j < shape.cols; ++j) {
            int64_t sum = 0;
            for (int64_t k = 0; k < shape.depth; ++k) sum += int64_t{q_x[i * ldq + k]} * q_w[j * ldw + k];
            float value = static_cast<float>(sum) * (x_scales[i] * w_scales[j]);
            if (with_bias) value += bias[j];
            want[i * ldc + j] = relu ? std::max(value, 0.0f) : value;
          }
        for (Isa isa : int8_paths()) {
          CAPTURE(static_cast<int>(isa));
          mf::cpu::PackedInt8Weight weight(shape.cols, shape.depth, q_w.data(), ldw, w_scales.data(), isa);
          REQUIRE(weight.isa() == isa);
          std::vector<float> got(want.size(), -7.0f);  // the gaps between rows stay untouched
          mf::cpu::gemm_int8(shape.rows, q_x.data(), ldq, x_scales.data(), weight, got.data(), ldc,
                             with_bias ? bias.data() : nullptr, relu);
          CHECK(same_bits(got, want));
        }
      }
    }
  }
}

TEST_CASE("linear_int8_kernel names the path a weight packed by default takes") {
  const int8_t value = 1;
  const float scale = 1;
  const mf::cpu::PackedInt8Weight weight(1, 1, &value, 1, &scale);
  const char* expected = weight.isa() == Isa::avx512 ? "AVX512-VNNI" : weight.isa() == Isa::avx2 ? "AVX2" : "baseline";
  CHECK(mf::linear_int8_kernel() == expected);
  // AVX-512 takes VNNI's path exactly where the CPU has VNNI.
  if (mf::kernel_isa() == Isa::avx512) CHECK((weight.isa() == Isa::avx512) == mf::cpu_has_avx512_vnni());
}

TEST_CASE("gemm_int8 sums the extremes exactly, and packing refuses weights past +-63") {
  // Every input 127 or -127 against weights 63 or -63 over 1000 values: the largest pair sums the
  // AVX2 path's int16 step sees, and int32 sums of +-8,001,000.
  const int64_t rows = 3, cols = 9, depth = 1000;
  std::vector<int8_t> q_x(rows * depth), q_w(cols * depth);
  for (int64_t i = 0; i < rows * depth; ++i) q_x[i] = static_cast<int8_t>(i % 3 == 0 ? -127 : 127);
  for (int64_t i = 0; i < cols * depth; ++i) q_w[i] = static_cast<int8_t>(i % 5 == 0 ? -63 : 63);
  std::vector<float> ones(cols, 1.0f), x_ones(rows, 1.0f);
  for (Isa isa : int8_paths()) {
    CAPTURE(static_cast<int>(isa));
    mf::cpu::PackedInt8Weight weight(cols, depth, q_w.data(), depth, ones.data(), isa);
    std::vector<float> got(rows * cols);
    mf::cpu::gemm_int8(rows, q_x.data(), depth, x_ones.data(), weight, got.data(), cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        int64_t sum = 0;
        for (int64_t k = 0; k < depth; ++k) sum += int64_t{q_x[i * depth + k]} * q_w[j * depth + k];
        CHECK(got[i * cols + j] == static_cast<float>(sum));
      }
  }
  q_w[7] = 64;
  CHECK_THROWS_WITH_AS(mf::cpu::PackedInt8Weight(cols, depth, q_w.data(), depth, ones.data()),
                       doctest::Contains("value 64 of channel 0 lies outside [-63, 63]"), mf::Error);
}

TEST_CASE("a product quantized to int8 stays within the bound its two roundings allow") {
  std::mt19937 rng(11);
  const int64_t rows = 9, cols = 17, depth = 200;
  std::vector<float> x = random_floats(static_cast<size_t>(rows * depth), rng, -3, 3);
  std::vector<float> w = random_floats(static_cast<size_t>(cols * depth), rng, -0.2f, 0.2f);
  std::vector<int8_t> q_x(x.size()), q_w(w.size());
  std::vector<float> x_scales(rows), w_scales(cols);
  mf::cpu::quantize_rows(rows, depth, x.data(), depth, q_x.data(), depth, x_scales.data(), mf::cpu::kInputLimit);
  mf::cpu::quantize_rows(cols, depth, w.data(), depth, q_w.data(), depth, w_scales.data(), mf::cpu::kWeightLimit);
  for (Isa isa : int8_paths()) {
    CAPTURE(static_cast<int>(isa));
    mf::cpu::PackedInt8Weight weight(cols, depth, q_w.data(), depth, w_scales.data(), isa);
    std::vector<float> y(static_cast<size_t>(rows * cols));
    mf::cpu::gemm_int8(rows, q_x.data(), depth, x_scales.data(), weight, y.data(), cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        // x = s_x (q_x + e_x) with |e_x| <= 1/2 (rounding to the nearest integer), w likewise, so
        // x w - s_x s_w q_x q_w = s_x s_w (q_x e_w + q_w e_x + e_x e_w), each term at most
        // |x| s_w / 2 + |w| s_x / 2 + s_x s_w / 4 once q is traded for x / s (to first order). The
        // multipliers 127 / max and 63 / max are themselves rounded (float32, 2^-24 relative) and the epilogue rounds
        // twice more: 1% of slack and 1e-6 relative cover those.
        double exact = 0, bound = 0;
        for (int64_t k = 0; k < depth; ++k) {
          double xk = x[i * depth + k], wk = w[j * depth + k];
          exact += xk * wk;
          bound += std::fabs(xk) * w_scales[j] / 2 + std::fabs(wk) * x_scales[i] / 2 +
                   double{x_scales[i]} * w_scales[j] / 4;
        }
        CAPTURE(i);
        CAPTURE(j);
        CHECK(std::fabs(y[i * cols + j] - exact) <= 1.01 * bound + 1e-6 * std::fabs(exact));
      }
  }
}
