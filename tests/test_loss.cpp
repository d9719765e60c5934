// Losses: hand-worked values (with PyTorch's formulas), reductions, ignore_index, gradients by
// finite differences in float64, the module forms, and the PyTorch reference loss.
#include <doctest/doctest.h>

#include "helpers.h"
#include "reference.h"

#include <cmath>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

namespace {

// Gradients of loss(inputs...) against central differences, in float64.
void check_gradients(const std::function<Tensor(const std::vector<Tensor>&)>& loss, std::vector<Tensor> inputs) {
  for (Tensor& input : inputs) input.set_requires_grad();
  const std::string problem =
      autograd::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{loss(in)}; }, inputs);
  CHECK_MESSAGE(problem.empty(), problem);
}

const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

}  // namespace

TEST_CASE("cross_entropy: hand-worked values with ignore_index, label smoothing and each reduction") {
  // PyTorch: loss_i = (1 - e) (lse_i - x[i, t_i]) + e * mean_c (lse_i - x[i, c]), lse_i = log sum_c exp x[i, c];
  // rows whose target is ignore_index give 0 and are not counted by the mean.
  // Row 0: x = [1, 2, 3], t = 2: (1 - e)(lse - 3) + e (lse - 2). Row 1: x = [0, 0, 0], t = 0: ln 3.
  // Row 2: t = 1 = ignore_index.
  const Tensor logits = f64({1, 2, 3, 0, 0, 0, 5, -5, 0}, {3, 3});
  const Tensor target = from_vector<int64_t>({2, 0, 1}, {3});
  const double e = 0.1, lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double row0 = (1 - e) * (lse - 3) + e * (lse - 2), row1 = std::log(3.0);
  for (Reduction reduction : kReductions) {
    CAPTURE(nn::reduction_name(reduction));
    const nn::CrossEntropyOptions options{.ignore_index = 1, .label_smoothing = e, .reduction = reduction};
    const Tensor expected = reduction == Reduction::None  ? f64({row0, row1, 0}, {3})
                            : reduction == Reduction::Sum ? f64({row0 + row1})
                                                          : f64({(row0 + row1) / 2});
    check_close(nn::cross_entropy(logits, target, options), expected, 1e-14, 0);
    check_close(nn::CrossEntropyLoss(options)(logits, target), expected, 1e-14, 0);
  }
  // Defaults: no ignoring (-100), no smoothing, mean. Equal logits over two classes: ln 2.
  check_close(nn::cross_entropy(f64({0, 0}, {1, 2}), from_vector<int64_t>({1}, {1})), f64({std::log(2.0)}), 1e-15,
              0);
}

TEST_CASE("nll_loss: picks -input[target], skips ignored targets, flattens leading dims") {
  const Tensor log_probs = f64({-1, -2, -3, -0.5, -1.5, -2.5}, {2, 3});
  const Tensor target = from_vector<int64_t>({2, 0}, {2});
  // -input[0, 2] = 3 and -input[1, 0] = 0.5.
  check_close(nn::nll_loss(log_probs, target, {.reduction = Reduction::None}), f64({3, 0.5}, {2}), 0, 0);
  check_close(nn::nll_loss(log_probs, target), f64({1.75}), 1e-15, 0);
  check_close(nn::nll_loss(log_probs, target, {.reduction = Reduction::Sum}), f64({3.5}), 1e-15, 0);
  // Ignoring class 0: row 1 gives 0 and the mean is over row 0 alone.
  check_close(nn::nll_loss(log_probs, target, {.ignore_index = 0, .reduction = Reduction::None}), f64({3, 0}, {2}), 0,
              0);
  check_close(nn::NLLLoss({.ignore_index = 0})(log_probs, target), f64({3}), 1e-15, 0);
  // [2, 1, 3] with targets [2, 1]: the same rows.
  check_close(nn::nll_loss(log_probs.view({2, 1, 3}), target.view({2, 1}), {.reduction = Reduction::None}),
              f64({3, 0.5}, {2, 1}), 0, 0);
  // Every target ignored: 0 / 0, as in PyTorch.
  CHECK(std::isnan(nn::nll_loss(log_probs, full({2}, -100, DType::Int64)).item<double>()));

  SUBCASE("nll_loss of log_softmax is cross_entropy") {
    const Tensor x = randn({4, 5}, DType::Float64);
    const Tensor t = from_vector<int64_t>({0, 4, 2, 7}, {4});
    check_close(nn::nll_loss(log_softmax(x, -1), t, {.ignore_index = 7}),
                nn::cross_entropy(x, t, {.ignore_index = 7}), 1e-12, 0);
  }
  SUBCASE("gradients") {
    check_gradients([&](const auto& in) { return nn::nll_loss(in[0], target, {.ignore_index = 0}); },
                    {randn({2, 3}, DType::Float64)});
  }
  SUBCASE("bad targets are errors naming the op") {
    CHECK_THROWS_WITH_AS(nn::nll_loss(log_probs, target.to(DType::Float64)),
                         doctest::Contains("nll_loss: target must be int64 class indices of shape [2] for input of "
                                           "shape [2, 3], got float64 of shape [2] at test_loss.cpp:"),
                         Error);
    CHECK_THROWS_WITH_AS(nn::nll_loss(log_probs, target.view({1, 2})),
                         doctest::Contains("got int64 of shape [1, 2] at test_loss.cpp:"), Error);
    CHECK_THROWS_WITH_AS(nn::nll_loss(log_probs, from_vector<int64_t>({3, 0}, {2})), doctest::Contains("gather"),
                         Error);
  }
}

