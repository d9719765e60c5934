// nn::init and the basic layers: Linear, Embedding, LayerNorm, Dropout, ReLU, GELU.
#include <doctest/doctest.h>

#include "helpers.h"

#include <algorithm>
#include <cmath>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;
using mf::testing::ThreadCountGuard;

namespace {

/// Sample mean, standard deviation and largest magnitude of a tensor's elements.
struct Stats {
  double mean = 0, std = 0, max_abs = 0;
};

Stats stats(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  Stats s;
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  for (double x : v) {
    s.std += (x - s.mean) * (x - s.mean) / static_cast<double>(v.size() - 1);
    s.max_abs = std::max(s.max_abs, std::abs(x));
  }
  s.std = std::sqrt(s.std);
  return s;
}

/// U(-b, b) has standard deviation b / sqrt(3). With tens of thousands of samples the sample std is
/// within 1% of that and the largest draw within 1% of b; a wrong formula (a fan swapped, a missing
/// sqrt(3)) is off by far more.
void check_uniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  CHECK(s.max_abs <= bound);
  CHECK(s.max_abs >= 0.99 * bound);
  CHECK(s.std == doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.02));
  CHECK(std::abs(s.mean) < 0.02 * bound);
}

void check_normal(const Tensor& t, double std) {
  Stats s = stats(t);
  CHECK(s.std == doctest::Approx(std).epsilon(0.02));
  CHECK(std::abs(s.mean) < 0.02 * std);
}

/// Gradcheck of `module`'s forward on `input` with respect to every parameter, in float64.
void gradcheck_parameters(nn::Module& module, const Tensor& input) {
  module.to(DType::Float64);
  std::string result = autograd::gradcheck(
      [&](const std::vector<Tensor>&) { return std::vector<Tensor>{module.forward(input)}; }, module.parameters());
  CHECK_MESSAGE(result.empty(), result);
}

}  // namespace

// ---- init ---------------------------------------------------------------------------------------

TEST_CASE("calculate_gain follows torch.nn.init.calculate_gain") {
  using nn::init::Nonlinearity;
  CHECK(nn::init::calculate_gain(Nonlinearity::Linear) == 1.0);
  CHECK(nn::init::calculate_gain(Nonlinearity::Sigmoid) == 1.0);
  CHECK(nn::init::calculate_gain(Nonlinearity::Tanh) == doctest::Approx(5.0 / 3.0));
  CHECK(nn::init::calculate_gain(Nonlinearity::ReLU) == doctest::Approx(1.4142135623730951));
  CHECK(nn::init::calculate_gain(Nonlinearity::SELU) == 0.75);
  // leaky_relu: sqrt(2 / (1 + slope^2)); the default slope 0.01 gives sqrt(2 / 1.0001) = 1.41414284...
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyReLU) == doctest::Approx(1.4141428569978354));
  // a = sqrt(5) (Linear's choice): sqrt(2 / 6) = 1 / sqrt(3).
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyReLU, std::sqrt(5.0)) == doctest::Approx(1 / std::sqrt(3.0)));
}

TEST_CASE("fans of linear and conv-like weights") {
  // [out, in]: fan_in = in, fan_out = out.
  CHECK(nn::init::calculate_fan_in_and_fan_out(zeros({3, 5})) == std::pair<int64_t, int64_t>{5, 3});
  // [o, i, k, k] = [4, 2, 3, 3]: the 3x3 receptive field multiplies both: fan_in 2*9, fan_out 4*9.
  CHECK(nn::init::calculate_fan_in_and_fan_out(zeros({4, 2, 3, 3})) == std::pair<int64_t, int64_t>{18, 36});
  CHECK_THROWS_WITH_AS(nn::init::calculate_fan_in_and_fan_out(zeros({7})),
                       "calculate_fan_in_and_fan_out: fans need a tensor of at least 2 dims ([out, in, ...]), got [7]",
                       Error);
}

