// Elementwise ops and fills: hand-worked values, broadcasting, gradients at the edge cases the registry
// suite's random samples avoid, error messages, and the statistics and reproducibility of random draws.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/math.h"
#include "ops/registry.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;
using mf::testing::ThreadCountGuard;

namespace {

/// Gradient of sum(f(x)) at x.
Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  Tensor leaf = x.clone().set_requires_grad();
  f(leaf).sum().backward();
  return leaf.grad();
}

Tensor bools(const std::vector<double>& values, const Shape& shape = {}) { return f64(values, shape).to(DType::Bool); }

double mean_of(const std::vector<double>& v) {
  double total = 0;
  for (double x : v) total += x;
  return total / static_cast<double>(v.size());
}

/// d gelu / dx at each element of `input`, by backward from a contiguous gradient (the vector path; sum's
/// would be a broadcast view).
Tensor gelu_slope(const Tensor& input, const std::string& approximate) {
  Tensor leaf = input.detach().set_requires_grad();
  gelu(leaf, approximate).backward(ones_like(input));
  return leaf.grad();
}

double variance_of(const std::vector<double>& v) {
  double m = mean_of(v), total = 0;
  for (double x : v) total += (x - m) * (x - m);
  return total / static_cast<double>(v.size());
}

}  // namespace

TEST_CASE("gelu's tanh approximation matches PyTorch's approximate='tanh' and refuses unknown names") {
  // x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2, evaluated in Python's math module: at 1,
  // 0.8411919906082768 (torch.nn.functional.gelu(torch.tensor(1.), approximate='tanh') prints
  // 0.8412); at -2, -0.04540230591222494; at 0.5, 0.34571400982514394.
  check_close(gelu(f64({1, -2, 0.5, 0}), "tanh"), f64({0.8411919906082768, -0.04540230591222494, 0.34571400982514394, 0}),
              1e-14, 1e-15);
  check_close(f64({1}).gelu("tanh"), f64({0.8411919906082768}), 1e-14, 1e-15);
  // It differs from the exact form by about 1.5e-4 at 1 (0.8413447 against 0.8411920).
  CHECK(std::abs(gelu(f64({1})).item<double>() - gelu(f64({1}), "tanh").item<double>()) > 1e-4);
  nn::GELUImpl layer({.approximate = "tanh"});
  check_close(layer.forward(f64({1})), f64({0.8411919906082768}), 1e-14, 1e-15);
  CHECK(layer.to_string() == "GELU(approximate='tanh')");
  CHECK_THROWS_WITH_AS(gelu(f64({1}), "fast"), doctest::Contains("gelu: approximate must be 'none' or 'tanh', got 'fast' at"), Error);
  CHECK_THROWS_WITH_AS(nn::GELU({.approximate = "erf"}), doctest::Contains("approximate must be 'none' or 'tanh'"), Error);
}

TEST_CASE("float32 gelu_tanh and its gradient keep their relative accuracy where 1 + tanh(u) would cancel") {
  // x (1 + tanh u) / 2 = x s with s = 1 / (1 + e^-2u): the second form in float64 is the reference, since
  // the first rounds to 0 even in float64 below x = -6.5 (tanh u = -1 + 2e^2u). PyTorch 2.15's float32
  // kernel takes the first form: F.gelu(torch.tensor(-6.), approximate='tanh') prints -0. Its derivative
  // is s + 2 x s (1 - s) u' (1 - tanh^2 u = 4 s (1 - s)), 1 - s = 1 / (1 + e^2u). The rounding of u in
  // float32 (relative 2^-23 or so, times |2u| = 87 at x = -10) bounds the relative error near 1e-5; the
  // gradient's two terms also cancel near its zero at x = -0.75, hence the bound on the second term's
  // size there.
  std::vector<double> inputs;
  for (double x = -10; x <= 10; x += 0.0137) inputs.push_back(x);
  Tensor x32 = f64(inputs).to(DType::Float32).set_requires_grad();
  Tensor y = gelu(x32, "tanh");
  y.backward(ones_like(y));  // a contiguous gradient: the vector path (sum's would be a broadcast view)
  std::vector<float> got = y.to_vector<float>(), slope = x32.grad().to_vector<float>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    double x = static_cast<float>(inputs[i]);
    double u = math::GeluTanh::kScale * (x + math::GeluTanh::kCubic * x * x * x);
    double du = math::GeluTanh::kScale * (1 + 3 * math::GeluTanh::kCubic * x * x);
    double s = 1 / (1 + std::exp(-2 * u)), rest = 1 / (1 + std::exp(2 * u));
    double second_term = 2 * x * s * rest * du, want_slope = s + second_term;
    CAPTURE(x);
    CHECK(std::fabs(got[i] - x * s) <= 2e-5 * std::fabs(x * s) + 1e-45);
    CHECK(std::fabs(slope[i] - want_slope) <= 2e-5 * std::fabs(want_slope) + 1e-6 * std::fabs(second_term) + 1e-45);
  }
  // Strided input takes the element-wise loops, to the same bits as the vectors.
  const auto half = static_cast<int64_t>(inputs.size()) / 2;
  Tensor x = f64(inputs).to(DType::Float32).narrow(0, 0, 2 * half).reshape({2, half});
  check_close(gelu(x.t().contiguous().t(), "tanh"), gelu(x, "tanh"), 0, 0);
  check_close(gelu_slope(x.t().contiguous().t(), "tanh"), gelu_slope(x, "tanh"), 0, 0);
}

