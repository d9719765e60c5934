// How kernels on every device walk tensors: the iteration space of strided, broadcast operands
// (LoopPlan) and the [outer, n, inner] layout of a reduction (ReduceLayout). Device-independent, so
// that the CPU and CUDA kernels walk tensors alike; kernel authors outside ops reach it through
// ops/kernel_api.h.
#pragma once

#include "core/tensor.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace mf {

/// Byte strides of `t` read as `shape` (broadcasting).
Shape byte_strides_for(const Tensor& t, const Shape& shape);

/// The iteration space of N operands over one shape, with size-1 dims dropped and mergeable dims merged.
template <size_t N>
struct LoopPlan {
  Shape shape;                       // outer dims ..., inner dim last
  std::array<Shape, N> strides;      // bytes, per operand, per dim
  std::array<char*, N> base;

  LoopPlan(const Shape& full_shape, const std::array<const Tensor*, N>& operands) {
    std::array<Shape, N> full;
    for (size_t k = 0; k < N; ++k) {
      full[k] = byte_strides_for(*operands[k], full_shape);
      base[k] = static_cast<char*>(operands[k]->raw_data());
    }
    for (size_t d = 0; d < full_shape.size(); ++d) {
      if (full_shape[d] == 1) continue;
      bool merge = !shape.empty();
      for (size_t k = 0; k < N && merge; ++k) merge = strides[k].back() == full[k][d] * full_shape[d];
      if (merge) {
        shape.back() *= full_shape[d];
        for (size_t k = 0; k < N; ++k) strides[k].back() = full[k][d];
      } else {
        shape.push_back(full_shape[d]);
        for (size_t k = 0; k < N; ++k) strides[k].push_back(full[k][d]);
      }
    }
    if (shape.empty()) {
      shape.push_back(1);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(0);
    }
  }

  int64_t inner() const { return shape.back(); }
  int64_t outer() const { return shape.back() == 0 ? 0 : shape_numel(shape) / shape.back(); }
};

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // with or without the reduced dims, per keepdim
  Shape kept_shape;           // out_shape with reduced dims as size 1 (broadcasts against the input)
  int64_t reduced_numel = 1;  // elements folded into each output element
};

/// Normalises `dims` (empty = all), rejecting repeats and out-of-range dims.
ReducePlan plan_reduction(const Tensor& x, const Shape& dims, bool keepdim);

/// A reduction's input as a contiguous [outer, n, inner] block, n the reduced extent: output element
/// o * inner + i folds data[o, :, i]. Kernels run it as work items: single rows when inner is 1,
/// else slabs of up to kBlock columns of one [n, inner] block, each on one thread.
struct ReduceLayout {
  static constexpr int64_t kBlock = 256;
  Tensor data;
  int64_t outer = 1, n = 1, inner = 1;

  struct Slab {
    int64_t offset;  // of its first element in data
    int64_t out;     // its first output element
    int64_t width;   // columns, 1 for a row
  };
  int64_t blocks() const { return (inner + kBlock - 1) / kBlock; }
  int64_t items() const { return outer * blocks(); }
  Slab slab(int64_t item) const {
    int64_t block = item % blocks(), o = item / blocks(), c0 = block * kBlock;
    return {o * n * inner + c0, o * inner + c0, std::min(kBlock, inner - c0)};
  }
};

/// A view of x when it is contiguous and the reduced dims are adjacent (size-1 dims aside), else a
/// contiguous copy with the reduced dims moved last (inner = 1).
ReduceLayout reduce_layout(const Tensor& x, const ReducePlan& plan);

}  // namespace mf