TEST_CASE("xavier bounds and spreads") {
  // fan_in 300, fan_out 200: bound = gain * sqrt(6 / 500), std = gain * sqrt(2 / 500).
  Tensor w = Tensor::empty({200, 300}, DType::Float64);
  nn::init::xavier_uniform_(w);
  check_uniform(w, std::sqrt(6.0 / 500.0));
  nn::init::xavier_uniform_(w, 2.0);
  check_uniform(w, 2.0 * std::sqrt(6.0 / 500.0));
  nn::init::xavier_normal_(w, 0.5);
  check_normal(w, 0.5 * std::sqrt(2.0 / 500.0));
}

TEST_CASE("kaiming bounds and spreads") {
  using nn::init::FanMode;
  using nn::init::Nonlinearity;
  Tensor w = Tensor::empty({64, 400}, DType::Float64);
  // Linear's default: a = sqrt(5), fan_in: bound = sqrt(3) * (1 / sqrt(3)) / sqrt(400) = 1/20.
  nn::init::kaiming_uniform_(w, std::sqrt(5.0));
  check_uniform(w, 1.0 / 20.0);
  // relu, fan_out = 64: bound = sqrt(3) * sqrt(2) / 8.
  nn::init::kaiming_uniform_(w, 0.0, FanMode::FanOut, Nonlinearity::ReLU);
  check_uniform(w, std::sqrt(6.0) / 8.0);
  // conv weight [32, 16, 3, 3], relu, fan_out = 32 * 9: std = sqrt(2) / sqrt(288) = 1/12.
  Tensor conv = Tensor::empty({32, 16, 3, 3}, DType::Float64);
  nn::init::kaiming_normal_(conv, 0.0, FanMode::FanOut, Nonlinearity::ReLU);
  check_normal(conv, 1.0 / 12.0);
  // Zero-element tensors are left alone, as in PyTorch.
  Tensor none = Tensor::empty({0, 3});
  CHECK_NOTHROW(nn::init::kaiming_uniform_(none));
}

TEST_CASE("init works in place on parameters and replays from a generator") {
  Tensor p = zeros({3, 4}).set_requires_grad();
  nn::init::ones_(p);
  check_close(p, ones({3, 4}), 0, 0);
  nn::init::constant_(p, 2.5);
  check_close(p, full({3, 4}, 2.5), 0, 0);
  nn::init::zeros_(p);
  check_close(p, zeros({3, 4}), 0, 0);
  CHECK(p.requires_grad());

  Generator a(7), b(7), c(8);
  Tensor x = zeros({5}), y = zeros({5}), z = zeros({5});
  nn::init::normal_(x, 0, 1, &a);
  nn::init::normal_(y, 0, 1, &b);
  nn::init::normal_(z, 0, 1, &c);
  check_close(x, y, 0, 0);
  CHECK(x.to_vector<double>() != z.to_vector<double>());
  nn::init::uniform_(p, -1, 1, &a);
  for (double v : p.to_vector<double>()) CHECK((v >= -1 && v < 1));
}

TEST_CASE("under SkipInitGuard layers start at zero and the generator is left where it was") {
  Generator used(11), untouched(11);
  {
    nn::init::SkipInitGuard outer;
    {
      nn::init::SkipInitGuard nested;
    }  // ending the nested guard leaves the outer one's state: still skipping
    nn::Linear linear(nn::LinearOptions{.in_features = 6, .out_features = 4});  // kaiming_uniform_ and uniform_
    nn::Embedding embedding(nn::EmbeddingOptions{.num_embeddings = 5, .embedding_dim = 3});  // normal_
    check_close(linear->weight, zeros({4, 6}), 0, 0);
    check_close(linear->bias, zeros({4}), 0, 0);
    check_close(embedding->weight, zeros({5, 3}), 0, 0);
    Tensor drawn = full({2, 4}, 3.0);
    nn::init::xavier_normal_(drawn, 1.0, &used);
    check_close(drawn, zeros({2, 4}), 0, 0);
  }
  // The skipped draw did not advance `used`: it gives what a fresh generator of its seed gives. Past
  // the guard, layers draw again.
  Tensor a = zeros({16}), b = zeros({16});
  nn::init::normal_(a, 0, 1, &used);
  nn::init::normal_(b, 0, 1, &untouched);
  check_close(a, b, 0, 0);
  nn::Linear drawn_again(nn::LinearOptions{.in_features = 256, .out_features = 256});
  check_uniform(drawn_again->weight, 1.0 / 16.0);
}