TEST_CASE("mse_loss: squared differences, each reduction, gradients") {
  const Tensor input = f64({1, 2, 3}, {3}), target = f64({1, 0, 5}, {3});
  // Differences [0, 2, -2], squares [0, 4, 4].
  check_close(nn::mse_loss(input, target, {.reduction = Reduction::None}), f64({0, 4, 4}, {3}), 0, 0);
  check_close(nn::mse_loss(input, target, {.reduction = Reduction::Sum}), f64({8}), 0, 0);
  check_close(nn::MSELoss()(input, target), f64({8.0 / 3}), 1e-15, 0);

  // d mean((x - y)^2) / dx = 2 (x - y) / 3.
  const Tensor x = input.clone().set_requires_grad();
  nn::mse_loss(x, target).backward();
  check_close(x.grad(), f64({0, 4.0 / 3, -4.0 / 3}, {3}), 1e-15, 0);
  check_gradients([](const auto& in) { return nn::mse_loss(in[0], in[1]); },
                  {randn({2, 3}, DType::Float64), randn({2, 3}, DType::Float64)});

  CHECK_THROWS_WITH_AS(nn::mse_loss(input, f64({1, 2}, {2})),
                       doctest::Contains("mse_loss: target of shape [2] does not match input of shape [3] at "
                                         "test_loss.cpp:"),
                       Error);
}

TEST_CASE("binary_cross_entropy_with_logits: stable at the extremes, exact gradient at 0") {
  // max(x, 0) - x y + log(1 + exp(-|x|)):
  //   x = 0: ln 2 whatever y.    x = 100, y = 1 and x = -100, y = 0: log(1 + e^-100) = 3.7e-44.
  //   x = 100, y = 0 and x = -100, y = 1: 100 + 3.7e-44.
  // Gradient in x: sigmoid(x) - y, so 1/2 - y at 0, and 0, 1, -1, 0 (to 1e-43) at the extremes.
  const std::vector<double> xs = {0, 0, 0, 100, 100, -100, -100};
  const std::vector<double> ys = {0, 1, 0.3, 1, 0, 1, 0};
  const double ln2 = std::log(2.0);
  const Tensor x = f64(xs, {7}).set_requires_grad(), y = f64(ys, {7});
  const Tensor losses = nn::binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::None});
  check_close(losses, f64({ln2, ln2, ln2, 0, 100, 100, 0}, {7}), 1e-15, 1e-12);
  losses.sum().backward();
  check_close(x.grad(), f64({0.5, -0.5, 0.2, 0, 1, -1, 0}, {7}), 1e-15, 1e-12);

  // float32 stays finite too.
  const Tensor loss32 = nn::binary_cross_entropy_with_logits(x.detach().to(DType::Float32), y.to(DType::Float32),
                                                             {.reduction = Reduction::None});
  check_close(loss32.to(DType::Float64), f64({ln2, ln2, ln2, 0, 100, 100, 0}, {7}), 1e-6, 1e-6);

  SUBCASE("matches PyTorch's documented formula, with and without pos_weight") {
    // l = -[p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], p = 1 without pos_weight; the
    // positive weight p is per class (last dim).
    const Tensor xr = randn({4, 3}, DType::Float64), yr = rand({4, 3}, DType::Float64);
    const std::vector<double> pos_weight = {0.5, 2, 3};
    for (bool weighted : {false, true}) {
      CAPTURE(weighted);
      std::vector<double> expected;
      double total = 0;
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t c = 0; c < 3; ++c) {
          const double xv = xr.at<double>({i, c}), yv = yr.at<double>({i, c}), s = 1 / (1 + std::exp(-xv));
          const double p = weighted ? pos_weight[c] : 1;
          expected.push_back(-(p * yv * std::log(s) + (1 - yv) * std::log(1 - s)));
          total += expected.back();
        }
      nn::BCEWithLogitsOptions options{.pos_weight = weighted ? f64(pos_weight, {3}) : Tensor()};
      options.reduction = Reduction::None;
      check_close(nn::binary_cross_entropy_with_logits(xr, yr, options), f64(expected, {4, 3}), 1e-12, 1e-14);
      options.reduction = Reduction::Mean;
      check_close(nn::BCEWithLogitsLoss(options)(xr, yr), f64({total / 12}), 1e-12, 0);
    }
    // Hand-worked: x = 0, y = 1, p = 3 gives 3 ln 2.
    check_close(nn::binary_cross_entropy_with_logits(f64({0}), f64({1}), {.pos_weight = f64({3})}), f64({3 * ln2}),
                1e-15, 0);
  }
  SUBCASE("gradients in input, target and pos_weight, with zeros among the logits") {
    Tensor logits = randn({3, 4}, DType::Float64);
    logits.select(0, 1).zero_();
    check_gradients(
        [](const auto& in) {
          return nn::binary_cross_entropy_with_logits(in[0], in[1], {.pos_weight = in[2], .reduction = Reduction::Sum});
        },
        {logits, rand({3, 4}, DType::Float64), uniform({4}, 0.5, 2, DType::Float64)});
  }
  SUBCASE("mismatched shapes and integer targets are errors naming the op") {
    CHECK_THROWS_WITH_AS(nn::binary_cross_entropy_with_logits(f64({0, 1}, {2}), f64({0}, {1})),
                         doctest::Contains("binary_cross_entropy_with_logits: target of shape [1] does not match "
                                           "input of shape [2] at test_loss.cpp:"),
                         Error);
    CHECK_THROWS_WITH_AS(nn::binary_cross_entropy_with_logits(f64({0, 1}, {2}), from_vector<int64_t>({0, 1}, {2})),
                         doctest::Contains("binary_cross_entropy_with_logits: target must be a float32 or float64 "
                                           "tensor, got int64 of shape [2] at test_loss.cpp:"),
                         Error);
  }
}

