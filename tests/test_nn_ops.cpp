// Fused nn ops: hand-worked values, autograd through the public functions, dropout's stream, errors.
// The registry suite already holds every kernel against its naive reference and finite differences.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/reference.h"

#include <bit>
#include <cmath>
#include <limits>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;
using mf::testing::ThreadCountGuard;

namespace {

/// The gradient of sum(out * weights) with respect to x, through autograd.
Tensor grad_of(const Tensor& x, const Tensor& out, const Tensor& weights) {
  return autograd::grad({sum(mul(out, weights))}, {x})[0];
}

}  // namespace

// ---- layer_norm ---------------------------------------------------------------------------------

TEST_CASE("layer_norm of [1, 2, 3] by hand") {
  // mean 2, var ((-1)^2 + 0 + 1^2) / 3 = 2/3, so out = [-1, 0, 1] / sqrt(2/3) = [-1.2247, 0, 1.2247].
  double s = std::sqrt(1.5);
  check_close(layer_norm(f64({1, 2, 3}), {3}, {}, {}, 0.0), f64({-s, 0, s}), 1e-12, 1e-12);
  // weight [2, 1, 1] and bias [0, 0, 10] scale and shift the same normalised values.
  check_close(layer_norm(f64({1, 2, 3}), {3}, f64({2, 1, 1}), f64({0, 0, 10}), 0.0), f64({-2 * s, 0, s + 10}), 1e-12,
              1e-12);
}

TEST_CASE("layer_norm returns the row statistics it normalised with") {
  // Rows [1, 2, 3] and [4, 4, 4]: means 2 and 4, variances 2/3 and 0, rstd = 1/sqrt(var + eps).
  Tensor x = f64({1, 2, 3, 4, 4, 4}, {2, 3});
  std::vector<Tensor> out =
      call<OpId::layer_norm>({x, ones({3}, DType::Float64), zeros({3}, DType::Float64)},
                             {.normalized_shape = {3}, .eps = 0.25});
  check_close(out[1], f64({2, 4}), 1e-12, 1e-12);
  check_close(out[2], f64({1 / std::sqrt(2.0 / 3 + 0.25), 2}), 1e-12, 1e-12);
  // The constant row normalises to 0: (4 - 4) * 2.
  check_close(out[0].select(0, 1), zeros({3}, DType::Float64), 0, 1e-12);
}

TEST_CASE("layer_norm gradients through the public function") {
  Tensor x = reference::randn({4, 6}, 901).set_requires_grad();
  SUBCASE("without affine parameters, sum(out) is 0 whatever x is, so its gradient is 0") {
    check_close(grad_of(x, layer_norm(x, {6}, {}, {}), ones({4, 6}, DType::Float64)), zeros({4, 6}, DType::Float64), 0,
                1e-12);
  }
  SUBCASE("dbias is the column sum of dout, dweight the column sum of dout * xhat") {
    Tensor w = reference::randn({6}, 902).set_requires_grad(), b = reference::randn({6}, 903).set_requires_grad();
    Tensor dout = reference::randn({4, 6}, 904);
    std::vector<Tensor> grads = autograd::grad({sum(mul(layer_norm(x, {6}, w, b), dout))}, {w, b});
    Tensor xhat = layer_norm(x.detach(), {6}, {}, {});
    check_close(grads[0], sum(mul(dout, xhat), {0}), 1e-12, 1e-12);
    check_close(grads[1], sum(dout, {0}), 1e-12, 1e-12);
  }
  SUBCASE("gradcheck over two normalized dims") {
    std::string failure = autograd::gradcheck(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{layer_norm(in[0], {2, 3}, in[1], {})};
        },
        {reference::randn({2, 2, 3}, 905).set_requires_grad(), reference::randn({2, 3}, 906).set_requires_grad()});
    CHECK_MESSAGE(failure.empty(), failure);
  }
}

