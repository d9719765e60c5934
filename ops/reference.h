// Naive references the registry-driven tests hold the kernels against: plain index loops in double,
// written for clarity rather than speed, sharing nothing with the kernels they check.
#pragma once

#include "core/tensor.h"

#include <functional>
#include <span>
#include <vector>

namespace mf::reference {

/// Visits every index of `shape` in row-major order.
void for_each_index(const Shape& shape, const std::function<void(const Shape&)>& fn);

/// The element of `t` read at `index` of a broadcast shape (right-aligned, size-1 dims repeat).
double value_at_broadcast(const Tensor& t, const Shape& index);

/// out[i] = fn(inputs at i), inputs broadcast to their common shape, computed in double.
Tensor map(const std::vector<Tensor>& inputs, DType out_dtype,
           const std::function<double(std::span<const double>)>& fn);

/// A contiguous CPU tensor of `shape` and `dtype` holding `values` (row-major).
Tensor make(const Shape& shape, DType dtype, const std::vector<double>& values);

/// Float64 tensor with values drawn from a fixed-seed normal distribution (test inputs).
Tensor randn(const Shape& shape, uint64_t seed);
/// Float64 tensor uniform on [low, high) from a fixed seed.
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed);
/// Int64 tensor uniform on [0, high) from a fixed seed.
Tensor randint(const Shape& shape, int64_t high, uint64_t seed);

/// Dropout's scale for element i of a contiguous tensor on the Philox stream (seed, counter): 1/(1-p)
/// where word i % 4 of block counter + i / 4, as a uniform on [0, 1), is >= p, else 0.
double dropout_scale(uint64_t seed, uint64_t counter, double p, int64_t i);

}  // namespace mf::reference
