// Reductions and softmax: hand-worked values, ties, stability, masking, gradients and error messages.
// The registry suite already holds every sample against a naive reference and finite differences.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/reference.h"

#include <cmath>
#include <limits>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor i64(const std::vector<int64_t>& values, const Shape& shape = {}) { return from_vector(values, shape); }

}  // namespace

TEST_CASE("mean: values and gradient 1 / count") {
  Tensor x = f64({1, 2, 3, 4}, {2, 2}).set_requires_grad();
  check_close(x.mean(), f64({2.5}, {}), 0, 1e-15);
  check_close(x.mean({0}), f64({2, 3}), 0, 1e-15);  // columns (1+3)/2, (2+4)/2
  check_close(mean(x, {1}, true), f64({1.5, 3.5}, {2, 1}), 0, 1e-15);
  x.mean({0}).sum().backward();  // every element reaches one mean over 2 rows
  check_close(x.grad(), f64({0.5, 0.5, 0.5, 0.5}, {2, 2}), 0, 1e-15);
}

TEST_CASE("mean of no elements is NaN, their sum 0 (as PyTorch)") {
  Tensor empty = Tensor::empty({0, 3}, DType::Float64);
  CHECK(std::isnan(empty.mean().item<double>()));
  check_close(empty.sum({0}), f64({0, 0, 0}), 0, 0);
}

TEST_CASE("var: Bessel's correction and the gradient") {
  // mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5: 5 / 3 with correction 1, 5 / 4 with 0.
  Tensor x = f64({1, 2, 3, 4}).set_requires_grad();
  check_close(x.var(), f64({5.0 / 3}, {}), 1e-15, 0);
  check_close(var(x, {}, 0), f64({1.25}, {}), 1e-15, 0);
  check_close(var(x, {0}, 2, true), f64({2.5}, {1}), 1e-15, 0);
  // d var / dx_i = 2 (x_i - 2.5) / 3 = -1, -1/3, 1/3, 1.
  x.var().backward();
  check_close(x.grad(), f64({-1, -1.0 / 3, 1.0 / 3, 1}), 1e-15, 1e-15);
}

TEST_CASE("var stays accurate under a large offset in float32") {
  // 1e4 + {0, 1, 2, 3}: exact in float32; one-pass sum-of-squares would lose every digit to the 1e8 squares.
  Tensor x = from_vector(std::vector<float>{10000, 10001, 10002, 10003});
  CHECK(x.var().item<double>() == doctest::Approx(5.0 / 3).epsilon(1e-6));
}

TEST_CASE("var along a dim of a matrix, keepdim") {
  // rows [1, 3] and [2, 6]: variances (1 + 1) / 1 = 2 and (4 + 4) / 1 = 8.
  check_close(f64({1, 3, 2, 6}, {2, 2}).var({1}, 1, true), f64({2, 8}, {2, 1}), 1e-15, 0);
}

TEST_CASE("max and min over all elements, amax / amin over dims") {
  Tensor x = f64({1, 7, -3, 4, 0, 2}, {2, 3});
  check_close(x.max(), f64({7}, {}), 0, 0);
  check_close(x.min(), f64({-3}, {}), 0, 0);
  check_close(amax(x, {0}), f64({4, 7, 2}), 0, 0);
  check_close(amin(x, {1}, true), f64({-3, 0}, {2, 1}), 0, 0);
  check_close(amax(i64({5, -2, 9}, {3}), {}), i64({9}, {}), 0, 0);
}

TEST_CASE("amax / amin propagate NaN") {
  Tensor x = f64({1, std::nan(""), 3});
  CHECK(std::isnan(x.max().item<double>()));
  CHECK(std::isnan(x.min().item<double>()));
  // Down columns too: [[1, NaN], [NaN, 2], [3, 1]].
  Tensor columns = f64({1, std::nan(""), std::nan(""), 2, 3, 1}, {3, 2});
  std::vector<double> maxes = amax(columns, {0}).to_vector<double>();
  CHECK((std::isnan(maxes[0]) && std::isnan(maxes[1])));
  check_close(columns.argmax(0), i64({1, 0}), 0, 0);  // the first NaN of each column
  check_close(std::get<1>(columns.min(0)), i64({1, 0}), 0, 0);
}