TEST_CASE("float32 gelu's gradient keeps its relative accuracy in the left tail") {
  // Phi(x) + x phi(x), Phi from erfc in float64 (see kVectorMath's gelu, whose values the table test
  // checks); its two terms cancel near its zero at x = -0.75, hence the bound on the second term's size
  // there, and a few units of the least subnormal where the gradient is subnormal (below x = -13.34).
  // Measured: at most half of this bound over every 193rd float below 20 in magnitude.
  std::vector<double> inputs;
  for (double x = -14.5; x <= 10; x += 0.0137) inputs.push_back(x);
  Tensor x32 = f64(inputs).to(DType::Float32);
  std::vector<float> slope = gelu_slope(x32, "none").to_vector<float>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    double x = static_cast<float>(inputs[i]);
    double cdf = std::erfc(-x / std::sqrt(2.0)) / 2, second_term = x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
    CAPTURE(x);
    CHECK(std::fabs(slope[i] - (cdf + second_term)) <=
          1e-6 * std::fabs(cdf + second_term) + 1e-6 * std::fabs(second_term) + 0x1p-147);
  }
  const auto half = static_cast<int64_t>(inputs.size()) / 2;
  Tensor x = x32.narrow(0, 0, 2 * half).reshape({2, half});
  check_close(gelu_slope(x.t().contiguous().t(), "none"), gelu_slope(x, "none"), 0, 0);
}

TEST_CASE("gelu matches hand-worked values of x * Phi(x)") {
  // Phi(1) = 0.8413447460685429, Phi(-1) = 1 - Phi(1), Phi(0) = 1/2; gelu(x) = x Phi(x).
  check_close(gelu(f64({1, -1, 0, 2})), f64({0.8413447460685429, -0.15865525393145707, 0, 1.9544997361036416}),
              1e-14, 1e-15);
  // float32 follows the same formula.
  check_close(gelu(f64({1}).to(DType::Float32)), f64({0.8413447460685429}).to(DType::Float32), 1e-6, 1e-7);
  // d gelu/dx = Phi(x) + x phi(x); at 1: 0.8413447460685429 + exp(-1/2)/sqrt(2 pi) = 0.8413447 + 0.2419707.
  check_close(grad_of([](const Tensor& x) { return gelu(x); }, f64({1, 0})),
              f64({0.8413447460685429 + 0.24197072451914337, 0.5}), 1e-14, 1e-15);
}

