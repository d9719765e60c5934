// Indexing and joining ops: hand-worked values (derivations in comments), gradients, views as
// inputs, topk's ordering rules, the threaded paths on larger inputs, and the error messages.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/reference.h"

#include <cmath>
#include <limits>
#include <random>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

namespace {

Tensor i64(const std::vector<int64_t>& values, const Shape& shape = {}) { return from_vector(values, shape); }

/// x with requires_grad set (a leaf).
Tensor leaf(const std::vector<double>& values, const Shape& shape = {}) {
  Tensor x = f64(values, shape);
  x.set_requires_grad();
  return x;
}

/// The op's own naive reference on the same inputs.
template <OpId Id>
std::vector<Tensor> naive(const std::vector<Tensor>& inputs, const ParamsOf<Id>& params) {
  return registry()[Id].reference(inputs, params);
}

}  // namespace

TEST_CASE("cat joins along any dim and routes gradient slices back") {
  Tensor a = leaf({1, 2, 3, 4}, {2, 2}), b = leaf({5, 6}, {1, 2}), c = f64({7, 8}, {2, 1});
  check_close(cat({a, b}, 0), f64({1, 2, 3, 4, 5, 6}, {3, 2}), 0, 0);
  check_close(cat({a, c}, -1), f64({1, 2, 7, 3, 4, 8}, {2, 3}), 0, 0);
  // d/da sum(w * cat(a, b)) is w's first two rows, d/db its last row.
  Tensor w = f64({10, 20, 30, 40, 50, 60}, {3, 2});
  sum(mul(cat({a, b}, 0), w)).backward();
  check_close(a.grad(), f64({10, 20, 30, 40}, {2, 2}), 0, 0);
  check_close(b.grad(), f64({50, 60}, {1, 2}), 0, 0);
}

TEST_CASE("cat and stack of views") {
  Tensor x = f64({0, 1, 2, 3, 4, 5}, {2, 3});  // [[0, 1, 2], [3, 4, 5]]
  // x.t() = [[0, 3], [1, 4], [2, 5]]; beside a strided slice of its columns 0 and 2.
  check_close(cat({x.t(), x.slice(1, 0, 3, 2).t()}, 0), f64({0, 3, 1, 4, 2, 5, 0, 3, 2, 5}, {5, 2}), 0, 0);
  // Columns 0 and 2 of x are [0, 3] and [2, 5]: stacked as rows, then as columns.
  check_close(stack({x.select(1, 0), x.select(1, 2)}), f64({0, 3, 2, 5}, {2, 2}), 0, 0);
  check_close(stack({x.select(1, 0), x.select(1, 2)}, -1), f64({0, 2, 3, 5}, {2, 2}), 0, 0);
  // Stacking two [2, 3] along a new middle dim gives [2, 2, 3] with out[i][k] = input k's row i.
  check_close(stack({x, x.mul(10.0)}, 1), f64({0, 1, 2, 0, 10, 20, 3, 4, 5, 30, 40, 50}, {2, 2, 3}), 0, 0);
}

TEST_CASE("cat skips empty inputs and keeps integer and bool dtypes") {
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  check_close(cat({Tensor::empty({2, 0}, DType::Float64), a}, 1), a, 0, 0);
  check_close(cat({i64({1, 2}), i64({3}, {1})}), i64({1, 2, 3}), 0, 0);
  check_close(cat({from_vector(std::vector<bool>{true, false}), from_vector(std::vector<bool>{false}, {1})}),
              from_vector(std::vector<bool>{true, false, false}), 0, 0);
}

