// Shared pieces of the property suite (test_properties.cpp): a seeded random source, random shapes,
// values drawn like an op's samples, and per-op generators of valid and invalid calls.
#pragma once

#include "miniflow.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace mf::props {

/// Every random choice of one property case comes from here, so (seed, op) reproduces the case.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  /// Uniform integer in [lo, hi] (both included).
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  /// A fresh seed for reference::randn and friends.
  uint64_t seed() { return engine_(); }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(integer(0, static_cast<int64_t>(items.size()) - 1))];
  }

 private:
  std::mt19937_64 engine_;
};

/// One generated call: inputs as contiguous logical values, and the op's attributes.
struct Case {
  std::vector<Tensor> inputs;
  Attrs attrs;
  std::vector<bool> no_grad = {};  // float inputs the op does not differentiate
  bool gradcheck = true;           // false where finite differences cannot agree (ties, -inf entries)
  bool expandable = true;          // inputs may arrive as stride-0 expanded views
};

/// A dim size: 0 now and then, often 1, else 2..max.
int64_t random_size(Rng& rng, int64_t max);
/// A shape of rank in [min_rank, max_rank], sizes from random_size (max 5, or 3 when small).
Shape random_shape(Rng& rng, int64_t min_rank, int64_t max_rank, bool small);
/// `dim` in [0, rank) written as itself or as its negative alias.
int64_t random_alias(Rng& rng, int64_t dim, int64_t rank);

/// Values of `shape` drawn like `like` (a sample input): same dtype, float values uniform on the
/// sample's range (integers on its range where every sample value is an integer), bools at random.
Tensor draw_like(const Tensor& like, const Shape& shape, Rng& rng);
/// Int64 values uniform on [0, high) (high > 0) of `shape`.
Tensor random_indices(const Shape& shape, int64_t high, Rng& rng);
/// Whether every value of a float tensor is an integer (ties are then likely).
bool integer_valued(const Tensor& t);

/// A valid call of `id` derived from `sample` (its dtypes, value ranges and attributes), with random
/// shapes; `small` keeps tensors small enough for finite differences.
using ValidGenerator = std::function<Case(const Sample& sample, Rng& rng, bool small)>;
/// The generator for `id`, or an empty function when the suite does not know the op yet.
ValidGenerator valid_generator(OpId id);

/// A call the op must refuse, and why.
struct Invalid {
  std::string what;
  std::vector<Tensor> inputs;
  Attrs attrs;
  bool as_laid_out = false;  // the inputs' layout is the point: the suite must not lay them out anew
};
/// Calls of `id` that break its contract, derived from a valid case (none for ops that accept any
/// input); nullopt when the suite does not know the op yet (the caller fails the op then).
std::optional<std::vector<Invalid>> invalid_cases(OpId id, const Case& valid, Rng& rng);

}  // namespace mf::props