TEST_CASE("layer_norm keeps float32 accuracy when the mean dwarfs the spread") {
  // x = 1000 + 0.01 z: a float32 ulp at 1000 is 6e-5, so subtracting a rounded mean would cost ~1e-2.
  Tensor x =
      add(mul(reference::randn({3, 16}, 911), scalar_tensor(0.01, DType::Float64)), scalar_tensor(1000, DType::Float64))
          .to(DType::Float32);
  Tensor exact = layer_norm(x.to(DType::Float64), {16}, {}, {});  // same inputs, computed in float64
  check_close(layer_norm(x, {16}, {}, {}), exact.to(DType::Float32), 1e-4, 1e-4);
}

TEST_CASE("layer_norm errors") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, {}, {}),
                       doctest::Contains("input of shape [2, 3] does not end with normalized_shape [4]"), mf::Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {3}, ones({2}), {}), doctest::Contains("weight has shape [2]"), mf::Error);
  CHECK_THROWS_WITH_AS(
      layer_norm(x, {3}, ones({3}, DType::Float64), {}),
      doctest::Contains("layer_norm: weight has shape [3] and dtype float64, expected [3] and float32"), mf::Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {}, {}, {}), doctest::Contains("normalized_shape is empty"), mf::Error);
}

// ---- embedding ----------------------------------------------------------------------------------

TEST_CASE("embedding picks rows, and its gradient counts each id's uses") {
  Tensor weight = f64({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}).set_requires_grad();
  Tensor ids = from_vector<int64_t>({3, 0, 3, 1}, {2, 2});
  Tensor out = embedding(weight, ids);
  check_close(out, f64({30, 31, 0, 1, 30, 31, 10, 11}, {2, 2, 2}), 0, 0);
  // Row 3 is used twice, rows 0 and 1 once, row 2 never.
  check_close(grad_of(weight, out, ones({2, 2, 2}, DType::Float64)), f64({1, 1, 1, 1, 0, 0, 2, 2}, {4, 2}), 0, 0);
}

TEST_CASE("embedding's padding row is looked up but gets no gradient") {
  Tensor weight = reference::randn({4, 3}, 921).set_requires_grad();
  Tensor ids = from_vector<int64_t>({2, 1, 2, 0});
  for (int64_t padding_idx : {2, -2}) {  // -2 counts from the end: row 2 of 4
    CAPTURE(padding_idx);
    Tensor out = embedding(weight, ids, padding_idx);
    check_close(out.select(0, 0), weight.detach().select(0, 2), 0, 0);
    check_close(grad_of(weight, out, ones({4, 3}, DType::Float64)), f64({1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}, {4, 3}),
                0, 0);
  }
}

TEST_CASE("embedding_backward's errors name its parameters") {
  Tensor dout = zeros({3, 2}, DType::Float64), ids = from_vector<int64_t>({1, 0, 1});
  CHECK_THROWS_WITH_AS(call1<OpId::embedding_backward>({dout, ids}, {.num_embeddings = -1}),
                       doctest::Contains("embedding_backward: num_embeddings must be >= 0, got -1"), Error);
  CHECK_THROWS_WITH_AS(call1<OpId::embedding_backward>({dout, ids}, {.num_embeddings = 2, .padding_idx = 2}),
                       doctest::Contains("embedding_backward: padding_idx 2 is out of range for 2 rows"), Error);
}

TEST_CASE("embedding_backward's own gradient skips the padding row") {
  // d/d dout of <G, dweight>: position n receives G[ids[n]], except where ids[n] is the padding row.
  Tensor dout = reference::randn({3, 2}, 931).set_requires_grad();
  Tensor ids = from_vector<int64_t>({1, 0, 1});
  Tensor dweight = call1<OpId::embedding_backward>({dout, ids}, {.num_embeddings = 3, .padding_idx = 0});
  Tensor g = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  check_close(autograd::grad({sum(mul(dweight, g))}, {dout})[0], f64({3, 4, 0, 0, 3, 4}, {3, 2}), 0, 0);
}