// ---- Linear -------------------------------------------------------------------------------------

TEST_CASE("Linear computes x W^T + b") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    nn::LinearImpl layer({.in_features = 3, .out_features = 2});
    {
      NoGradGuard no_grad;
      layer.weight.copy_(tensor({1, 2, 3, 4, 5, 6}).view({2, 3}));
      layer.bias.copy_(tensor({0.5, -1}));
    }
    layer.to(device);
    // [1, 0, -1] -> [1 - 3 + 0.5, 4 - 6 - 1] = [-1.5, -3]; [2, 1, 0] -> [2 + 2 + 0.5, 8 + 5 - 1] = [4.5, 12].
    Tensor x = tensor({1, 0, -1, 2, 1, 0}).view({2, 1, 3}).to(device);
    check_close(layer.forward(x), tensor({-1.5, -3, 4.5, 12}).view({2, 1, 2}), 0, 0);

    nn::LinearImpl no_bias({.in_features = 3, .out_features = 2, .bias = false});
    CHECK_FALSE(no_bias.bias.defined());
    CHECK(no_bias.named_parameters().size() == 1);
    no_bias.to(device);
    {
      NoGradGuard no_grad;
      no_bias.weight.copy_(layer.weight);
    }
    check_close(no_bias.forward(x), tensor({-2, -2, 4, 13}).view({2, 1, 2}), 0, 0);
  }
}

TEST_CASE("Linear's default initialisation, names and printing") {
  manual_seed(1);
  nn::LinearImpl layer({.in_features = 400, .out_features = 100});
  CHECK(layer.weight.shape() == Shape{100, 400});
  CHECK(layer.bias.shape() == Shape{100});
  check_uniform(layer.weight, 1.0 / 20.0);  // U(-1/sqrt(in), 1/sqrt(in))
  for (double v : layer.bias.to_vector<double>()) CHECK(std::abs(v) <= 1.0 / 20.0);
  CHECK(stats(layer.bias).max_abs > 0.9 / 20.0);
  auto params = layer.named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].name == "weight");
  CHECK(params[1].name == "bias");
  CHECK(nn::Linear({.in_features = 4, .out_features = 2})->to_string() ==
        "Linear(in_features=4, out_features=2, bias=True)");
  CHECK(nn::Linear({.in_features = 4, .out_features = 2, .bias = false})->extra_repr() ==
        "in_features=4, out_features=2, bias=False");
}

TEST_CASE("Linear rejects inputs of the wrong width") {
  nn::LinearImpl layer({.in_features = 3, .out_features = 2});
  CHECK_THROWS_WITH_AS(layer.forward(zeros({5, 4})),
                       doctest::Contains(
                           "linear: input [5, 4] has 4 features in its last dim, but weight [2, 3] expects 3"),
                       Error);
}

TEST_CASE("Linear gradcheck over weight and bias") {
  nn::LinearImpl layer({.in_features = 3, .out_features = 4});
  gradcheck_parameters(layer, randn({2, 5, 3}, DType::Float64));
}

// ---- Embedding ----------------------------------------------------------------------------------

struct LinearCase {
  Shape x;       // the input's shape
  int64_t out;   // output features
};

/// check(x, weight, bias, upstream) on random operands of each case, on 1 and 2 threads: the kernel
/// paths of the fused linear ops (few rows, one GEMM or two side by side in backward).
template <typename Check>
void for_each_linear_case(std::initializer_list<LinearCase> cases, Check check) {
  ThreadCountGuard restore_threads;
  for (int count : {1, 2})
    for (const LinearCase& c : cases) {
      set_num_threads(count);
      CAPTURE(count);
      CAPTURE(shape_str(c.x));
      Shape out_shape = c.x;
      out_shape.back() = c.out;
      Tensor x = randn(c.x), weight = randn({c.out, c.x.back()}), bias = randn({c.out});
      check(x, weight, bias, randn(out_shape));
    }
}