TEST_CASE("max(dim) / min(dim): values, first index among ties") {
  Tensor x = f64({1, 3, 3, 2, 2, 0}, {2, 3});
  auto [max_values, max_indices] = x.max(1);
  check_close(max_values, f64({3, 2}), 0, 0);
  check_close(max_indices, i64({1, 0}), 0, 0);  // 3 at 1 and 2; 2 at 0 and 1: first wins
  auto [min_values, min_indices] = f64({1, 3, 1, 2, 0, 0}, {2, 3}).min(1, true);
  check_close(min_values, f64({1, 0}, {2, 1}), 0, 0);
  check_close(min_indices, i64({0, 1}, {2, 1}), 0, 0);
  auto [column_max, column_argmax] = x.max(0);  // columns [1, 2], [3, 2], [3, 0]
  check_close(column_max, f64({2, 3, 3}), 0, 0);
  check_close(column_argmax, i64({1, 0, 0}), 0, 0);
}

TEST_CASE("argmax: int64 indices, keepdim, ties and NaN") {
  Tensor x = f64({0, 5, 5, 9, 1, 9}, {2, 3});
  check_close(x.argmax(1), i64({1, 0}), 0, 0);
  check_close(x.argmax(-1, true), i64({1, 0}, {2, 1}), 0, 0);
  check_close(x.argmax(0), i64({1, 0, 1}), 0, 0);
  check_close(f64({1, std::nan(""), 3}).argmax(0), i64({1}, {}), 0, 0);  // NaN counts as the largest
  CHECK_FALSE(x.set_requires_grad().argmax(1).requires_grad());
}

TEST_CASE("amax gradient is shared evenly among ties") {
  Tensor x = f64({1, 3, 3, 2, 0, 1}, {2, 3}).set_requires_grad();
  amax(x, {1}).backward(f64({1, 4}));  // row 0: two 3s share 1; row 1: the 2 takes all 4
  check_close(x.grad(), f64({0, 0.5, 0.5, 4, 0, 0}, {2, 3}), 0, 1e-15);
}

TEST_CASE("max(dim) gradient goes to the chosen index only") {
  Tensor x = f64({1, 3, 3, 2, 0, 1}, {2, 3}).set_requires_grad();
  std::get<0>(x.max(1)).backward(f64({1, 4}));
  check_close(x.grad(), f64({0, 1, 0, 4, 0, 0}, {2, 3}), 0, 0);
  Tensor y = f64({2, 5, 1, 0}, {2, 2}).set_requires_grad();
  std::get<0>(y.min(0, true)).backward(f64({1, 2}, {1, 2}));  // columns [2, 1] and [5, 0]: both pick row 1
  check_close(y.grad(), f64({0, 0, 1, 2}, {2, 2}), 0, 0);
}

TEST_CASE("reductions down columns agree with the same reductions along rows") {
  // Dim 0 of [300, 600] runs the column kernels (several column blocks, many row chunks); the
  // transposed copy reduces the same numbers as contiguous rows.
  Tensor x = reference::uniform({300, 600}, -5, 5, 5);
  Tensor rows = x.t().contiguous();  // [600, 300]
  check_close(x.sum({0}), rows.sum({1}), 1e-12, 1e-12);
  check_close(x.mean({0}, true), rows.mean({1}).view({1, 600}), 1e-12, 1e-12);
  check_close(x.var({0}), rows.var({1}), 1e-12, 1e-12);
  check_close(amax(x, {0}), amax(rows, {1}), 0, 0);
  check_close(amin(x, {0}), amin(rows, {1}), 0, 0);
  check_close(x.argmax(0), rows.argmax(1), 0, 0);
  check_close(std::get<1>(x.min(0)), std::get<1>(rows.min(1)), 0, 0);
  // A middle dim of a 3-d tensor, and float32 against float64.
  Tensor y = reference::uniform({4, 100, 300}, -5, 5, 6);
  check_close(y.to(DType::Float32).sum({1}), y.sum({1}).to(DType::Float32), 1e-5, 1e-4);
  check_close(y.to(DType::Float32).var({1}), y.var({1}).to(DType::Float32), 1e-5, 1e-5);
}

