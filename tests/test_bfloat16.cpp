// bfloat16 as a storage dtype: the conversions against bit patterns worked out by hand (a bfloat16 is
// the top 16 bits of a float32: sign, 8 exponent bits, 7 fraction bits), then tensors holding it:
// casts, fills, views, printing, checkpoints, and arithmetic on it (in float32, rounded once).
#include <doctest/doctest.h>

#include "helpers.h"
#include "miniflow.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <vector>

using namespace mf;

namespace {

uint16_t bits_of(float value) { return bfloat16(value).bits; }
uint16_t bits_of(double value) { return bfloat16(value).bits; }
float from_float_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
float float_of(uint16_t bits) { return static_cast<float>(bfloat16::from_bits(bits)); }

}  // namespace

TEST_CASE("float32 to bfloat16 rounds to nearest, ties to even") {
  CHECK(bits_of(1.0f) == 0x3F80);
  CHECK(bits_of(-2.5f) == 0xC020);
  // 1 + 2^-8 lies halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81): the even one, 0x3F80.
  CHECK(bits_of(from_float_bits(0x3F808000)) == 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 0x3F81 and 0x3F82: the even one, 0x3F82.
  CHECK(bits_of(from_float_bits(0x3F818000)) == 0x3F82);
  // One float ulp above the halfway point rounds up, one below rounds down.
  CHECK(bits_of(from_float_bits(0x3F808001)) == 0x3F81);
  CHECK(bits_of(from_float_bits(0x3F807FFF)) == 0x3F80);
  // The largest bfloat16 (0x7F7F, (2 - 2^-7) 2^127) stays; float32's largest lies past the halfway point
  // (2 - 2^-8) 2^127 to infinity, so it rounds to infinity.
  CHECK(bits_of(from_float_bits(0x7F7F0000)) == 0x7F7F);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(bits_of(-0.0f) == 0x8000);
}

TEST_CASE("NaN stays NaN and subnormals are rounded, not flushed") {
  CHECK(bits_of(from_float_bits(0x7FC00000)) == 0x7FC0);  // the quiet NaN
  CHECK(bits_of(from_float_bits(0xFFC00000)) == 0xFFC0);  // its sign is kept
  // A NaN whose payload lies only in the dropped bits: truncated it would read as infinity.
  CHECK(bits_of(from_float_bits(0x7F800001)) == 0x7FC0);
  CHECK(std::isnan(float_of(bits_of(from_float_bits(0x7F800001)))));
  // 2^-133 is the smallest bfloat16 subnormal (0x0001); half of it ties to the even 0x0000, one and
  // a half ties to the even 0x0002.
  CHECK(bits_of(from_float_bits(0x00010000)) == 0x0001);
  CHECK(bits_of(from_float_bits(0x00008000)) == 0x0000);
  CHECK(bits_of(from_float_bits(0x00018000)) == 0x0002);
  // float32's largest subnormal rounds up to the smallest normal bfloat16.
  CHECK(bits_of(from_float_bits(0x007FFFFF)) == 0x0080);
}

TEST_CASE("float64 to bfloat16 is rounded once, not through float32's rounding") {
  // 1 + 2^-8 + 2^-30: float32 would round it to 1 + 2^-8 (the 2^-30 is below its ulp), and that tie
  // to 1. Rounded once, it lies above the halfway point: 1 + 2^-7.
  CHECK(bits_of(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)) == 0x3F81);
  CHECK(bits_of(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30)) == 0x3F80);
  CHECK(bits_of(1.0 + std::ldexp(1.0, -8)) == 0x3F80);  // an exact tie still goes to even
  CHECK(bits_of(1e300) == 0x7F80);
  CHECK(bits_of(-1e-300) == 0x8000);
  CHECK(bits_of(std::nan("")) == 0x7FC0);
}

TEST_CASE("bfloat16 to float32 is exact") {
  CHECK(float_of(0x3F81) == 1.0078125f);  // 1 + 2^-7
  CHECK(float_of(0x0001) == std::ldexp(1.0f, -133));
  CHECK(float_of(0xFF80) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(float_of(0x7FC0)));
  CHECK(std::signbit(float_of(0x8000)));
}