/// The output, then the gradients of x, weight and bias, of sum(f(x, weight, bias) * upstream).
template <typename F>
std::vector<Tensor> output_and_grads(F f, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     const Tensor& upstream) {
  Tensor xs = x.clone().set_requires_grad(), ws = weight.clone().set_requires_grad();
  Tensor bs = bias.clone().set_requires_grad();
  Tensor y = f(xs, ws, bs);
  (y * upstream).sum().backward();
  return {y, xs.grad(), ws.grad(), bs.grad()};
}

TEST_CASE("the fused linear op equals matmul + bias, forward and backward, on every kernel path") {
  // The fused op starts C as the bias and lets the GEMM add x W^T (beta = 1); few rows take the
  // skinny kernel and add the bias after; on two threads the backward runs dx (then the bias's
  // gradient) and dW side by side.
  // Each must give what the unfused composition x @ W^T + b gives, within float32 rounding.
  for_each_linear_case({{{3, 5}, 4}, {{2, 40, 64}, 48}, {{300, 256}, 320}, {{4, 0}, 3}},
                       [](const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& upstream) {
    std::vector<Tensor> fused = output_and_grads(
        [](const Tensor& a, const Tensor& w, const Tensor& b) { return nn::linear(a, w, b); }, x, weight, bias,
        upstream);
    std::vector<Tensor> plain = output_and_grads(
        [](const Tensor& a, const Tensor& w, const Tensor& b) { return matmul(a, w.t()) + b; }, x, weight, bias,
        upstream);
    check_close(fused[0], plain[0], 1e-5, 1e-5);
    for (size_t i = 1; i < 4; ++i) check_close(fused[i], plain[i], 1e-5, 1e-4);
    // The bias's gradient is upstream's column sums, summed as the sum op sums them, whichever
    // thread computes them (beside dx, on two threads): bit for bit what broadcasting gives.
    CHECK(fused[3].to_vector<float>() == plain[3].to_vector<float>());
  });
}

TEST_CASE("linear_relu equals relu(linear(x)), bit for bit, forward and backward, on every kernel path") {
  // The ReLU rides in the GEMM's epilogue, after the last block of k (600 > 512 spans two), or in
  // the bias pass of the few-rows kernel; the backward masks by the saved output as relu does and
  // then runs linear's backward. Same arithmetic in the same order: the same bits, on 1 and 2
  // threads. Half the outputs are negative (zero mean), so the mask matters.
  for_each_linear_case({{{3, 5}, 4}, {{2, 40, 64}, 48}, {{300, 256}, 320}, {{200, 600}, 64}},
                       [](const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& upstream) {
    std::vector<Tensor> fused = output_and_grads(
        [](const Tensor& a, const Tensor& w, const Tensor& b) { return linear_relu(a, w, b); }, x, weight, bias,
        upstream);
    std::vector<Tensor> plain = output_and_grads(
        [](const Tensor& a, const Tensor& w, const Tensor& b) { return relu(nn::linear(a, w, b)); }, x, weight,
        bias, upstream);
    for (size_t i = 0; i < 4; ++i) {
      CAPTURE(i);  // output, then the gradients of x, weight and bias
      CHECK(fused[i].to_vector<float>() == plain[i].to_vector<float>());
    }
  });
}

TEST_CASE("Embedding looks rows up; the padding row is zero and gets no gradient") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    nn::EmbeddingImpl table({.num_embeddings = 4, .embedding_dim = 3, .padding_idx = 0});
    check_close(table.weight.select(0, 0), zeros({3}), 0, 0);
    {
      NoGradGuard no_grad;
      table.weight.copy_(arange(0, 12, 1, DType::Float32).view({4, 3}));
    }
    table.to(device);
    Tensor ids = from_vector<int64_t>({1, 3, 0, 1}, {2, 2}).to(device);
    // Row r of arange(12).view(4, 3) is [3r, 3r + 1, 3r + 2].
    check_close(table.forward(ids), tensor({3, 4, 5, 9, 10, 11, 0, 1, 2, 3, 4, 5}).view({2, 2, 3}), 0, 0);
    table.forward(ids).sum().backward();
    // Row 1 is used twice, row 3 once, row 0 is padding, row 2 unused.
    check_close(table.weight.grad(), tensor({0, 0, 0, 2, 2, 2, 0, 0, 0, 1, 1, 1}).view({4, 3}), 0, 0);
    CHECK(table.extra_repr() == "4, 3, padding_idx=0");
  }
}

