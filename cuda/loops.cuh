// The CUDA counterpart of ops/cpu/loops.h: one grid-stride kernel maps a functor over operands of any
// strides, broadcast to the output's shape. The iteration space is planned on the host by ops/layout.h's
// LoopPlan (size-1 dims dropped, mergeable dims merged), so both devices walk tensors the same way.
#pragma once

#include "core/tensor.h"
#include "cuda/runtime.h"
#include "ops/kernel_api.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace mf::cuda {

/// The functor of plain copies (x -> x).
struct Identity {
  template <typename T> __device__ T operator()(T x) const { return x; }
};

/// Dims a planned loop may keep after merging (more raises an error naming the shape).
inline constexpr int kMaxDims = 10;

/// A LoopPlan flattened into fixed arrays, passed to kernels by value.
template <size_t N>
struct DevicePlan {
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // bytes
  char* base[N] = {};

  /// Byte offset of row-major element `i` in operand k's memory, for every k.
  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (size_t k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t index = i % sizes[d];
      i /= sizes[d];
      for (size_t k = 0; k < N; ++k) off[k] += index * strides[k][d];
    }
  }
};

/// Plans a loop over `shape` for operands read (broadcast) as that shape; operand 0 is usually the output.
template <size_t N>
DevicePlan<N> plan_for(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  LoopPlan<N> plan(shape, operands);
  MF_CHECK(plan.shape.size() <= static_cast<size_t>(kMaxDims),
           "CUDA loops support up to {} dims after merging, got shape {}", kMaxDims, shape_str(shape));
  DevicePlan<N> d;
  d.ndim = static_cast<int>(plan.shape.size());
  d.numel = shape_numel(shape);
  for (int i = 0; i < d.ndim; ++i) {
    d.sizes[i] = plan.shape[i];
    for (size_t k = 0; k < N; ++k) d.strides[k][i] = plan.strides[k][i];
  }
  for (size_t k = 0; k < N; ++k) d.base[k] = plan.base[k];
  return d;
}

template <typename Out, typename... In, typename Fn, size_t... I>
__device__ void map_one(const DevicePlan<sizeof...(In) + 1>& plan, int64_t i, const Fn& fn,
                        std::index_sequence<I...>) {
  int64_t off[sizeof...(In) + 1];
  plan.offsets(i, off);
  *reinterpret_cast<Out*>(plan.base[0] + off[0]) = fn(*reinterpret_cast<const In*>(plan.base[I + 1] + off[I + 1])...);
}

// nvcc wants a __global__ template's pack last.
template <typename Out, typename Fn, typename... In>
__global__ void map_kernel(DevicePlan<sizeof...(In) + 1> plan, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel;
       i += int64_t{gridDim.x} * blockDim.x)
    map_one<Out, In...>(plan, i, fn, std::index_sequence_for<In...>{});
}

/// out[i] = fn(in_0[i], in_1[i], ...) on out's device, inputs broadcast to out's shape: cpu::map's twin.
template <typename Out, typename... In, typename Fn>
void map(Tensor& out, const std::array<const Tensor*, sizeof...(In)>& inputs, Fn fn) {
  constexpr size_t N = sizeof...(In) + 1;
  std::array<const Tensor*, N> operands;
  operands[0] = &out;
  std::copy(inputs.begin(), inputs.end(), operands.begin() + 1);
  DevicePlan<N> plan = plan_for<N>(out.shape(), operands);
  if (plan.numel == 0) return;
  map_kernel<Out, Fn, In...><<<blocks_for(plan.numel), kThreads, 0, stream(out.device().index)>>>(plan, fn);
  check_launch("map");
}

}  // namespace mf::cuda