TEST_CASE("loss modules hold their options, print them, and keep pos_weight as a buffer") {
  nn::CrossEntropyLossImpl criterion({.ignore_index = 0, .label_smoothing = 0.1});
  CHECK(criterion.to_string() == "CrossEntropyLoss(ignore_index=0, label_smoothing=0.1, reduction=mean)");
  CHECK(nn::NLLLoss({.reduction = Reduction::Sum})->to_string() == "NLLLoss(ignore_index=-100, reduction=sum)");
  CHECK(nn::MSELoss()->to_string() == "MSELoss(reduction=mean)");
  CHECK(nn::BCEWithLogitsLoss()->named_buffers().empty());
  CHECK_THROWS_WITH_AS(criterion.forward(zeros({2, 3})),
                       "CrossEntropyLoss: this module has no single-input forward (call its own forward overload)",
                       Error);

  nn::BCEWithLogitsLossImpl weighted({.pos_weight = from_vector<float>({1, 2, 3}, {3})});
  CHECK(weighted.to_string() == "BCEWithLogitsLoss(pos_weight=[3], reduction=mean)");
  REQUIRE(weighted.named_buffers().size() == 1);
  CHECK(weighted.named_buffers()[0].name == "pos_weight");
  weighted.to(DType::Float64);  // the option sees the move
  CHECK(weighted.options().pos_weight.dtype() == DType::Float64);
  // x = 0, y = 1 in every class: p ln 2, mean over [1, 2, 3] = 2 ln 2.
  check_close(weighted(zeros({1, 3}, DType::Float64), ones({1, 3}, DType::Float64)), f64({2 * std::log(2.0)}), 1e-15,
              0);
}

TEST_CASE("cross-entropy of the PyTorch reference logits matches PyTorch's loss") {
  // torch.nn.functional.cross_entropy(logits.view(-1, 13), tgt_out.view(-1), ignore_index=0,
  // label_smoothing=0.1), in float64 (reference/generate.py).
  using testing::reference;
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    const Tensor logits = reference("expected.logits").to(device);  // [3, 6, 13]
    const Tensor target = reference("input.tgt_out").to(device);    // [3, 6]
    REQUIRE(logits.shape() == Shape{3, 6, 13});
    check_close(nn::cross_entropy(logits, target, {.ignore_index = 0, .label_smoothing = 0.1}),
                reference("expected.loss"), 1e-10, 0);
    check_close(nn::CrossEntropyLoss({.ignore_index = 0})(logits, target),
                reference("expected.loss_no_smoothing"), 1e-10, 0);
    check_close(nn::nll_loss(log_softmax(logits, -1), target, {.ignore_index = 0}),
                reference("expected.loss_no_smoothing"), 1e-10, 0);
  }
}