TEST_CASE("cat and stack name the offending tensor") {
  Tensor a = zeros({2, 3}), b = zeros({2, 4});
  CHECK_THROWS_WITH_AS(cat({a, b}, 0),
                       doctest::Contains("cat: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3] "
                                         "(all dims but dim 0 must match)"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3, 1})}, 1), doctest::Contains("tensor 1 has shape [2, 3, 1]"), mf::Error);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3}, DType::Float64)}),
                       doctest::Contains("cat: tensor 1 has dtype float64 but tensor 0 has dtype float32"), mf::Error);
  CHECK_THROWS_WITH_AS(cat({}), doctest::Contains("cat: expects at least one input tensor, got 0"), mf::Error);
  CHECK_THROWS_WITH_AS(cat({a, a}, 2), doctest::Contains("dim 2 is out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(stack({a, a, b}),
                       doctest::Contains("stack: tensor 2 has shape [2, 4] but tensor 0 has shape [2, 3]"), mf::Error);
  CHECK_THROWS_WITH_AS(stack({a}, 3), doctest::Contains("stack: dim 3 is out of range"), mf::Error);
}

TEST_CASE("index_select picks slices and accumulates repeats in backward") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  check_close(index_select(x, 0, i64({2, 0, 2})), f64({7, 8, 9, 1, 2, 3, 7, 8, 9}, {3, 3}), 0, 0);
  check_close(index_select(x, 1, i64({1}, {1})), f64({2, 5, 8}, {3, 1}), 0, 0);
  check_close(index_select(x.t(), -1, i64({0, 2})), f64({1, 7, 2, 8, 3, 9}, {3, 2}), 0, 0);
  // Row 2 is picked twice and row 1 never: d sum / dx rows are 1, 0, 2.
  sum(index_select(x, 0, i64({2, 0, 2}))).backward();
  check_close(x.grad(), f64({1, 1, 1, 0, 0, 0, 2, 2, 2}, {3, 3}), 0, 0);
}

TEST_CASE("index_select copies whole blocks of a contiguous input, reading a strided index") {
  // x [2, 3, 2]: slices along dim 1 are blocks of 2; the index [2, 0, 2] is every other element of
  // a longer tensor. Expected values written out by hand.
  Tensor x = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  Tensor index = i64({2, 9, 0, 9, 2}).slice(0, 0, 5, 2);
  check_close(index_select(x, 1, index), f64({5, 6, 1, 2, 5, 6, 11, 12, 7, 8, 11, 12}, {2, 3, 2}), 0, 0);
  check_close(index_select(x, 0, i64({1, 1})), f64({7, 8, 9, 10, 11, 12, 7, 8, 9, 10, 11, 12}, {2, 3, 2}), 0, 0);
}

TEST_CASE("index_select checks the index") {
  Tensor x = zeros({3, 3});
  CHECK_THROWS_WITH_AS(index_select(x, 0, i64({0, 3})),
                       doctest::Contains("index_select: index 3 is out of range for dim 0 of size 3 (shape [3, 3])"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 1, i64({-1})), doctest::Contains("index -1 is out of range for dim 1"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, f64({0, 1})), doctest::Contains("index must be int64, got float64"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, i64({0, 1}, {2, 1})), doctest::Contains("index must be 1-D, got shape [2, 1]"),
                       mf::Error);
}

TEST_CASE("index_select_out writes into a strided view and leaves the rest of its buffer") {
  // x [3, 2, 2] into positions [1, 3) of a [3, 2, 5] float32 buffer, and along dim 2 into a transposed
  // view; the expected values are the op's naive loops on the same x.
  Tensor x = reference::randn({3, 2, 2}, 11).to(DType::Float32);
  Tensor buffer = reference::randn({3, 2, 5}, 12).to(DType::Float32), expected_buffer = buffer.clone();
  Tensor out = buffer.narrow(2, 1, 2);
  Tensor expected = naive<OpId::index_select>({x, i64({2, 2, 0})}, {.dim = 0})[0];
  index_select_out(out, x, 0, i64({2, 2, 0}));
  expected_buffer.narrow(2, 1, 2).copy_(expected);
  check_close(buffer, expected_buffer, 0, 0);

  Tensor columns = zeros({2, 2, 3}, DType::Float32).transpose(0, 2);  // [3, 2, 2], strides (1, 3, 6)
  index_select_out(columns, x, 2, i64({1, 0}));
  check_close(columns, naive<OpId::index_select>({x, i64({1, 0})}, {.dim = 2})[0], 0, 0);

  Tensor wrong = zeros({2, 2, 2}, DType::Float32);
  CHECK_THROWS_WITH_AS(index_select_out(wrong, x, 0, i64({2, 2, 0})),
                       doctest::Contains("result of shape [3, 2, 2] cannot be written in place into a tensor of "
                                         "shape [2, 2, 2]"),
                       mf::Error);
}