TEST_CASE("an embedding adds its rows into a tied weight's gradient in place, as the plain sum would") {
  // W is looked up twice (repeated ids, a padding row) and multiplied as an output projection: the
  // later lookups in backward add their rows straight into W's .grad. The result must be the sum of
  // the three gradients worked out apart (float64: the lookups' rows of u summed by hand, the
  // projection's x^T-weighted rows), and bit for bit what anomaly mode gives, which sums tables.
  Tensor weight = randn({6, 4});
  Tensor ids1 = from_vector<int64_t>({1, 3, 1, 0, 5}, {5}), ids2 = from_vector<int64_t>({3, 3, 2}, {3});
  Tensor x = randn({2, 4}), u1 = randn({5, 4}), u2 = randn({2, 6}), u3 = randn({3, 4});
  auto gradient = [&] {
    Tensor w = weight.clone().set_requires_grad();
    Tensor loss = (embedding(w, ids1, 0) * u1).sum() + (matmul(x, w.t()) * u2).sum() +
                  (embedding(w, ids2, 0) * u3).sum();
    loss.backward();
    return w.grad().to_vector<float>();
  };
  std::vector<float> in_place = gradient(), summed_apart;
  {
    autograd::DetectAnomalyGuard sums_off;
    summed_apart = gradient();
  }
  CHECK(in_place == summed_apart);
  std::vector<double> expected(24, 0.0);
  auto add_rows = [&](const Tensor& ids, const Tensor& u) {
    for (int64_t n = 0; n < ids.numel(); ++n)
      if (int64_t row = ids.data_ptr<int64_t>()[n]; row != 0)  // row 0 is padding
        for (int64_t c = 0; c < 4; ++c) expected[static_cast<size_t>(row * 4 + c)] += u.at<double>({n, c});
  };
  add_rows(ids1, u1);
  add_rows(ids2, u3);
  for (int64_t r = 0; r < 6; ++r)  // d/dW of sum(u2 * x W^T) = u2^T x
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t i = 0; i < 2; ++i)
        expected[static_cast<size_t>(r * 4 + c)] += u2.at<double>({i, r}) * x.at<double>({i, c});
  for (size_t i = 0; i < expected.size(); ++i) CHECK(in_place[i] == doctest::Approx(expected[i]).epsilon(1e-5));
}

TEST_CASE("Embedding initialises N(0, 1) and resolves a negative padding_idx") {
  manual_seed(2);
  nn::EmbeddingImpl big({.num_embeddings = 1000, .embedding_dim = 50});
  check_normal(big.weight, 1.0);
  CHECK(big.extra_repr() == "1000, 50");
  nn::EmbeddingImpl last({.num_embeddings = 5, .embedding_dim = 2, .padding_idx = -1});
  CHECK(*last.options().padding_idx == 4);
  check_close(last.weight.select(0, 4), zeros({2}), 0, 0);
  CHECK_THROWS_WITH_AS(nn::Embedding({.num_embeddings = 5, .embedding_dim = 2, .padding_idx = 5}),
                       "Embedding: padding_idx 5 is out of range for 5 embeddings", Error);
}

TEST_CASE("Embedding gradcheck over weight") {
  nn::EmbeddingImpl table({.num_embeddings = 5, .embedding_dim = 3, .padding_idx = 2});
  // The padding row is left out of the input: it is read by forward but, by design, gets no gradient.
  gradcheck_parameters(table, from_vector<int64_t>({0, 3, 4, 4, 1, 0}, {2, 3}));
}

// ---- LayerNorm ----------------------------------------------------------------------------------

