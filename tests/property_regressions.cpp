// Bugs the property suite found, kept as plain cases with hand-worked values.
#include <doctest/doctest.h>

#include "helpers.h"
#include "miniflow.h"

#include <cmath>
#include <limits>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

// BLAS needs a leading dimension of at least the row length; a stride-0 operand was passed with its
// leading dimension bumped up to the row length, so BLAS read past the end of the operand's storage.
TEST_CASE("matmul reads expanded (stride-0) operands correctly") {
  Tensor b = f64({1, 0, 0, 1, 1, 1, 2, -1}, {4, 2});
  // Every row of a is [1, 2, 3, 4]: [1 + 3 + 8, 2 + 3 - 4] = [12, 1].
  Tensor rows = f64({1, 2, 3, 4}, {1, 4}).expand({3, 4});
  check_close(matmul(rows, b), f64({12, 1, 12, 1, 12, 1}, {3, 2}), 0, 0);
  // Row i of a is [i + 1] * 4: (i + 1) * [1 + 0 + 1 + 2, 0 + 1 + 1 - 1] = (i + 1) * [4, 1].
  Tensor columns = f64({1, 2, 3}, {3, 1}).expand({3, 4});
  check_close(matmul(columns, b), f64({4, 1, 8, 2, 12, 3}, {3, 2}), 0, 0);
  // Every column of b is [1, 2]: [[1, 2], [3, 4]] @ b has columns [5, 11].
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  check_close(matmul(a, f64({1, 2}, {2, 1}).expand({2, 3})), f64({5, 5, 5, 11, 11, 11}, {2, 3}), 0, 0);
}

