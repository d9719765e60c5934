// The ops a sampling loop needs: sort / argsort, cumsum, randperm and multinomial. Values worked out
// by hand or by PyTorch's documented behaviour (said where), the random ops held to their
// distributions with bounds of several standard deviations, and their error messages.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

TEST_CASE("sort is stable, puts NaN last ascending and first descending, and argsort gives its positions") {
  // torch.sort(torch.tensor([3., 1., nan, 1., 2.]), stable=True) gives [1, 1, 2, 3, nan] from
  // positions [1, 3, 4, 0, 2]; descending=True gives [nan, 3, 2, 1, 1] from [2, 0, 4, 1, 3].
  Tensor x = f64({3, 1, std::nan(""), 1, 2});
  auto [ascending, from] = sort(x);
  std::vector<double> values = ascending.to_vector<double>();
  CHECK(std::vector<double>(values.begin(), values.end() - 1) == std::vector<double>{1, 1, 2, 3});
  CHECK(std::isnan(values.back()));
  CHECK(from.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 4, 0, 2});
  auto [descending, from_descending] = sort(x, 0, true);
  CHECK(std::isnan(descending.to_vector<double>()[0]));
  CHECK(from_descending.to_vector<int64_t>() == std::vector<int64_t>{2, 0, 4, 1, 3});
  CHECK(argsort(x, -1, true).to_vector<int64_t>() == from_descending.to_vector<int64_t>());
  CHECK(x.argsort(0, true).to_vector<int64_t>() == from_descending.to_vector<int64_t>());  // the method forms
  CHECK(std::get<1>(x.sort()).to_vector<int64_t>() == from.to_vector<int64_t>());

  // Along dim 0 of a matrix, each column on its own.
  auto [columns, rows] = sort(f64({4, 1, 2, 5, 3, 0}, {3, 2}), 0);
  CHECK(columns.to_vector<double>() == std::vector<double>{2, 0, 3, 1, 4, 5});
  CHECK(rows.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 2, 0, 0, 1});

  // The gradient goes back to where each value came from.
  Tensor leaf = f64({3, 1, 2});
  leaf.set_requires_grad();
  (std::get<0>(sort(leaf)) * f64({10, 20, 30})).sum().backward();
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{30, 10, 20});

  CHECK_THROWS_WITH_AS(sort(f64({1, 2}), 1), doctest::Contains("sort: "), Error);
  CHECK_THROWS_WITH_AS(sort(ones({2}, DType::Bool)), doctest::Contains("not defined for bool tensors"), Error);
}

TEST_CASE("cumsum: running sums along a dim, from either end, integers and bools as int64") {
  // [[1, 2, 3], [4, 5, 6]]: along dim 1 [[1, 3, 6], [4, 9, 15]]; along dim 0 [[1, 2, 3], [5, 7, 9]];
  // reversed along dim 1 [[6, 5, 3], [15, 11, 6]].
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(cumsum(x, 1).to_vector<double>() == std::vector<double>{1, 3, 6, 4, 9, 15});
  CHECK(cumsum(x, 0).to_vector<double>() == std::vector<double>{1, 2, 3, 5, 7, 9});
  CHECK(x.cumsum(0).to_vector<double>() == std::vector<double>{1, 2, 3, 5, 7, 9});
  CHECK(cumsum(x, -1, true).to_vector<double>() == std::vector<double>{6, 5, 3, 15, 11, 6});
  Tensor counts = cumsum(from_vector(std::vector<int>{1, 0, 1, 1}), 0);
  CHECK(counts.dtype() == DType::Int64);
  CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2, 3});
  CHECK(cumsum(f64({1, 0, 1}) > 0.5, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2});  // torch: int64
  // float32 sums accumulate in double, as PyTorch's CPU kernel: 1e8 + 1 + 1 - 1e8 is 2, where float
  // accumulation would give 0.
  CHECK(cumsum(tensor({1e8f, 1, 1, -1e8f}), 0).to_vector<float>()[3] == 2.0f);

  // d/dx_j of sum_i w_i cumsum(x)_i is w_j + w_{j+1} + ...: [6, 5, 3] for w = [1, 2, 3].
  Tensor leaf = f64({7, -1, 2});
  leaf.set_requires_grad();
  (cumsum(leaf, 0) * f64({1, 2, 3})).sum().backward();
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{6, 5, 3});
  CHECK_THROWS_WITH_AS(cumsum(x, 2), doctest::Contains("cumsum: "), Error);
}

TEST_CASE("scaled_below is the high half of the 128-bit product") {
  std::mt19937_64 bits(5);
  for (int i = 0; i < 1000; ++i) {
    uint64_t a = bits(), n = i % 3 == 0 ? bits() : bits() % 1000 + 1;
    CHECK(sampling::scaled_below(a, n) == static_cast<uint64_t>((static_cast<unsigned __int128>(a) * n) >> 64));
  }
  CHECK(sampling::scaled_below(~uint64_t{0}, 10) == 9);
  CHECK(sampling::scaled_below(0, 10) == 0);
}