TEST_CASE("unary math functions on hand-worked values") {
  // sigmoid(ln 3) = 1 / (1 + 1/3) = 3/4; tanh(ln 2) = (4 - 1) / (4 + 1) = 3/5.
  check_close(sigmoid(f64({0, std::log(3.0)})), f64({0.5, 0.75}), 1e-15, 1e-15);
  check_close(tanh(f64({std::log(2.0), 0})), f64({0.6, 0}), 1e-15, 1e-15);
  check_close(exp(f64({0, 1})), f64({1, M_E}), 1e-15, 0);
  check_close(log(f64({1, M_E})), f64({0, 1}), 1e-15, 1e-15);
  check_close(sqrt(f64({4, 2.25})), f64({2, 1.5}), 0, 0);
  check_close(rsqrt(f64({4, 0.25})), f64({0.5, 2}), 0, 0);
  check_close(abs(f64({-2.5, 0, 3})), f64({2.5, 0, 3}), 0, 0);
  check_close(relu(f64({-2.5, 0, 3})), f64({0, 0, 3}), 0, 0);
  // NaN passes through relu and clamp, as in PyTorch.
  double nan = std::numeric_limits<double>::quiet_NaN();
  check_close(relu(f64({nan})), f64({nan}), 0, 0);
  check_close(f64({nan}).clamp(0, 1), f64({nan}), 0, 0);
  // Integer inputs of float-only functions compute in float32; abs and relu keep int64.
  Tensor ints = from_vector<int64_t>({-1, 0, 2});
  CHECK(exp(ints).dtype() == DType::Float32);
  check_close(abs(ints), from_vector<int64_t>({1, 0, 2}), 0, 0);
  check_close(ints.relu(), from_vector<int64_t>({0, 0, 2}), 0, 0);
}

TEST_CASE("float32 tanh keeps its sign, saturates to +-1 and passes NaN through") {
  // tanh(9.5) = 1 - 1.1e-8 rounds to float32's 1; -0 keeps its sign bit, as torch.tanh(torch.tensor(-0.))
  // prints -0.
  float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector<float>({inf, -inf, 9.5f, -20.0f, -0.0f, 0x1p-149f, nan});
  std::vector<float> got = tanh(x).to_vector<float>();
  CHECK(got[0] == 1.0f);
  CHECK(got[1] == -1.0f);
  CHECK(got[2] == 1.0f);
  CHECK(got[3] == -1.0f);
  CHECK((got[4] == 0.0f && std::signbit(got[4])));
  CHECK(got[5] == 0x1p-149f);
  CHECK(std::isnan(got[6]));
}

namespace {

/// The float32 functions that run on vectors (ops/cpu/simd.h's polynomials), each with the float64
/// result it is held to and the units in its last place it may miss that by: libm's expf and logf
/// are within 0.5-1; sigmoid's 1 / (1 + e^-x) adds the sum's and the quotient's roundings to the
/// exponential's, 2.08 at worst over every 1021st float for libm's expf in that formula and for
/// miniflow's alike. Where e^-x overflows float32 (x below -88.72), sigmoid is 0, as PyTorch 2.15's
/// torch.sigmoid gives at -90 (8.2e-40 in float64). gelu = x Phi(x) is held to x erfc(-x / sqrt 2) / 2,
/// which keeps float64's accuracy in the left tail: within 7.08 ulp of it over every 193rd float below
/// 20 in magnitude (PyTorch 2.15's float32 torch.nn.functional.gelu, measured the same way: 9 ulp below
/// 0.5, 19.5 by 1.4, 9,780 at -3.8, where its 1 + erf(x / sqrt 2) cancels, and -0 from -5.7 on).
struct VectorMath {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*precise)(double);
  double ulps;
  bool positive_inputs = false;  // defined for x > 0 only
};
const VectorMath kVectorMath[] = {
    {"exp", [](const Tensor& t) { return exp(t); }, [](double x) { return std::exp(x); }, 1},
    {"log", [](const Tensor& t) { return log(t); }, [](double x) { return std::log(x); }, 1, true},
    {"sigmoid", [](const Tensor& t) { return sigmoid(t); },
     [](double x) { return std::exp(-x) > std::numeric_limits<float>::max() ? 0 : 1 / (1 + std::exp(-x)); }, 2.5},
    {"tanh", [](const Tensor& t) { return tanh(t); }, [](double x) { return std::tanh(x); }, 1.5},
    {"gelu", [](const Tensor& t) { return gelu(t); }, [](double x) { return x * std::erfc(-x / std::sqrt(2.0)) / 2; },
     8},
};

}  // namespace