TEST_CASE("index_select_out moves slices within x's own memory, in any order") {
  // x views rows [0, 4) and positions [0, 3) of a buffer of 6 rows x 3 x 5 positions (a key cache's
  // filled part), its rows along dim 0 or, behind an outer dim, along dim 1. Each pattern writes the
  // selected rows over x from its start (fewer rows: compaction; more: into the buffer's spare rows):
  // cycles, swaps and repeats, where a later row's source is an earlier row already overwritten. The
  // rows must hold what the naive loops give on a copy of x taken first, and nothing else may change.
  const std::vector<std::vector<int64_t>> patterns = {{0, 1, 2, 3}, {1, 2, 3, 0}, {3, 0, 1, 2}, {0, 0, 1, 2},
                                                      {2, 2, 2, 2}, {2, 3},       {1, 3, 0},    {0, 0, 1, 1, 3, 2}};
  for (int64_t dim : {0, 1}) {
    for (const std::vector<int64_t>& pattern : patterns) {
      INFO("dim ", dim, ", pattern of ", pattern.size(), " starting ", pattern[0], ", ", pattern[1]);
      const Shape shape = dim == 0 ? Shape{6, 3, 5} : Shape{2, 6, 5};
      Tensor buffer = reference::randn(shape, 13), expected_buffer = buffer.clone();
      const auto rows = static_cast<int64_t>(pattern.size());
      Tensor x = buffer.narrow(dim, 0, 4).narrow(2, 0, 3);
      Tensor out = buffer.narrow(dim, 0, rows).narrow(2, 0, 3);
      Tensor expected = naive<OpId::index_select>({x.clone(), i64(pattern)}, {.dim = dim})[0];
      index_select_out(out, x, dim, i64(pattern));
      expected_buffer.narrow(dim, 0, rows).narrow(2, 0, 3).copy_(expected);
      check_close(buffer, expected_buffer, 0, 0);
    }
  }
  // out overlapping x from another start: x is read as it was before any write.
  Tensor buffer = reference::randn({5, 2}, 14);
  Tensor x = buffer.narrow(0, 0, 4), out = buffer.narrow(0, 1, 3);
  Tensor expected = naive<OpId::index_select>({x.clone(), i64({0, 1, 2})}, {.dim = 0})[0];
  index_select_out(out, x, 0, i64({0, 1, 2}));
  check_close(buffer.narrow(0, 1, 3), expected, 0, 0);
}

TEST_CASE("gather follows torch.gather") {
  // torch docs: gather([[1, 2], [3, 4]], 1, [[0, 0], [1, 0]]) = [[1, 1], [4, 3]].
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor index = i64({0, 0, 1, 0}, {2, 2});
  check_close(gather(x, 1, index), f64({1, 1, 4, 3}, {2, 2}), 0, 0);
  // Along dim 0: out[i][j] = x[index[i][j]][j] = [[x00, x01], [x10, x01]].
  check_close(gather(x, 0, index), f64({1, 2, 3, 2}, {2, 2}), 0, 0);
  // Picked counts: x00 twice, x01 never, x10 and x11 once.
  sum(gather(x, 1, index)).backward();
  check_close(x.grad(), f64({2, 0, 1, 1}, {2, 2}), 0, 0);
  // A column of target indices, the cross-entropy pattern: out[i] = x[i][t[i]].
  check_close(gather(f64({1, 2, 3, 4, 5, 6}, {3, 2}), 1, i64({1, 0, 1}, {3, 1})), f64({2, 3, 6}, {3, 1}), 0, 0);
}