TEST_CASE("randperm: a permutation, seeded, each position uniform") {
  Generator generator(42);
  Tensor p = randperm(10, Device::cpu(), &generator);
  std::vector<int64_t> sorted = p.to_vector<int64_t>();
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(sorted == expected);
  Generator again(42);
  CHECK(randperm(10, Device::cpu(), &again).to_vector<int64_t>() == p.to_vector<int64_t>());
  CHECK(randperm(10, Device::cpu(), &generator).to_vector<int64_t>() != p.to_vector<int64_t>());  // the stream moved on
  CHECK(randperm(0).numel() == 0);

  // Where 0 lands over 6000 permutations of 6: each position has p = 1/6, so 1000 expected with
  // standard deviation sqrt(6000 * 1/6 * 5/6) = 28.9; 5 deviations is 144.
  std::vector<int64_t> landed(6, 0);
  for (int draw = 0; draw < 6000; ++draw) {
    std::vector<int64_t> perm = randperm(6, Device::cpu(), &generator).to_vector<int64_t>();
    ++landed[static_cast<size_t>(std::find(perm.begin(), perm.end(), 0) - perm.begin())];
  }
  for (int64_t count : landed) CHECK(std::abs(count - 1000) < 144);
  CHECK_THROWS_WITH_AS(randperm(-1), doctest::Contains("randperm: n must be >= 0, got -1 at test_sampling.cpp"), Error);
}

TEST_CASE("multinomial draws in proportion to the weights, never a zero weight, each category once without replacement") {
  Generator generator(7);
  // Weights 1 : 2 : 0 : 7 (unnormalised). 20000 draws: category 3 expected 14000 with standard
  // deviation sqrt(20000 * 0.7 * 0.3) = 64.8, category 0 expected 2000 with sd 42.4; 5 deviations.
  Tensor weights = f64({1, 2, 0, 7});
  std::vector<int64_t> drawn = multinomial(weights, 20000, true, &generator).to_vector<int64_t>();
  std::vector<int64_t> counts(4, 0);
  for (int64_t c : drawn) ++counts[static_cast<size_t>(c)];
  CHECK(counts[2] == 0);
  CHECK(std::abs(counts[3] - 14000) < 5 * 64.8);
  CHECK(std::abs(counts[0] - 2000) < 5 * 42.4);

  // Without replacement: distinct picks, and all three nonzero categories when three are asked for.
  Tensor rows = f64({0.5, 0, 2, 1, 1, 3, 3, 0}, {2, 4});
  Tensor picks = multinomial(rows, 3, false, &generator);
  CHECK(picks.shape() == Shape{2, 3});
  std::vector<int64_t> p = picks.to_vector<int64_t>();
  CHECK(std::set<int64_t>(p.begin(), p.begin() + 3) == std::set<int64_t>{0, 2, 3});
  CHECK(std::set<int64_t>(p.begin() + 3, p.end()) == std::set<int64_t>{0, 1, 2});

  // The same seed gives the same draws, whether the weights are float32 or float64 (the sums run in
  // double either way, and these weights are exact in float32).
  Generator a(3), b(3);
  CHECK(multinomial(rows, 2, false, &a).to_vector<int64_t>() ==
        multinomial(rows.to(DType::Float32), 2, false, &b).to_vector<int64_t>());

  CHECK_THROWS_WITH_AS(multinomial(f64({1, -1, 2}), 1),
                       doctest::Contains("multinomial: weights must be finite, non-negative"), Error);
  CHECK_THROWS_WITH_AS(multinomial(f64({0, 0, 1, 1}, {2, 2}), 1),
                       doctest::Contains("row 0 of float64 [2, 2] sums to 0"), Error);
  CHECK_THROWS_WITH_AS(multinomial(f64({1, std::nan("")}), 1), doctest::Contains("sums to nan"), Error);
  // The row named is the bad one: row 0 is fine, row 1 holds -1.
  CHECK_THROWS_WITH_AS(multinomial(f64({1, 2, 3, -1}, {2, 2}), 1),
                       doctest::Contains("row 1 of float64 [2, 2] sums to 2 (smallest weight -1)"), Error);
  CHECK_THROWS_WITH_AS(multinomial(f64({1, 0, 1}), 3),
                       doctest::Contains("cannot draw 3 samples without replacement from row 0, which has 2 nonzero"),
                       Error);
  CHECK_THROWS_WITH_AS(multinomial(f64({1, 2}), 3), doctest::Contains("without replacement from 2 categories"), Error);
  CHECK_THROWS_WITH_AS(multinomial(from_vector(std::vector<int>{1, 2}), 1), doctest::Contains("weights must be floating"),
                       Error);
}