TEST_CASE("float32 exp, log, sigmoid, tanh and gelu stay within a few ulp of float64's result over float's range") {
  // Every 65537th bit pattern (positive and negative, normal and subnormal, 65,280 finite values) and
  // the edges: e^x is finite up to 88.7228 (ln of float's largest, 88.72283905) and subnormal below
  // -87.3365 (ln of its smallest normal) down to -103.97, where it rounds to 0, as PyTorch's
  // torch.exp gives 3.7835e-44 at -100; ln of a subnormal is finite, of 0 -inf, of a negative NaN.
  // tanh changes formula at |x| = 0.625 and errs most just above it (1.33 ulp at 0.6283 over every
  // float): every 97th pattern of [0.55, 0.75] as well. gelu's results turn subnormal below -13.15 and
  // round to -0 below -14.36: every 97th pattern of [-14.5, -12.5].
  std::vector<float> inputs = {0.0f, -0.0f, 1.0f, 88.72283f, 88.7229f, 88.5f, -87.5f, -100.0f, -103.9f, -104.5f,
                               0x1p-149f, 0x1p-130f, -1.0f, 3e38f};
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 65537) {
    float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isfinite(x)) inputs.push_back(x);
  }
  for (uint32_t bits = std::bit_cast<uint32_t>(0.55f); bits < std::bit_cast<uint32_t>(0.75f); bits += 97)
    inputs.push_back(std::bit_cast<float>(bits));
  for (uint32_t bits = std::bit_cast<uint32_t>(-12.5f); bits < std::bit_cast<uint32_t>(-14.5f); bits += 97)
    inputs.push_back(std::bit_cast<float>(bits));
  for (const VectorMath& f : kVectorMath) {
    CAPTURE(f.name);
    std::vector<float> got = f.op(from_vector<float>(inputs)).to_vector<float>();
    int64_t misses = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      double want = f.precise(inputs[i]);
      float rounded = static_cast<float>(want);
      bool same_special = (std::isnan(want) && std::isnan(got[i])) || (std::isinf(rounded) && got[i] == rounded);
      // The last place of the float32 result (of a subnormal one, the least subnormal).
      double ulp = std::fabs(rounded) < std::numeric_limits<float>::min()
                       ? 0x1p-149
                       : std::nextafter(std::fabs(rounded), INFINITY) - std::fabs(rounded);
      if (!same_special && !(std::fabs(got[i] - want) <= f.ulps * ulp) && ++misses <= 5)
        MESSAGE(fmt::format("{}({}) = {}, float64 gives {}", f.name, inputs[i], got[i], want));
    }
    CHECK(misses == 0);
  }
}

TEST_CASE("float32 exp, log, sigmoid, tanh and gelu give the same bits whatever the layout, length and thread count") {
  // Contiguous float32 tensors run on vectors and their tails one element at a time, split over the
  // threads; strided views take the element-wise loop. All must give the same bits.
  ThreadCountGuard restore_threads;
  manual_seed(7);
  Tensor x = randn({2, 50001}) * 20.0;
  for (int count : {1, 2, 3}) {
    set_num_threads(count);
    CAPTURE(count);
    for (const VectorMath& f : kVectorMath) {
      CAPTURE(f.name);
      Tensor input = f.positive_inputs ? x.abs() + 1e-30 : x;
      Tensor column_major = input.t().contiguous().t();  // the same values, strided
      REQUIRE(!column_major.is_contiguous());
      Tensor whole = f.op(input);
      check_close(f.op(column_major), whole, 0, 0);
      // 26 elements: AVX2's 8 lanes three times and a tail of 2, AVX-512's 16 once and a tail of 10.
      check_close(f.op(input.narrow(1, 0, 13).contiguous()), whole.narrow(1, 0, 13), 0, 0);
    }
  }
}

TEST_CASE("gradients of abs and relu are zero at zero, as in PyTorch") {
  check_close(grad_of([](const Tensor& x) { return abs(x); }, f64({-2, 0, 3})), f64({-1, 0, 1}), 0, 0);
  check_close(grad_of([](const Tensor& x) { return relu(x); }, f64({-2, 0, 3})), f64({0, 0, 1}), 0, 0);
}