TEST_CASE("tensors hold bfloat16: casts both ways, fills, views and printing") {
  Tensor x = from_vector<float>({1.0f, -2.5f, 3.0f, 1.00390625f, 65536.0f, 0.1f}, {2, 3});
  Tensor b = x.to(DType::BFloat16);
  CHECK(b.dtype() == DType::BFloat16);
  CHECK(b.element_size() == 2);
  CHECK(is_floating(b.dtype()));
  // 1 + 2^-8 ties to 1; 0.1f (0x3DCCCCCD) rounds to 0x3DCD = 0.10009765625.
  CHECK(b.to(DType::Float32).to_vector<float>() ==
        std::vector<float>{1.0f, -2.5f, 3.0f, 1.0f, 65536.0f, 0.10009765625f});
  CHECK(b.to_vector<bfloat16>()[5].bits == 0x3DCD);
  CHECK(b.at<double>({1, 2}) == 0.10009765625);
  // 257 lies halfway between the neighbours 256 and 258: the even one, 256 (0x4380).
  CHECK(from_vector<int64_t>({257, -3}).to(DType::BFloat16).to_vector<bfloat16>()[0].bits == 0x4380);
  CHECK(from_vector<bool>({true, false}).to(DType::BFloat16).to_vector<double>() == std::vector<double>{1, 0});
  CHECK(b.to(DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3, 1, 65536, 0});
  CHECK(b[1][2].item<double>() == 0.10009765625);
  CHECK(b.to(DType::Float64).to_vector<double>()[1] == -2.5);
  CHECK(b.t().contiguous().to(DType::Float32).to_vector<float>() ==
        std::vector<float>{1.0f, 1.0f, -2.5f, 65536.0f, 3.0f, 0.10009765625f});
  CHECK(full({2}, 0.1, DType::BFloat16).to_vector<bfloat16>()[0].bits == 0x3DCD);  // 0.1 as a double, rounded once
  CHECK(zeros({3}, DType::BFloat16).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(to_string(from_vector<float>({1.0f, 2.5f}).to(DType::BFloat16)) == "tensor([1.0000, 2.5000], dtype=bfloat16)");
  CHECK(promote_types(DType::BFloat16, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::BFloat16, DType::Int64) == DType::BFloat16);
}

TEST_CASE("bfloat16 tensors live on every device: casts, copies and fills give the same bits") {
  // The hand-worked patterns of the cases above, converted by the device's own kernels.
  const std::vector<uint32_t> float_bits{0x3F800000, 0xC0200000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,
                                         0x7F7F0000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x80000000, 0x7FC00000,
                                         0xFFC00000, 0x7F800001, 0x00010000, 0x00008000, 0x00018000, 0x007FFFFF};
  const std::vector<uint16_t> expected{0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F7F, 0x7F80, 0x7F80,
                                       0xFF80, 0x8000, 0x7FC0, 0xFFC0, 0x7FC0, 0x0001, 0x0000, 0x0002, 0x0080};
  std::vector<float> floats;
  for (uint32_t bits : float_bits) floats.push_back(from_float_bits(bits));
  auto bits_in = [](const Tensor& t) {
    std::vector<uint16_t> out;
    for (bfloat16 b : t.to(Device::cpu()).to_vector<bfloat16>()) out.push_back(b.bits);
    return out;
  };
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    Tensor b = from_vector<float>(floats).to(device).to(DType::BFloat16);
    CHECK(b.device() == device);
    CHECK(bits_in(b) == expected);
    // Back to float32 exactly (the NaNs compare as NaN), and through a transfer unchanged.
    std::vector<float> back = b.to(DType::Float32).to(Device::cpu()).to_vector<float>();
    for (size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      if (std::isnan(back[i])) CHECK(std::isnan(float_of(expected[i])));
      else CHECK(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(float_of(expected[i])));
    }
    CHECK(bits_in(b.to(Device::cpu()).to(device)) == expected);
    // From float64 rounded once: 1 + 2^-8 + 2^-30 goes up, the exact tie to even.
    Tensor d = from_vector<double>({1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), 1.0 + std::ldexp(1.0, -8)});
    CHECK(bits_in(d.to(device).to(DType::BFloat16)) == std::vector<uint16_t>{0x3F81, 0x3F80});
    // Integers and bools: 257 ties to the even 256 (0x4380); true is 1 (0x3F80).
    CHECK(bits_in(from_vector<int64_t>({257, -3}).to(device).to(DType::BFloat16)) ==
          std::vector<uint16_t>{0x4380, 0xC040});
    CHECK(bits_in(from_vector<bool>({true, false}).to(device).to(DType::BFloat16)) ==
          std::vector<uint16_t>{0x3F80, 0x0000});
    // A strided copy, and a fill of 0.1 (as a double, rounded once: 0x3DCD).
    Tensor grid = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(device).to(DType::BFloat16);
    CHECK(grid.t().contiguous().to(DType::Float32).to(Device::cpu()).to_vector<float>() ==
          std::vector<float>{1, 4, 2, 5, 3, 6});
    CHECK(bits_in(full({2}, 0.1, DType::BFloat16, device)) == std::vector<uint16_t>{0x3DCD, 0x3DCD});
    // Arithmetic on the device: computed in float32, rounded to bfloat16 (values exact here).
    Tensor halves = grid * 0.5;
    CHECK(halves.dtype() == DType::BFloat16);
    CHECK(halves.to(DType::Float32).to(Device::cpu()).to_vector<float>() ==
          std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3});
  }
}