TEST_CASE("gather checks its index") {
  Tensor x = zeros({2, 2});
  CHECK_THROWS_WITH_AS(gather(x, 1, i64({0, 2, 0, 0}, {2, 2})),
                       doctest::Contains("gather: index 2 is out of range for dim 1 of size 2 (shape [2, 2])"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(gather(x, 1, i64({0, 1})),
                       doctest::Contains("index of shape [2] must have as many dims as x of shape [2, 2]"), mf::Error);
  CHECK_THROWS_WITH_AS(gather(x, 1, i64({0, 0, 0}, {3, 1})),
                       doctest::Contains("index of shape [3, 1] is larger than x of shape [2, 2] in dim 0"), mf::Error);
}

TEST_CASE("scatter_add accumulates collisions and differentiates both operands") {
  // Positions 0, 1, 0, 2, 0 receive 1..5: out = [0 + 1 + 3 + 5, 10 + 2, 20 + 4].
  Tensor x = leaf({0, 10, 20}, {3}), src = leaf({1, 2, 3, 4, 5}, {5});
  Tensor index = i64({0, 1, 0, 2, 0});
  Tensor out = scatter_add(x, 0, index, src);
  check_close(out, f64({9, 12, 24}), 0, 0);
  // d sum(w * out) / dx = w;  d / dsrc[i] = w[index[i]].
  sum(mul(out, f64({1, 2, 3}))).backward();
  check_close(x.grad(), f64({1, 2, 3}), 0, 0);
  check_close(src.grad(), f64({1, 2, 1, 3, 1}), 0, 0);
  // torch docs: ones [2, 5] scattered into zeros [3, 5] along dim 0 by [[0, 1, 2, 0, 0]].
  check_close(scatter_add(zeros({3, 5}), 0, i64({0, 1, 2, 0, 0}, {1, 5}), ones({2, 5})),
              from_vector(std::vector<float>{1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0}, {3, 5}), 0, 0);
}

TEST_CASE("scatter_add gives src's unindexed elements zero gradient") {
  Tensor src = leaf({1, 2, 3, 4}, {2, 2});
  // Only src's first column is scattered: row i's src[i][0] goes to out[i][1].
  Tensor out = scatter_add(zeros({2, 2}, DType::Float64), 1, i64({1, 1}, {2, 1}), src);
  check_close(out, f64({0, 1, 0, 3}, {2, 2}), 0, 0);
  sum(mul(out, f64({1, 2, 3, 4}, {2, 2}))).backward();
  check_close(src.grad(), f64({2, 0, 4, 0}, {2, 2}), 0, 0);
}

TEST_CASE("scatter_add checks its operands") {
  Tensor x = zeros({3});
  CHECK_THROWS_WITH_AS(scatter_add(x, 0, i64({0, 5}), ones({2})),
                       doctest::Contains("scatter_add: index 5 is out of range for dim 0 of size 3 (shape [3])"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 0, i64({0, 1}), ones({2}, DType::Float64)),
                       doctest::Contains("x and src must share a float32, float64 or int64 dtype, got float32 and "
                                         "float64"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(scatter_add(x, 0, i64({0, 1, 2}), ones({2})),
                       doctest::Contains("index of shape [3] is larger than src [2] or x [3] in dim 0"), mf::Error);
}

TEST_CASE("topk sorts, breaks ties by lower index and ranks NaN largest") {
  Tensor x = f64({1, 3, 2, 5, 4});
  auto [values, indices] = topk(x, 2);
  check_close(values, f64({5, 4}), 0, 0);
  check_close(indices, i64({3, 4}), 0, 0);
  auto [low, low_indices] = topk(x, 3, 0, false);
  check_close(low, f64({1, 2, 3}), 0, 0);
  check_close(low_indices, i64({0, 2, 1}), 0, 0);

  auto [tied, tied_indices] = topk(f64({2, 7, 7, 1, 7}), 3);
  check_close(tied, f64({7, 7, 7}), 0, 0);
  check_close(tied_indices, i64({1, 2, 4}), 0, 0);
  auto [tied_low, tied_low_indices] = topk(f64({3, 1, 2, 1}), 3, 0, false);
  check_close(tied_low, f64({1, 1, 2}), 0, 0);
  check_close(tied_low_indices, i64({1, 3, 2}), 0, 0);

  double nan = std::numeric_limits<double>::quiet_NaN();
  auto [with_nan, nan_indices] = topk(f64({1, nan, 3}), 2);
  check_close(with_nan, f64({nan, 3}), 0, 0);
  check_close(nan_indices, i64({1, 2}), 0, 0);
  auto [without_nan, smallest_indices] = topk(f64({1, nan, 3}), 3, 0, false);
  check_close(without_nan, f64({1, 3, nan}), 0, 0);
  check_close(smallest_indices, i64({0, 2, 1}), 0, 0);
}

TEST_CASE("topk keeps its rules on long fibers, where it streams instead of sorting") {
  // 40 zeros with 3 at 5, 9 and 30 and NaN at 20: the largest two are NaN (index 20) then the first
  // 3 (index 5); the smallest two are the first zeros (0, 1).
  double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> fiber(40, 0.0);
  fiber[5] = fiber[9] = fiber[30] = 3;
  fiber[20] = nan;
  for (DType dtype : {DType::Float64, DType::Float32}) {  // float32 tests its blocks in vectors
    CAPTURE(dtype);
    auto [top, top_indices] = topk(f64(fiber).to(dtype), 2);
    check_close(top, f64({nan, 3}).to(dtype), 0, 0);
    check_close(top_indices, i64({20, 5}), 0, 0);
    auto [bottom, bottom_indices] = topk(f64(fiber).to(dtype), 2, 0, false);
    check_close(bottom, f64({0, 0}).to(dtype), 0, 0);
    check_close(bottom_indices, i64({0, 1}), 0, 0);
  }
  fiber[20] = 3;
  for (DType dtype : {DType::Float64, DType::Float32}) {
    CAPTURE(dtype);
    auto [ties, tie_indices] = topk(f64(fiber).to(dtype), 2);
    check_close(ties, f64({3, 3}).to(dtype), 0, 0);
    check_close(tie_indices, i64({5, 9}), 0, 0);
  }
  // Fibers side by side in memory (dim 0 of [40, 2]): column 1 is column 0 reversed.
  std::vector<double> columns;
  for (size_t i = 0; i < fiber.size(); ++i) {
    columns.push_back(fiber[i]);
    columns.push_back(fiber[fiber.size() - 1 - i]);
  }
  Tensor x = f64(columns, {40, 2});
  for (bool largest : {true, false}) {
    CAPTURE(largest);
    auto [values, indices] = topk(x, 2, 0, largest);
    std::vector<Tensor> expected = naive<OpId::topk>({x}, {.k = 2, .dim = 0, .largest = largest});
    check_close(values, expected[0], 0, 0);
    check_close(indices, expected[1], 0, 0);
  }
  // Column 1 holds 3 at rows 9, 19, 30, 34: the largest two are rows 9 and 19.
  check_close(std::get<1>(topk(x, 2, 0)), i64({5, 9, 9, 19}, {2, 2}), 0, 0);
}

// The streaming scan tests blocks of 16 against the k-th best so far and offers only the elements
// beyond it: fibers of few distinct values (ties at the bound in every block), NaNs and infinities
// here and there, against the naive selection (repeated scans), both directions, odd lengths.
TEST_CASE("topk's streaming scan keeps every rule where ties and NaNs fill its blocks") {
  double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::mt19937 random(7);
  for (int64_t size : {97, 1000, 4099}) {
    std::vector<double> fiber(static_cast<size_t>(3 * size));
    for (double& value : fiber) {
      uint32_t draw = random() % 64;
      value = draw == 0 ? nan : draw == 1 ? inf : draw == 2 ? -inf : static_cast<double>(draw % 9);
    }
    for (DType dtype : {DType::Float32, DType::Float64}) {
      Tensor x = f64(fiber, {3, size}).to(dtype);
      for (int64_t k : {1, 3, 6})
        for (bool largest : {true, false}) {
          CAPTURE(size);
          CAPTURE(dtype);
          CAPTURE(k);
          CAPTURE(largest);
          auto [values, indices] = topk(x, k, 1, largest);
          std::vector<Tensor> expected = naive<OpId::topk>({x}, {.k = k, .dim = 1, .largest = largest});
          check_close(indices, expected[1], 0, 0);
          // check_close takes inf - inf for a difference: the values compared as equal or both NaN.
          std::vector<double> got = values.to_vector<double>(), want = expected[0].to_vector<double>();
          for (size_t i = 0; i < got.size(); ++i)
            CHECK((got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))));
        }
    }
  }
}

TEST_CASE("topk along a leading dim, k = 0, and its gradient") {
  // Columns of [[1, 6], [4, 2], [3, 5]]: largest two are (4, 3) at rows (1, 2) and (6, 5) at (0, 2).
  Tensor x = leaf({1, 6, 4, 2, 3, 5}, {3, 2});
  auto [values, indices] = topk(x, 2, 0);
  check_close(values, f64({4, 6, 3, 5}, {2, 2}), 0, 0);
  check_close(indices, i64({1, 0, 2, 2}, {2, 2}), 0, 0);
  // The gradient of sum(w * values) lands on the chosen elements: x[1][0] += 1, x[0][1] += 2,
  // x[2][0] += 3, x[2][1] += 4.
  sum(mul(values, f64({1, 2, 3, 4}, {2, 2}))).backward();
  check_close(x.grad(), f64({0, 2, 1, 0, 3, 4}, {3, 2}), 0, 0);

  auto [none, none_indices] = topk(f64({1, 2}), 0);
  CHECK(none.shape() == Shape{0});
  CHECK(none_indices.dtype() == DType::Int64);
  CHECK_THROWS_WITH_AS(topk(zeros({3}), 4), doctest::Contains("topk: k = 4 is out of range for dim 0 of size 3"),
                       mf::Error);
}

// log_softmax_topk's promise: topk's picks of log_softmax(x), with log_softmax's bits, without writing
// it. Rows the size of a translation vocabulary take the streaming top-k and the vector exps with a tail.
TEST_CASE("log_softmax_topk gives what log_softmax then topk give, bit for bit, and refuses integers") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    Tensor logits = reference::randn({7, 8001}, 965).mul(4.0).to(dtype);  // [N, V]
    for (int64_t k : {1, 5}) {
      CAPTURE(k);
      auto [values, indices] = log_softmax_topk(logits, k);
      auto [expected_values, expected_indices] = topk(log_softmax(logits, -1), k);
      check_close(values, expected_values, 0, 0);
      check_close(indices, expected_indices, 0, 0);
    }
  }
  CHECK_THROWS_WITH_AS(log_softmax_topk(i64({1, 2}), 1),
                       doctest::Contains("log_softmax_topk: expects a float32 or float64 tensor, got int64"),
                       mf::Error);
}