TEST_CASE("embedding errors") {
  Tensor weight = zeros({5, 3});
  CHECK_THROWS_WITH_AS(
      embedding(weight, from_vector<int64_t>({1, 7})),
      doctest::Contains("embedding: index 7 (at flat position 1) is out of range for 5 embedding rows"), mf::Error);
  CHECK_THROWS_WITH_AS(embedding(weight, from_vector<int64_t>({-1})), doctest::Contains("index -1"), mf::Error);
  CHECK_THROWS_WITH_AS(embedding(weight, tensor({1, 2})), doctest::Contains("expects int64 indices, got float32"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(embedding(weight, from_vector<int64_t>({1}), 5),
                       doctest::Contains("padding_idx 5 is out of range for weight of shape [5, 3]"), mf::Error);
  CHECK_THROWS_WITH_AS(embedding(zeros({5}), from_vector<int64_t>({1})),
                       doctest::Contains("expects a 2-d weight [V, C], got shape [5]"), mf::Error);
}

// ---- dropout ------------------------------------------------------------------------------------

TEST_CASE("dropout: same seed, same mask; successive calls differ") {
  Tensor x = ones({1000});
  Generator a(42), b(42);
  Tensor first = dropout(x, 0.5, true, &a);
  check_close(dropout(x, 0.5, true, &b), first, 0, 0);
  Tensor second = dropout(x, 0.5, true, &a);
  CHECK(sum(mul(sub(first, second), sub(first, second))).item<double>() > 0);
  CHECK(a.offset() == 2 * 250);  // 1000 elements use 250 Philox blocks per call
}

TEST_CASE("dropout keeps about 1 - p of the elements, scaled by 1 / (1 - p)") {
  double p = 0.3;
  Tensor x = reference::uniform({100000}, 1, 2, 941);
  Generator generator(7);
  Tensor out = dropout(x, p, true, &generator);
  std::vector<double> xs = x.to_vector<double>(), outs = out.to_vector<double>();
  int64_t kept = 0;
  double worst = 0;  // largest relative error of a kept element against x / (1 - p)
  for (size_t i = 0; i < xs.size(); ++i) {
    if (outs[i] == 0) continue;
    ++kept;
    worst = std::max(worst, std::abs(outs[i] * (1 - p) / xs[i] - 1));
  }
  CHECK(worst < 1e-14);
  // The kept fraction has standard deviation sqrt(p (1 - p) / n) = 0.0015.
  CHECK(static_cast<double>(kept) / 1e5 == doctest::Approx(1 - p).epsilon(0.01 / 0.7));
}

TEST_CASE("dropout masks do not depend on the thread count") {
  Tensor x = ones({100000});
  Generator a(3), b(3);
  ThreadCountGuard restore_threads;
  set_num_threads(1);
  Tensor serial = dropout(x, 0.4, true, &a);
  set_num_threads(std::max(restore_threads.saved, 4));
  Tensor parallel = dropout(x, 0.4, true, &b);
  check_close(parallel, serial, 0, 0);
}

TEST_CASE("float32 dropout: x times the reference's scale or 0, to the bit, infinities and NaN included") {
  // The float kernel picks each factor in vectors (the lanes of every ISA, then a scalar tail); the
  // reference draws each element's Philox word by itself. Their products must agree bit for bit:
  // 0 times an infinity or a NaN is NaN, 0 times a negative is -0. 1003 elements: odd tails.
  std::vector<float> values(1003);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 13) * 0.37f - 2.0f;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i : {0, 9, 21, 500, 1002}) values[i] = inf;
  for (size_t i : {1, 10, 22, 501}) values[i] = -inf;
  for (size_t i : {2, 11, 23, 502}) values[i] = nan;
  for (size_t i : {3, 12, 24, 503}) values[i] = -0.0f;
  for (double p : {0.1, 0.5, 0.9}) {
    CAPTURE(p);
    Generator generator(17);
    generator.set_offset(5);  // a counter that is not a multiple of the kernel's batch
    Tensor out = dropout(from_vector<float>(values, {1003}), p, true, &generator);
    std::vector<float> outs = out.to_vector<float>();
    int64_t differing = 0, dropped = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const auto scale = static_cast<float>(reference::dropout_scale(17, 5, p, static_cast<int64_t>(i)));
      dropped += scale == 0;
      differing += std::bit_cast<uint32_t>(outs[i]) != std::bit_cast<uint32_t>(values[i] * scale);
    }
    CHECK(differing == 0);
    CHECK(dropped > 0);
    CHECK(dropped < 1003);
  }
}