TEST_CASE("pow: broadcasting, integer powers and scalar exponents") {
  // [[2], [3]] ^ [1, 2, 3] = [[2, 4, 8], [3, 9, 27]]
  check_close(pow(f64({2, 3}, {2, 1}), f64({1, 2, 3})), f64({2, 4, 8, 3, 9, 27}, {2, 3}), 0, 0);
  // Integer pow by squaring; negative exponents truncate 1 / a^-b: 2^-1 = 0, (-1)^-3 = -1, 1^-5 = 1.
  check_close(pow(from_vector<int64_t>({2, 2, -1, 1, 7}), from_vector<int64_t>({10, -1, -3, -5, 0})),
              from_vector<int64_t>({1024, 0, -1, 1, 1}), 0, 0);
  check_close(f64({-2, 3}).pow(3.0), f64({-8, 27}), 0, 0);
  check_close(from_vector<int64_t>({3, 4}).pow(2.0), from_vector<int64_t>({9, 16}), 0, 0);
  // A fractional exponent promotes an integer base to float32: 4^0.5 = 2.
  Tensor root = from_vector<int64_t>({4, 9}).pow(0.5);
  CHECK(root.dtype() == DType::Float32);
  check_close(root, f64({2, 3}).to(DType::Float32), 0, 0);
  // Mixed dtypes promote like add: int64 base, float64 exponent.
  CHECK(pow(from_vector<int64_t>({2}), f64({0.5})).dtype() == DType::Float64);
}

TEST_CASE("pow gradients at a zero base and a zero exponent") {
  // d(a^2)/da at a = 0 is 0; d(a^b)/db at a = 0, b >= 0 is taken as 0 rather than 0 * log 0.
  Tensor a = f64({0, 2}).set_requires_grad(), b = f64({2, 3}).set_requires_grad();
  pow(a, b).sum().backward();
  check_close(a.grad(), f64({0, 12}), 1e-15, 0);                         // b a^(b-1): 0, 3 * 4
  check_close(b.grad(), f64({0, 8 * std::log(2.0)}), 1e-15, 0);           // a^b log a
  // x^0 has gradient 0 everywhere, also at 0 (where 0 * 0^-1 would be NaN).
  check_close(grad_of([](const Tensor& x) { return x.pow(0.0); }, f64({0, 5})), f64({0, 0}), 0, 0);
  check_close(grad_of([](const Tensor& x) { return pow(x, f64({0, 0})); }, f64({0, 5})), f64({0, 0}), 0, 0);
}

TEST_CASE("clamp: optional bounds, gradient inside [min, max] bounds included") {
  Tensor x = f64({-1, -0.5, 0, 0.5, 1});
  check_close(x.clamp(-0.5, 0.5), f64({-0.5, -0.5, 0, 0.5, 0.5}), 0, 0);
  check_close(x.clamp(0, std::nullopt), f64({0, 0, 0, 0.5, 1}), 0, 0);
  check_close(x.clamp(std::nullopt, 0), f64({-1, -0.5, 0, 0, 0}), 0, 0);
  // min > max gives max everywhere, as torch.clamp.
  check_close(x.clamp(1, -1), f64({-1, -1, -1, -1, -1}), 0, 0);
  check_close(grad_of([](const Tensor& t) { return t.clamp(-0.5, 0.5); }, x), f64({0, 1, 1, 1, 0}), 0, 0);
  // Fractional bounds promote an integer tensor to float32.
  check_close(from_vector<int64_t>({0, 3}).clamp(0.5, std::nullopt), f64({0.5, 3}).to(DType::Float32), 0, 0);
  CHECK_THROWS_WITH_AS(x.clamp(std::nullopt, std::nullopt),
                       doctest::Contains("clamp: at least one of min and max must be given"), mf::Error);
}