TEST_CASE("casts through bfloat16 carry gradients back in float32") {
  Tensor x = from_vector<float>({1.5f, -2.0f, 0.1f});
  x.set_requires_grad(true);
  Tensor y = x.to(DType::BFloat16).to(DType::Float32).mul(2.0).sum();
  y.backward();
  CHECK(x.grad().dtype() == DType::Float32);
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2.0f, 2.0f, 2.0f});
}

// Outside autocast, bfloat16 tensors compute as PyTorch's CPU kernels compute them: in float32, each
// result rounded to bfloat16 once (test_ops_registry checks every op against that rule). The values
// below are worked by hand and were checked against PyTorch 2.15 (torch.bfloat16 on the CPU).
TEST_CASE("bfloat16 arithmetic computes in float32 and rounds each result once") {
  // 1 + 256 x 2^-8 = 2: a float32 sum reaches it; a bfloat16 accumulator would stay at 1, since
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 that rounds to the even 1.
  std::vector<float> values(257, std::ldexp(1.0f, -8));
  values[0] = 1;
  Tensor terms = from_vector<float>(values).to(DType::BFloat16);
  Tensor total = terms.sum();
  CHECK(total.dtype() == DType::BFloat16);
  CHECK(total.item<double>() == 2.0);
  // One op, one rounding: 1 + 2^-8 rounds to 1 (the tie to even), 1 + 3 x 2^-8 to 1 + 2^-6.
  Tensor one = full({2}, 1.0, DType::BFloat16);
  Tensor nudged = one + from_vector<float>({std::ldexp(1.0f, -8), 3 * std::ldexp(1.0f, -8)}).to(DType::BFloat16);
  CHECK(nudged.to_vector<double>() == std::vector<double>{1.0, 1.0 + std::ldexp(1.0, -6)});
  // A product of bfloat16 matrices: exact sums of exact products, [[1, 2, 3], [4, 5, 6]] times
  // [[0.5, 1], [1.5, 2], [2.5, 3]]; gradients flow back in bfloat16: d(sum)/da = b's row sums.
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(DType::BFloat16).set_requires_grad(true);
  Tensor b = from_vector<float>({0.5f, 1, 1.5f, 2, 2.5f, 3}, {3, 2}).to(DType::BFloat16);
  Tensor y = a.matmul(b);
  CHECK(y.dtype() == DType::BFloat16);
  CHECK(y.to_vector<double>() == std::vector<double>{11, 14, 24.5, 32});
  y.sum().backward();
  CHECK(a.grad().dtype() == DType::BFloat16);
  CHECK(a.grad().to_vector<double>() == std::vector<double>{1.5, 3.5, 5.5, 1.5, 3.5, 5.5});
  // In place, and beside a float32 tensor (promoted: the result is float32), and comparisons (bool).
  Tensor c = b.clone();
  c.mul_(2.0);
  CHECK(c.dtype() == DType::BFloat16);
  CHECK(c.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK((b + ones({3, 2})).dtype() == DType::Float32);
  CHECK((b > 1.0).dtype() == DType::Bool);
  CHECK(b.softmax(-1).dtype() == DType::BFloat16);
}

// PyTorch 2.15 gives the same: torch.arange(255, 261, dtype=torch.bfloat16) is [255, 256, 256, 258,
// 260, 260], and torch.randn(5, generator=g, dtype=torch.bfloat16) equals the float32 draw rounded.
TEST_CASE("random draws and arange make bfloat16 in float32 and round it") {
  // Between 256 and 512 bfloat16 steps by 2: 257 ties to the even 256, 259 to the even 260.
  CHECK(arange(255, 261, 1, DType::BFloat16).to_vector<double>() == std::vector<double>{255, 256, 256, 258, 260, 260});
  Generator first(5), second(5);
  Tensor drawn = randn({1001}, DType::BFloat16, Device::cpu(), &first);
  CHECK(drawn.dtype() == DType::BFloat16);
  CHECK(drawn.to(DType::Float32).to_vector<float>() ==
        randn({1001}, DType::Float32, Device::cpu(), &second).to(DType::BFloat16).to(DType::Float32).to_vector<float>());
  // Views need no kernel and take any dtype.
  Tensor b = ones({2, 2}, DType::BFloat16);
  CHECK(b.view({4}).narrow(0, 1, 2).to_vector<double>() == std::vector<double>{1, 1});
}

namespace {

/// float32 rounded to the nearest bfloat16, ties to even, by its bits (the test's own rounding).
float rounded(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

/// A bfloat16 weight holding `values`, with the gradient `grad` (rounded to bfloat16).
void set_gradient(Tensor& weight, const std::vector<float>& grad) {
  weight.set_grad(from_vector(grad, {static_cast<int64_t>(grad.size())}).to(DType::BFloat16));
}

}  // namespace

TEST_CASE("optimizers update bfloat16 weights in float32, the weight and its state rounded once a step") {
  // By hand: torch.optim's rules in float32 on the bfloat16 values, written out per element in their
  // documented order, the step's scalars in double as Python computes them; the weight's update takes
  // the new state as computed, and then the weight and each state buffer are rounded to bfloat16
  // (PyTorch's fused CPU optimizers on bfloat16 parameters compute in float32 the same way and store
  // each result once). PyTorch 2.15's Adam, fused or not, and its fused SGD gave these same weights at
  // every step for these inputs.
  const std::vector<float> start = {0.5f, -1.25f, 3.0f, 1e-3f, -7.0f, 0.1f};
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 1e-4f, 2.0f, -0.05f},
                                                 {0.3f, 0.1f, -0.7f, 2e-4f, -1.5f, 0.2f},
                                                 {-0.2f, 0.4f, 0.05f, -3e-4f, 0.5f, 0.01f}};
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    Tensor weight = from_vector(start, {6}).to(DType::BFloat16);
    weight.set_requires_grad(true);
    const double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    optim::Adam adam({weight}, {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps});
    adam.set_fused(fused);
    std::vector<float> p(start.size()), m(start.size(), 0), v(start.size(), 0);
    for (size_t i = 0; i < start.size(); ++i) p[i] = rounded(start[i]);
    for (size_t step = 1; step <= grads.size(); ++step) {
      set_gradient(weight, grads[step - 1]);
      adam.step();
      const auto t = static_cast<double>(step);
      const auto neg_step = static_cast<float>(-(lr / (1 - std::pow(beta1, t))));
      const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(beta2, t)));
      for (size_t i = 0; i < start.size(); ++i) {
        const float g = rounded(grads[step - 1][i]);
        const float new_m = m[i] * static_cast<float>(beta1) + static_cast<float>(1 - beta1) * g;
        const float new_v = v[i] * static_cast<float>(beta2) + (static_cast<float>(1 - beta2) * g) * g;
        p[i] = rounded(p[i] + (neg_step * new_m) / (std::sqrt(new_v) / bias_correction2_sqrt + static_cast<float>(eps)));
        m[i] = rounded(new_m);
        v[i] = rounded(new_v);
      }
      CAPTURE(step);
      CHECK(weight.dtype() == DType::BFloat16);
      CHECK(weight.to(DType::Float32).to_vector<float>() == p);
      const optim::ParamState& state = adam.param_state(0);
      CHECK(state.buffers.at("exp_avg").dtype() == DType::BFloat16);
      CHECK(state.buffers.at("exp_avg").to(DType::Float32).to_vector<float>() == m);
      CHECK(state.buffers.at("exp_avg_sq").to(DType::Float32).to_vector<float>() == v);
    }
    // 1e-3 moved by about lr each step, far more than its bfloat16 step (2^-17): it did change.
    CHECK(p[3] != rounded(start[3]));
  }

  // SGD with momentum: b = momentum b + g (b = g at the first step), w = w - lr b.
  Tensor weight = from_vector(start, {6}).to(DType::BFloat16);
  weight.set_requires_grad(true);
  optim::SGD sgd({weight}, {.lr = 0.1, .momentum = 0.9});
  std::vector<float> p(start.size()), b(start.size());
  for (size_t i = 0; i < start.size(); ++i) p[i] = rounded(start[i]);
  for (size_t step = 0; step < grads.size(); ++step) {
    set_gradient(weight, grads[step]);
    sgd.step();
    for (size_t i = 0; i < start.size(); ++i) {
      const float g = rounded(grads[step][i]);
      const float new_b = step == 0 ? g : b[i] * 0.9f + 1.0f * g;
      p[i] = rounded(p[i] + -0.1f * new_b);
      b[i] = rounded(new_b);
    }
    CAPTURE(step);
    CHECK(weight.to(DType::Float32).to_vector<float>() == p);
    CHECK(sgd.param_state(0).buffers.at("momentum_buffer").to(DType::Float32).to_vector<float>() == b);
  }
  // The state saves in bfloat16 and loads back.
  optim::OptimizerState saved = sgd.state_dict();
  CHECK(saved.tensors.at(0).tensor.dtype() == DType::BFloat16);
  CHECK_THROWS_WITH_AS(optim::SGD({ones({2}, DType::Int64)}, {.lr = 0.1}),
                       doctest::Contains("can only optimize float32, float64 or bfloat16 tensors, got a int64"), Error);
}

TEST_CASE("bfloat16 tensors round-trip through safetensors as BF16") {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "mf_bfloat16_test.safetensors";
  Tensor b = from_vector<float>({0.1f, -3.0f, 1e30f, std::numeric_limits<float>::infinity()}, {2, 2})
                 .to(DType::BFloat16);
  nn::save_tensors(path.string(), {{"b", b}});
  nn::TensorFile file = nn::load_tensors(path.string());
  std::filesystem::remove(path);
  REQUIRE(file.tensors.size() == 1);
  const Tensor& loaded = file.tensors[0].tensor;
  CHECK(loaded.dtype() == DType::BFloat16);
  CHECK(loaded.shape() == Shape{2, 2});
  std::vector<uint16_t> got, want;
  for (bfloat16 v : loaded.to_vector<bfloat16>()) got.push_back(v.bits);
  for (bfloat16 v : b.to_vector<bfloat16>()) want.push_back(v.bits);
  CHECK(got == want);
  CHECK(nn::to_record("b", b).dtype == DType::BFloat16);
}