TEST_CASE("dropout: identity in eval mode and at p = 0, zeros at p = 1, gradient = mask / (1 - p)") {
  Tensor x = reference::randn({4, 5}, 951).set_requires_grad();
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0, true).is_same(x));
  check_close(dropout(x, 1.0, true), zeros({4, 5}, DType::Float64), 0, 0);

  Generator generator(5);
  Tensor out = dropout(x, 0.25, true, &generator);
  std::vector<double> xs = x.detach().to_vector<double>(), outs = out.detach().to_vector<double>(), expected;
  for (size_t i = 0; i < xs.size(); ++i) expected.push_back(outs[i] == 0 ? 0 : 1 / 0.75);
  check_close(grad_of(x, out, ones({4, 5}, DType::Float64)), f64(expected, {4, 5}), 1e-15, 0);
}

TEST_CASE("dropout errors") {
  CHECK_THROWS_WITH_AS(dropout(ones({3}), 1.5, true),
                       doctest::Contains("dropout: probability p must be in [0, 1], got 1.5"), mf::Error);
  CHECK_THROWS_WITH_AS(dropout(ones({3}), -0.1, false), doctest::Contains("got -0.1"), mf::Error);
  CHECK_THROWS_WITH_AS(dropout(from_vector<int64_t>({1, 2}), 0.5, true),
                       doctest::Contains("expects a float32 or float64 input"), mf::Error);
}

// ---- cross_entropy ------------------------------------------------------------------------------

TEST_CASE("cross_entropy by hand") {
  // logits [0, 0]: p = [1/2, 1/2], so -log p[0] = ln 2.
  check_close(cross_entropy(f64({0, 0}, {1, 2}), from_vector<int64_t>({0}, {1})), f64({std::log(2.0)}, {}), 1e-15, 0);

  // logits [0, ln 3], target 1, e = 0.1: p = [1/4, 3/4], -log p = [ln 4, ln 4 - ln 3].
  // NLL = ln 4 - ln 3; mean_c(-log p_c) = ln 4 - ln(3) / 2;
  // loss = 0.9 (ln 4 - ln 3) + 0.1 (ln 4 - ln(3) / 2) = ln 4 - 0.95 ln 3 = 0.34263.
  // dlogits = softmax - (0.9 onehot + 0.1 / 2) = [1/4 - 0.05, 3/4 - 0.95] = [0.2, -0.2].
  Tensor logits = f64({0, std::log(3.0)}, {1, 2}).set_requires_grad();
  Tensor loss = cross_entropy(logits, from_vector<int64_t>({1}, {1}), -100, 0.1);
  check_close(loss, f64({std::log(4.0) - 0.95 * std::log(3.0)}, {}), 1e-14, 0);
  CHECK(loss.item<double>() == doctest::Approx(0.34263).epsilon(1e-4));
  check_close(autograd::grad({loss}, {logits})[0], f64({0.2, -0.2}, {1, 2}), 1e-14, 1e-15);
}