TEST_CASE("comparisons broadcast, promote and return bool") {
  Tensor a = f64({1, 2, 3}), b = f64({2, 3}, {2, 1});
  check_close(lt(a, b), bools({1, 0, 0, 1, 1, 0}, {2, 3}), 0, 0);
  check_close(le(a, b), bools({1, 1, 0, 1, 1, 1}, {2, 3}), 0, 0);
  check_close(gt(a, b), bools({0, 0, 1, 0, 0, 0}, {2, 3}), 0, 0);
  check_close(ge(a, b), bools({0, 1, 1, 0, 0, 1}, {2, 3}), 0, 0);
  check_close(a.eq(b), bools({0, 1, 0, 0, 0, 1}, {2, 3}), 0, 0);
  check_close(a.ne(b), bools({1, 0, 1, 1, 1, 0}, {2, 3}), 0, 0);
  check_close(a.eq(2.0), bools({0, 1, 0}), 0, 0);
  // int64 against a fractional scalar compares in float: 2 != 2.5.
  check_close(from_vector<int64_t>({2, 3}).ne(2.5), bools({1, 1}), 0, 0);
  check_close(eq(from_vector<int64_t>({1, 2}), f64({1, 2.5})), bools({1, 0}), 0, 0);
  double nan = std::numeric_limits<double>::quiet_NaN();
  check_close(f64({nan}).ne(f64({nan})), bools({1}), 0, 0);
  // Comparisons are not differentiable: the result carries no graph.
  Tensor x = f64({1, 2}).set_requires_grad();
  CHECK_FALSE(lt(x, f64({2, 2})).requires_grad());
}

TEST_CASE("logical ops read any dtype as truthy") {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64({0, 1.5, nan, -2}), y = from_vector<int64_t>({1, 1, 0, 3});
  check_close(logical_and(x, y), bools({0, 1, 0, 1}), 0, 0);
  check_close(x.logical_or(y), bools({1, 1, 1, 1}), 0, 0);
  check_close(x.logical_not(), bools({1, 0, 0, 0}), 0, 0);
  check_close(bools({1, 0}).logical_and(bools({1, 1}, {2, 1})), bools({1, 0, 1, 0}, {2, 2}), 0, 0);
}

TEST_CASE("where broadcasts all three operands and routes gradients") {
  Tensor cond = bools({1, 0}, {2, 1});
  Tensor a = f64({1, 2}).set_requires_grad(), b = scalar_tensor(-1, DType::Float64).set_requires_grad();
  Tensor out = where(cond, a, b);  // [[1, 2], [-1, -1]]
  check_close(out, f64({1, 2, -1, -1}, {2, 2}), 0, 0);
  out.sum().backward();
  check_close(a.grad(), f64({1, 1}), 0, 0);  // row 0 took a
  check_close(b.grad(), f64({2}, {}), 0, 0);    // two elements of row 1 took b
  // Mixed operand dtypes promote: int64 and float32 give float32.
  CHECK(where(cond, from_vector<int64_t>({1, 2}), f64({0.5}).to(DType::Float32)).dtype() == DType::Float32);
  CHECK_THROWS_WITH_AS(where(f64({1, 0}), a, b),
                       doctest::Contains("where: condition must be a bool tensor, got float64"), mf::Error);
}