TEST_CASE("one_hot") {
  check_close(one_hot(i64({0, 2, 1}), 3), i64({1, 0, 0, 0, 0, 1, 0, 1, 0}, {3, 3}), 0, 0);
  check_close(one_hot(i64({1, 0}, {2, 1}), 2), i64({0, 1, 1, 0}, {2, 1, 2}), 0, 0);
  CHECK_THROWS_WITH_AS(one_hot(i64({0, -1}), 3),
                       doctest::Contains("one_hot: class index -1 is negative (indices of shape [2])"), mf::Error);
  CHECK_THROWS_WITH_AS(one_hot(i64({3, 0}), 3),
                       doctest::Contains("one_hot: class index 3 is out of range for num_classes = 3"), mf::Error);
  CHECK_THROWS_WITH_AS(one_hot(f64({0, 1}), 3), doctest::Contains("indices must be int64, got float64"), mf::Error);
  CHECK_THROWS_WITH_AS(one_hot(i64({0, 1}), 0), doctest::Contains("num_classes must be positive, got 0"), mf::Error);
}

TEST_CASE("tril and triu keep a band around the k-th diagonal") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  check_close(tril(x), f64({1, 0, 0, 4, 5, 0, 7, 8, 9}, {3, 3}), 0, 0);
  check_close(tril(x, -1), f64({0, 0, 0, 4, 0, 0, 7, 8, 0}, {3, 3}), 0, 0);
  check_close(triu(x), f64({1, 2, 3, 0, 5, 6, 0, 0, 9}, {3, 3}), 0, 0);
  check_close(triu(x, 1), f64({0, 2, 3, 0, 0, 6, 0, 0, 0}, {3, 3}), 0, 0);
  check_close(triu(x, -5), x, 0, 0);
  check_close(triu(x, std::numeric_limits<int64_t>::max()), zeros({3, 3}, DType::Float64), 0, 0);
  check_close(tril(x, std::numeric_limits<int64_t>::min()), zeros({3, 3}, DType::Float64), 0, 0);
  // x.t() = [[1, 4, 7], [2, 5, 8], [3, 6, 9]].
  check_close(tril(x.t()), f64({1, 0, 0, 2, 5, 0, 3, 6, 9}, {3, 3}), 0, 0);
  // The causal mask: true above the diagonal, where attention must not look.
  check_close(triu(ones({2, 3}, DType::Bool), 1), from_vector(std::vector<bool>{false, true, true, false, false, true}, {2, 3}), 0, 0);
  // The gradient is masked the same way.
  sum(tril(x)).backward();
  check_close(x.grad(), f64({1, 0, 0, 1, 1, 0, 1, 1, 1}, {3, 3}), 0, 0);
  CHECK_THROWS_WITH_AS(tril(zeros({3})), doctest::Contains("tril: expects a tensor with at least 2 dims, got shape [3]"),
                       mf::Error);
}