TEST_CASE("cross_entropy reductions skip ignored targets") {
  // Rows: [0, 0] -> ln 2; [0, ln 3] with target 1 -> ln(4/3); [5, 5] ignored -> 0.
  Tensor logits = f64({0, 0, 0, std::log(3.0), 5, 5}, {3, 2});
  Tensor target = from_vector<int64_t>({0, 1, -100});
  double l0 = std::log(2.0), l1 = std::log(4.0 / 3);
  check_close(cross_entropy(logits, target, -100, 0, Reduction::None), f64({l0, l1, 0}), 1e-15, 0);
  check_close(cross_entropy(logits, target, -100, 0, Reduction::Sum), f64({l0 + l1}, {}), 1e-15, 0);
  // Mean divides by the 2 targets that count, not by 3.
  check_close(cross_entropy(logits, target), f64({(l0 + l1) / 2}, {}), 1e-15, 0);
  // Every target ignored: PyTorch's mean is 0 / 0 = nan.
  Tensor all_ignored = from_vector<int64_t>({-100, -100, -100});
  CHECK(std::isnan(cross_entropy(logits, all_ignored).item<double>()));
  CHECK(cross_entropy(logits, all_ignored, -100, 0, Reduction::Sum).item<double>() == 0);
}

TEST_CASE("cross_entropy flattens leading dims") {
  Tensor logits = reference::randn({2, 3, 5}, 961);
  Tensor target = reference::randint({2, 3}, 5, 962);
  Tensor flat = cross_entropy(logits.reshape({6, 5}), target.reshape({6}), -100, 0.2, Reduction::None);
  Tensor per_element = cross_entropy(logits, target, -100, 0.2, Reduction::None);
  CHECK(per_element.shape() == Shape{2, 3});
  check_close(per_element, flat.reshape({2, 3}), 0, 0);
}

TEST_CASE("cross_entropy gradcheck through the mean, with an ignored target and label smoothing") {
  Tensor target = from_vector<int64_t>({2, 3, -100, 0, 1, 1});
  std::string failure = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{cross_entropy(in[0], target.reshape({2, 3}), -100, 0.1)};
      },
      {reference::randn({2, 3, 4}, 971).set_requires_grad()});
  CHECK_MESSAGE(failure.empty(), failure);
}

TEST_CASE("cross_entropy in float32 agrees with float64 over a wide range of logits") {
  // Float rows take the vectorised polynomial exp; rows of 37 classes cover packs and a scalar tail,
  // and logits 60 apart reach the clamped, underflowing end of exp.
  Tensor logits = reference::uniform({16, 37}, -30, 30, 981), target = reference::randint({16}, 37, 982);
  Tensor dloss = reference::randn({16}, 983);
  CrossEntropyParams params{.label_smoothing = 0.1};
  Tensor dlse = reference::randn({16}, 984);
  std::vector<Tensor> out = call<OpId::cross_entropy>({logits, target}, params);  // loss, lse
  std::vector<Tensor> out32 = call<OpId::cross_entropy>({logits.to(DType::Float32), target}, params);
  check_close(out32[0], out[0].to(DType::Float32), 1e-5, 1e-5);
  check_close(out32[1], out[1].to(DType::Float32), 1e-6, 1e-6);
  Tensor grad = call1<OpId::cross_entropy_backward>({dloss, logits, target, out[1], dlse}, params);
  Tensor grad32 = call1<OpId::cross_entropy_backward>(
      {dloss.to(DType::Float32), logits.to(DType::Float32), target, out32[1], dlse.to(DType::Float32)}, params);
  check_close(grad32, grad.to(DType::Float32), 1e-5, 1e-6);
}

TEST_CASE("cross_entropy errors") {
  Tensor logits = zeros({2, 3});
  CHECK_THROWS_WITH_AS(
      cross_entropy(logits, from_vector<int64_t>({0, 5})),
      doctest::Contains("cross_entropy: target 5 (at position 1) is out of range for 3 classes (valid targets are 0 to "
                        "2, or ignore_index -100)"),
      mf::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, from_vector<int64_t>({0, -1})), doctest::Contains("target -1"), mf::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, tensor({0, 1})), doctest::Contains("expects int64 target, got float32"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(
      cross_entropy(logits, from_vector<int64_t>({0, 1, 2})),
      doctest::Contains("target of shape [3] does not match logits of shape [2, 3] (expected target shape [2])"),
      mf::Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, from_vector<int64_t>({0, 1}), -100, 1.5),
                       doctest::Contains("label_smoothing must be in [0, 1], got 1.5"), mf::Error);
}