TEST_CASE("masked_fill broadcasts the mask; its gradient is zero where masked") {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}), mask = bools({0, 1, 1});
  check_close(x.masked_fill(mask, -9), f64({1, -9, -9, 4, -9, -9}, {2, 3}), 0, 0);
  check_close(grad_of([&](const Tensor& t) { return t.masked_fill(mask, 0.5); }, x), f64({1, 0, 0, 1, 0, 0}, {2, 3}),
              0, 0);
  Tensor y = x.clone();
  y.masked_fill_(bools({1, 0}, {2, 1}), 0);
  check_close(y, f64({0, 0, 0, 4, 5, 6}, {2, 3}), 0, 0);
  CHECK_THROWS_WITH_AS(x.masked_fill(from_vector<int64_t>({0, 1, 1}), 0),
                       doctest::Contains("masked_fill: mask must be a bool tensor, got int64 (shape [3])"), mf::Error);
  CHECK_THROWS_WITH_AS(x.masked_fill(bools({1, 0}), 0),
                       doctest::Contains("mask of shape [2] does not broadcast to the input's shape [2, 3]"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(x.masked_fill(bools({1, 0, 1}, {1, 1, 3}), 0), doctest::Contains("does not broadcast"),
                       mf::Error);
}

TEST_CASE("error messages name the op, the dtypes and the call site") {
  Tensor flags = bools({1, 0});
  CHECK_THROWS_WITH_AS(pow(flags, flags), doctest::Contains("pow: not defined for bool tensors"), mf::Error);
  CHECK_THROWS_WITH_AS(pow(flags, flags), doctest::Contains("test_elementwise.cpp"), mf::Error);
  CHECK_THROWS_WITH_AS(from_vector<int64_t>({2, 3}).pow(-1.0),
                       doctest::Contains("pow_scalar: integer tensors (shape [2]) need a non-negative integer"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(lt(f64({1, 2}), f64({1, 2, 3})), doctest::Contains("lt: "), mf::Error);
}

TEST_CASE("to_device copies cpu to cpu; a CUDA target without CUDA is refused by name") {
  Tensor x = f64({1, 2, 3});
  Tensor y = call1<OpId::to_device>({x}, {.device = Device::cpu()});
  check_close(y, x, 0, 0);
  CHECK(y.storage() != x.storage());
  if (!cuda::is_built())
    CHECK_THROWS_WITH_AS(x.to(Device::cuda()), doctest::Contains("built without CUDA"), mf::Error);
}

TEST_CASE("arange follows torch.arange's length ceil((end - start) / step)") {
  check_close(arange(5), from_vector<int64_t>({0, 1, 2, 3, 4}), 0, 0);
  check_close(arange(0, 1, 0.25, DType::Float32), f64({0, 0.25, 0.5, 0.75}).to(DType::Float32), 0, 0);
  // ceil((0 - 1) / -0.3) = ceil(3.33) = 4 elements: 1, 0.7, 0.4, 0.1.
  check_close(arange(1, 0, -0.3, DType::Float64), f64({1, 0.7, 0.4, 0.1}), 1e-15, 1e-15);
  CHECK(arange(3, 3).numel() == 0);
  CHECK(arange(2, 5, 1, DType::Float64).dtype() == DType::Float64);
  CHECK_THROWS_WITH_AS(arange(0, 1, 0), doctest::Contains("arange: step must be nonzero"), mf::Error);
  CHECK_THROWS_WITH_AS(arange(5, 0, 1), doctest::Contains("arange: step 1 points away from end"), mf::Error);
}

TEST_CASE("random draws: same seed, same numbers; successive draws differ") {
  Generator g1(42), g2(42), g3(43);
  std::vector<double> first = rand({1000}, DType::Float64, Device::cpu(), &g1).to_vector<double>();
  CHECK(first == rand({1000}, DType::Float64, Device::cpu(), &g2).to_vector<double>());
  CHECK(first != rand({1000}, DType::Float64, Device::cpu(), &g3).to_vector<double>());
  CHECK(first != rand({1000}, DType::Float64, Device::cpu(), &g1).to_vector<double>());
  CHECK(g1.offset() == 1000);  // two draws of 500 blocks each

  // The default generator replays after manual_seed.
  manual_seed(7);
  std::vector<double> a = randn({10}, DType::Float64).to_vector<double>();
  manual_seed(7);
  CHECK(a == randn({10}, DType::Float64).to_vector<double>());

  // float32 draws are the float64 draws truncated to 24 bits.
  Generator g4(5), g5(5);
  Tensor single = rand({100}, DType::Float32, Device::cpu(), &g4);
  Tensor twice = rand({100}, DType::Float64, Device::cpu(), &g5);
  check_close(single, twice.to(DType::Float32), 0, 1.0 / (1 << 24));
}

TEST_CASE("elementwise ops over a few long runs split each run across threads, every element once") {
  // A contiguous tensor is one run, and a [2, n] operand broadcast against [2, 1] two: with more
  // threads than runs, the pool cuts each run into pieces. Odd lengths leave a short last piece.
  ThreadCountGuard restore_threads;
  for (int count : {2, 3, 8}) {
    set_num_threads(count);
    CAPTURE(count);
    for (int64_t n : {int64_t{200003}, int64_t{65536 * 3 + 1}}) {
      Tensor x = arange(0, static_cast<double>(2 * n), 1, DType::Float32).reshape({2, n});
      Tensor row_bias = f64({0.5, -0.25}, {2, 1}).to(DType::Float32);
      std::vector<float> relu_of = relu(x - static_cast<double>(n)).to_vector<float>();
      std::vector<float> plus = (x + row_bias).to_vector<float>();
      bool all_match = true;
      for (int64_t i = 0; i < 2 * n; ++i) {
        float value = static_cast<float>(i);
        all_match = all_match && relu_of[i] == std::max(value - static_cast<float>(n), 0.0f) &&
                    plus[i] == value + (i < n ? 0.5f : -0.25f);
      }
      CHECK(all_match);
    }
  }
}

TEST_CASE("random draws do not depend on the thread count") {
  ThreadCountGuard restore_threads;
  Generator g1(3), g2(3);
  set_num_threads(1);
  std::vector<double> one = randn({200001}, DType::Float32, Device::cpu(), &g1).to_vector<double>();
  set_num_threads(4);
  std::vector<double> four = randn({200001}, DType::Float32, Device::cpu(), &g2).to_vector<double>();
  CHECK(one == four);
}

TEST_CASE("random draws have the right statistics") {
  Generator gen(2024);
  const Shape shape = {100000};
  std::vector<double> u = rand(shape, DType::Float32, Device::cpu(), &gen).to_vector<double>();
  CHECK(std::abs(mean_of(u) - 0.5) < 0.01);
  CHECK(std::abs(variance_of(u) - 1.0 / 12) < 0.005);
  CHECK(*std::min_element(u.begin(), u.end()) >= 0);
  CHECK(*std::max_element(u.begin(), u.end()) < 1);

  std::vector<double> z = randn(shape, DType::Float64, Device::cpu(), &gen).to_vector<double>();
  CHECK(std::abs(mean_of(z)) < 0.02);
  CHECK(std::abs(std::sqrt(variance_of(z)) - 1) < 0.02);

  Tensor shifted = Tensor::empty(shape, DType::Float64);
  normal_(shifted, 3, 0.5, &gen);
  std::vector<double> s = shifted.to_vector<double>();
  CHECK(std::abs(mean_of(s) - 3) < 0.01);
  CHECK(std::abs(std::sqrt(variance_of(s)) - 0.5) < 0.01);

  std::vector<double> w = uniform(shape, -2, 6, DType::Float64, Device::cpu(), &gen).to_vector<double>();
  CHECK(std::abs(mean_of(w) - 2) < 0.08);
  CHECK(*std::min_element(w.begin(), w.end()) >= -2);
  CHECK(*std::max_element(w.begin(), w.end()) < 6);

  std::vector<double> b = bernoulli(shape, 0.3, DType::Float32, Device::cpu(), &gen).to_vector<double>();
  CHECK(std::abs(mean_of(b) - 0.3) < 0.01);
  CHECK(std::all_of(b.begin(), b.end(), [](double v) { return v == 0 || v == 1; }));

  Tensor ints = randint(-3, 4, shape, Device::cpu(), &gen);
  CHECK(ints.dtype() == DType::Int64);
  std::vector<int64_t> values = ints.to_vector<int64_t>(), counts(7, 0);
  REQUIRE(std::all_of(values.begin(), values.end(), [](int64_t v) { return v >= -3 && v < 4; }));
  for (int64_t v : values) ++counts[static_cast<size_t>(v + 3)];
  for (int64_t c : counts) CHECK(std::abs(static_cast<double>(c) / 100000 - 1.0 / 7) < 0.01);
}

TEST_CASE("in-place random fills write only their view and refuse bad arguments") {
  Tensor buffer = zeros({4, 6}, DType::Float64);
  Tensor odd_columns = buffer.slice(1, 1, 6, 2);
  uniform_(odd_columns, 1, 2);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 6; ++c) {
      double v = buffer.at<double>({r, c});
      CHECK((c % 2 == 0 ? v == 0 : (v >= 1 && v < 2)));
    }
  // Parameters that require grad are initialised outside autograd, as torch.nn.init does.
  Tensor weight = zeros({3}, DType::Float64).set_requires_grad();
  normal_(weight, 0, 1);
  CHECK(weight.is_leaf());
  CHECK_THROWS_WITH_AS(bernoulli({3}, 1.5), doctest::Contains("bernoulli: p must be in [0, 1], got 1.5"), mf::Error);
  CHECK_THROWS_WITH_AS(randint(3, 3, {2}), doctest::Contains("randint: the range [3, 3) is empty"), mf::Error);
  Tensor ints = zeros({2}, DType::Int64);
  CHECK_THROWS_WITH_AS(normal_(ints, 0, 1), doctest::Contains("normal: needs a floating tensor, got int64"), mf::Error);
}