// With b shared by the batch (stride 0) and a contiguous, the batch was folded into the rows of one
// GEMM, although a 2-d a holds the rows of one batch element only: the other rows were read past a.
TEST_CASE("matmul of a 2-d operand by a batch-expanded one") {
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  Tensor identity = f64({1, 0, 0, 1}, {2, 2}).expand({3, 2, 2});
  check_close(matmul(a, identity), f64({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {3, 2, 2}), 0, 0);
  check_close(matmul(a.to(DType::Float32), identity.to(DType::Float32)),
              f64({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {3, 2, 2}).to(DType::Float32), 0, 0);
}

// expand accepted any size for a size-1 dim, negative ones included: a view with a negative size.
TEST_CASE("expand refuses negative sizes") {
  CHECK_THROWS_WITH_AS(f64({1}, {1}).expand({-2}), doctest::Contains("expand: cannot expand shape [1] to [-2]"), Error);
  CHECK_THROWS_WITH_AS(f64({1}, {1}).expand({-3, 1}), doctest::Contains("expand: "), Error);
}

// Element counts were multiplied without overflow checks: one_hot of 4 ids with 2^62 classes wrapped
// to 0 elements (an empty allocation for a [4, 2^62] tensor), and view took [2^62, 8] for an empty
// tensor because 2^62 * 8 wrapped to 0.
TEST_CASE("shapes whose element count overflows are refused") {
  constexpr int64_t kHuge = int64_t{1} << 62;
  CHECK_THROWS_WITH_AS(Tensor::empty({kHuge, 4}), doctest::Contains("has too many elements"), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({kHuge}, DType::Float64), doctest::Contains("size in bytes"), Error);
  CHECK(Tensor::empty({kHuge, 0}).numel() == 0);  // empty: no bytes, however large the other size
  // Empty too, but its contiguous strides (sizes multiplied with 0 read as 1) would overflow.
  CHECK_THROWS_WITH_AS(Tensor::empty({kHuge, 4, 0}), doctest::Contains("has too many elements"), Error);
  CHECK_THROWS_WITH_AS(one_hot(from_vector<int64_t>({1, 1, 1, 1}), kHuge), doctest::Contains("one_hot: "), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({0, 3}).view({kHuge, 8}), doctest::Contains("view: "), Error);
  CHECK_THROWS_WITH_AS(f64({1}, {1, 1}).expand({kHuge, kHuge}), doctest::Contains("expand: "), Error);
}

// Index values were checked in the kernels, which do not run when the output is empty: an index
// out of range passed unnoticed whenever another dim had size 0.
TEST_CASE("index ops check index values even when the output is empty") {
  CHECK_THROWS_WITH_AS(index_select(Tensor::empty({0, 3}, DType::Float64), 1, from_vector<int64_t>({5}, {1})),
                       doctest::Contains("index_select: index 5 is out of range for dim 1 of size 3"), Error);
  Tensor none = Tensor::empty({0}, DType::Float64);
  CHECK_THROWS_WITH_AS(scatter_add(none, 0, from_vector<int64_t>({0}, {1}), f64({1}, {1})),
                       doctest::Contains("scatter_add: index 0 is out of range for dim 0 of size 0"), Error);
  // In range, the same calls are fine.
  CHECK(index_select(Tensor::empty({0, 3}, DType::Float64), 1, from_vector<int64_t>({2}, {1})).shape() == Shape{0, 1});
}

// In-place writes into an expanded view (several elements, one memory location) were accepted, and
// threads then wrote the shared locations in any order.
TEST_CASE("in-place writes into expanded views are refused") {
  Tensor shared = f64({1}, {1}).expand({3});
  CHECK_THROWS_WITH_AS(shared.add_(1.0), doctest::Contains("add: cannot write in place"), Error);
  CHECK_THROWS_WITH_AS(shared.fill_(2), doctest::Contains("fill: cannot write in place"), Error);
  CHECK_THROWS_WITH_AS(uniform_(shared, 0, 1), doctest::Contains("uniform: cannot write in place"), Error);
  CHECK(shared.to_vector<double>() == std::vector<double>{1, 1, 1});
  // Size-1 dims may have any stride: writes there stay one location per element.
  Tensor column = zeros({3, 1}, DType::Float64).expand({3, 1});
  column.add_(1.0);
  CHECK(column.to_vector<double>() == std::vector<double>{1, 1, 1});
}

// Scalars were cast to the tensor's type unchecked: NaN, infinities and values past int64's range
// became undefined behaviour in fill, masked_fill, clamp, pow, arange and uniform on int64 tensors.
TEST_CASE("scalars an int64 tensor cannot hold are refused") {
  double inf = std::numeric_limits<double>::infinity();
  Tensor ids = from_vector<int64_t>({1, 2, 3});
  CHECK_THROWS_WITH_AS(ids.clone().fill_(std::nan("")), doctest::Contains("fill: fill value nan is not representable"),
                       Error);
  CHECK_THROWS_WITH_AS(ids.masked_fill(ones({3}, DType::Bool), 1e300), doctest::Contains("masked_fill: "), Error);
  CHECK_THROWS_WITH_AS(call<OpId::clamp>({ids}, {.max = inf}), doctest::Contains("clamp: max inf"), Error);
  CHECK_THROWS_WITH_AS(call<OpId::pow_scalar>({ids}, {.exponent = inf}), doctest::Contains("pow_scalar: exponent inf"),
                       Error);
  CHECK_THROWS_WITH_AS(arange(0, 0x1p64, 0x1p62, DType::Int64), doctest::Contains("arange: last value"), Error);
  CHECK_THROWS_WITH_AS(uniform({2}, 0, inf, DType::Float32), doctest::Contains("uniform: bounds must be finite"),
                       Error);
  CHECK_THROWS_WITH_AS(var(f64({1, 2}, {2}), {}, -1), doctest::Contains("var: correction must be >= 0"), Error);
  // Float tensors take any of them.
  CHECK(std::isnan(full({1}, std::nan(""), DType::Float32).item<float>()));
}

// slice computed its length as (end - start + step - 1) / step, which overflows for huge steps.
TEST_CASE("slice with a step near INT64_MAX") {
  Tensor x = f64({1, 2, 3}, {3});
  check_close(x.slice(0, 0, 3, std::numeric_limits<int64_t>::max()), f64({1}, {1}), 0, 0);
  check_close(x.slice(0, 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max()), f64({2}, {1}), 0,
              0);
}