TEST_CASE("large inputs take the threaded paths and still match the references") {
  // Sizes well past the parallel grain, with many index collisions for scatter_add.
  Tensor x = reference::randn({96, 800}, 990);
  Tensor rows = reference::randint({300}, 96, 991);
  check_close(index_select(x, 0, rows), naive<OpId::index_select>({x, rows}, {.dim = 0})[0], 0, 0);
  Tensor cols = reference::randint({96, 500}, 800, 992);
  check_close(gather(x, 1, cols), naive<OpId::gather>({x, cols}, {.dim = 1})[0], 0, 0);
  Tensor targets = reference::randint({50, 800}, 96, 993), src = reference::randn({50, 800}, 994);
  check_close(scatter_add(x, 0, targets, src), naive<OpId::scatter_add>({x, targets, src}, {.dim = 0})[0], 1e-12,
              1e-12);
  Tensor wide_targets = reference::randint({96, 900}, 800, 995), wide_src = reference::randn({96, 900}, 996);
  check_close(scatter_add(x, 1, wide_targets, wide_src),
              naive<OpId::scatter_add>({x, wide_targets, wide_src}, {.dim = 1})[0], 1e-12, 1e-12);
  auto [values, indices] = topk(x, 5, 0);
  std::vector<Tensor> expected = naive<OpId::topk>({x}, {.k = 5, .dim = 0, .largest = true});
  check_close(values, expected[0], 0, 0);
  check_close(indices, expected[1], 0, 0);
  auto [row_values, row_indices] = topk(x, 7, -1, false);
  expected = naive<OpId::topk>({x}, {.k = 7, .dim = -1, .largest = false});
  check_close(row_values, expected[0], 0, 0);
  check_close(row_indices, expected[1], 0, 0);
  check_close(triu(x.view({8, 12, 800}), 3), naive<OpId::triu>({x.view({8, 12, 800})}, {.diagonal = 3})[0], 0, 0);
  Tensor classes = reference::randint({3000}, 40, 997);
  check_close(one_hot(classes, 40), naive<OpId::one_hot>({classes}, {.num_classes = 40})[0], 0, 0);
}