TEST_CASE("LayerNorm of [1, 2, 3]") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    nn::LayerNormImpl norm({.normalized_shape = {3}});
    check_close(norm.weight, ones({3}), 0, 0);
    check_close(norm.bias, zeros({3}), 0, 0);
    norm.to(DType::Float64);
    norm.to(device);
    // mean 2, biased variance (1 + 0 + 1) / 3 = 2/3, so the output is (x - 2) / sqrt(2/3 + 1e-5).
    double s = 1.0 / std::sqrt(2.0 / 3.0 + 1e-5);
    check_close(norm.forward(f64({1, 2, 3}).to(device)), f64({-s, 0, s}), 1e-14, 1e-14);
    {
      NoGradGuard no_grad;
      norm.weight.copy_(f64({2, 1, 0.5}).to(device));
      norm.bias.copy_(f64({0, 1, -1}).to(device));
    }
    // [7, 6, 5] has the same spread about its mean 6, mirrored: [s, 0, -s] before the affine step.
    check_close(norm.forward(f64({1, 2, 3, 7, 6, 5}, {2, 3}).to(device)),
                f64({-2 * s, 1, 0.5 * s - 1, 2 * s, 1, -0.5 * s - 1}, {2, 3}), 1e-14, 1e-14);
    CHECK(norm.extra_repr() == "(3,), eps=1e-05, elementwise_affine=True");
  }
}

TEST_CASE("LayerNorm without affine parameters, over two dims") {
  nn::LayerNormImpl norm({.normalized_shape = {2, 2}, .eps = 0.0, .elementwise_affine = false});
  CHECK(norm.parameters().empty());
  CHECK(norm.extra_repr() == "(2, 2), eps=0, elementwise_affine=False");
  // [0, 2, 4, 6]: mean 3, variance (9 + 1 + 1 + 9) / 4 = 5.
  double r = 1.0 / std::sqrt(5.0);
  check_close(norm.forward(tensor({0, 2, 4, 6}).view({1, 2, 2})),
              tensor({-3 * r, -r, r, 3 * r}).view({1, 2, 2}), 1e-6, 1e-6);
}

TEST_CASE("LayerNorm gradcheck over weight and bias") {
  nn::LayerNormImpl norm({.normalized_shape = {4}});
  {
    NoGradGuard no_grad;
    norm.weight.copy_(uniform({4}, 0.5, 1.5));
    norm.bias.copy_(uniform({4}, -1, 1));
  }
  gradcheck_parameters(norm, randn({3, 4}, DType::Float64));
}

// ---- Dropout and activations --------------------------------------------------------------------

TEST_CASE("Dropout drops in training and is the identity in eval") {
  manual_seed(3);
  nn::DropoutImpl drop({.p = 0.25});
  Tensor x = ones({20000});
  std::vector<double> y = drop.forward(x).to_vector<double>();
  size_t dropped = 0, other = 0;
  for (double v : y) {
    dropped += v == 0;
    other += v != 0 && std::abs(v - 1 / 0.75) > 1e-6;  // kept elements are scaled by 1 / (1 - p)
  }
  CHECK(other == 0);
  // 20000 Bernoulli(0.25) draws: 5000 expected, standard deviation ~61.
  CHECK(dropped > 4700);
  CHECK(dropped < 5300);
  drop.eval();
  check_close(drop.forward(x), x, 0, 0);
  CHECK(drop.to_string() == "Dropout(p=0.25)");
  CHECK_THROWS_WITH_AS(nn::Dropout({.p = 1.5}), "Dropout: probability has to be between 0 and 1, but got 1.5", Error);
}

TEST_CASE("ReLU and GELU modules") {
  nn::ReLUImpl relu_module;
  nn::GELUImpl gelu_module;
  Tensor x = f64({-1, 0, 2});
  check_close(relu_module.forward(x), f64({0, 0, 2}), 0, 0);
  // x * Phi(x): Phi(-1) = 0.158655253931457, Phi(2) = 0.977249868051821.
  check_close(gelu_module.forward(x), f64({-0.158655253931457, 0, 2 * 0.977249868051821}), 1e-12, 1e-12);
  CHECK(relu_module.to_string() == "ReLU()");
  CHECK(gelu_module.to_string() == "GELU(approximate='none')");
}