TEST_CASE("full reductions of long tensors, folded in chunks across threads") {
  // 180000 elements: several chunks of the pool's grain; plain double loops give the expected values.
  Tensor x = reference::uniform({300, 600}, -5, 5, 7);
  std::vector<double> v = x.to_vector<double>();
  double total = 0, squares = 0, largest = v[0];
  for (double e : v) total += e, largest = std::max(largest, e);
  double mean = total / static_cast<double>(v.size());
  for (double e : v) squares += (e - mean) * (e - mean);
  CHECK(x.sum().item<double>() == doctest::Approx(total).epsilon(1e-12));
  CHECK(x.mean().item<double>() == doctest::Approx(mean).epsilon(1e-12));
  CHECK(x.var().item<double>() == doctest::Approx(squares / static_cast<double>(v.size() - 1)).epsilon(1e-12));
  CHECK(x.max().item<double>() == largest);
  CHECK(x.to(DType::Float32).sum().item<double>() == doctest::Approx(total).epsilon(1e-5));
  Tensor with_nan = x.clone();
  with_nan.view({-1}).narrow(0, 170000, 1).fill_(std::nan(""));  // in a late chunk
  CHECK(std::isnan(with_nan.max().item<double>()));
  CHECK(std::isnan(with_nan.min().item<double>()));
}

TEST_CASE("softmax and log_softmax of [0, ln 2, ln 3]") {
  // exp gives 1, 2, 3, summing to 6.
  Tensor x = f64({0, std::log(2.0), std::log(3.0)});
  check_close(x.softmax(0), f64({1.0 / 6, 2.0 / 6, 3.0 / 6}), 1e-15, 0);
  check_close(x.log_softmax(-1), f64({std::log(1.0 / 6), std::log(2.0 / 6), std::log(3.0 / 6)}), 1e-15, 0);
  check_close(x.to(DType::Float32).softmax(0), f64({1.0 / 6, 2.0 / 6, 3.0 / 6}).to(DType::Float32), 1e-6, 0);
}

TEST_CASE("softmax with -inf entries still normalises the rest") {
  // A masked row [0, -inf, ln 3]: exp gives 1, 0, 3, so 1/4, 0, 3/4.
  Tensor x = f64({0, -kInf, std::log(3.0), -kInf, 1, -kInf}, {2, 3});
  check_close(x.softmax(1), f64({0.25, 0, 0.75, 0, 1, 0}, {2, 3}), 1e-15, 0);
  std::vector<double> log_values = x.log_softmax(1).to_vector<double>();
  CHECK(log_values[0] == doctest::Approx(std::log(0.25)));
  CHECK(log_values[1] == -kInf);
  CHECK(log_values[4] == 0);
  check_close(x.to(DType::Float32).softmax(1), f64({0.25, 0, 0.75, 0, 1, 0}, {2, 3}).to(DType::Float32), 1e-6, 0);
}

TEST_CASE("softmax is stable for logits of +-1000 in float32") {
  // exp(1000) overflows; after subtracting the max the rows are [0, 0, -2000] (1/2, 1/2, 0) and
  // [-2000, -1000, 0] (0, 0, 1).
  Tensor x = from_vector(std::vector<float>{1000, 1000, -1000, -1000, 0, 1000}, {2, 3});
  check_close(x.softmax(-1), f64({0.5, 0.5, 0, 0, 0, 1}, {2, 3}).to(DType::Float32), 1e-6, 0);
  // log_softmax([1000, 0]) = [-log(1 + e^-1000), -1000 - log(1 + e^-1000)] = [0, -1000].
  check_close(from_vector(std::vector<float>{1000, 0}).log_softmax(0), from_vector(std::vector<float>{0, -1000}),
              1e-7, 0);
}

TEST_CASE("softmax along a middle dim and over size-1 dims") {
  Tensor x = reference::randn({2, 3, 4}, 1);
  Tensor y = x.softmax(1);
  check_close(y.sum({1}), ones({2, 4}, DType::Float64), 1e-15, 1e-15);
  // Same as moving the dim last, taking softmax there, and moving it back.
  check_close(y, x.permute({0, 2, 1}).softmax(-1).permute({0, 2, 1}).contiguous(), 1e-15, 1e-15);
  check_close(reference::randn({3, 1}, 2).softmax(1), ones({3, 1}, DType::Float64), 0, 0);
  check_close(reference::randn({3, 1}, 3).log_softmax(1), zeros({3, 1}, DType::Float64), 0, 0);
  check_close(scalar_tensor(5.0, DType::Float64).softmax(0), scalar_tensor(1.0, DType::Float64), 0, 0);
}

TEST_CASE("float32 softmax on large tensors matches float64, any dim, many threads") {
  // Rows long enough for the vectorised exp and sums, and enough of them to split across threads.
  for (auto [shape, dim] : {std::pair<Shape, int64_t>{{64, 3000}, -1}, {{8, 300, 70}, 1}, {{300, 2, 400}, 0}}) {
    CAPTURE(shape_str(shape));
    Tensor x = reference::uniform(shape, -30, 30, 4);
    Tensor x32 = x.to(DType::Float32);
    check_close(x32.softmax(dim), x.softmax(dim).to(DType::Float32), 1e-5, 1e-9);
    check_close(x32.log_softmax(dim), x.log_softmax(dim).to(DType::Float32), 1e-5, 1e-5);
  }
}

TEST_CASE("softmax gradient y * (g - sum(g * y))") {
  // y = [1/6, 1/3, 1/2], g = [1, 0, 0]: sum(g * y) = 1/6, dx = y * (g - 1/6) = [5/36, -2/36, -3/36].
  Tensor x = f64({0, std::log(2.0), std::log(3.0)}).set_requires_grad();
  x.softmax(0).backward(f64({1, 0, 0}));
  check_close(x.grad(), f64({5.0 / 36, -2.0 / 36, -3.0 / 36}), 1e-14, 1e-15);
}

TEST_CASE("log_softmax gradient g - exp(y) * sum(g)") {
  // exp(y) = [1/6, 1/3, 1/2], g = [1, 1, 0]: dx = g - 2 exp(y) = [2/3, 1/3, -1].
  Tensor x = f64({0, std::log(2.0), std::log(3.0)}).set_requires_grad();
  x.log_softmax(0).backward(f64({1, 1, 0}));
  check_close(x.grad(), f64({2.0 / 3, 1.0 / 3, -1}), 1e-14, 1e-15);
}

TEST_CASE("reductions and softmax reject bad input with clear errors") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(x.softmax(2), doctest::Contains("softmax: dim 2 is out of range for a tensor with 2 dims"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(x.log_softmax(-3), doctest::Contains("log_softmax: dim -3 is out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(x.mean({2}), doctest::Contains("mean: dim 2 is out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(x.max(5), doctest::Contains("max_dim: dim 5 is out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(x.argmax(-4), doctest::Contains("argmax: dim -4 is out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(x.sum({1, -1}), doctest::Contains("sum: dim 1 appears twice in [1, -1]"), mf::Error);
  CHECK_THROWS_WITH_AS(i64({1, 2, 3}).mean(),
                       doctest::Contains("mean: expects a float32 or float64 tensor, got int64 of shape [3]"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(i64({1, 2, 3}).var(), doctest::Contains("var: expects a float32 or float64 tensor, got int64"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(i64({1, 2}).softmax(0), doctest::Contains("softmax: expects a float32 or float64 tensor"),
                       mf::Error);
  Tensor empty = Tensor::empty({2, 0});
  CHECK_THROWS_WITH_AS(empty.max(1), doctest::Contains("max_dim: cannot reduce over dim 1 of size 0 in shape [2, 0]"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(empty.min(), doctest::Contains("amin: cannot reduce over dim 1 of size 0"), mf::Error);
  CHECK_THROWS_WITH_AS(empty.argmax(1), doctest::Contains("argmax: cannot reduce over dim 1"), mf::Error);
  CHECK_THROWS_WITH_AS(amax(empty, {1}), doctest::Contains("amax: cannot reduce over dim 1"), mf::Error);
  CHECK(amax(empty, {0}).shape() == Shape{0});  // reducing the non-empty dim leaves an empty result
  CHECK_THROWS_WITH_AS(x.max(3), doctest::Contains("test_reduce.cpp"), mf::Error);  // names the caller's line
}
