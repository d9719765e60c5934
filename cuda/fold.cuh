// Folding the reduced extent of a ReduceLayout ([outer, n, inner], see ops/layout.h) on the GPU,
// shared by the reductions and softmax. Rows (inner == 1) are folded by one block each, all threads
// striding along the row and meeting in shared memory; columns (inner > 1) by one thread each, so
// neighbouring threads read neighbouring addresses.
#pragma once

#include "cuda/loops.cuh"

#include <cstdint>

namespace mf::cuda {

struct Plus {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
/// max (Greater) or min that keeps a NaN once one was folded, as PyTorch's amax / amin.
template <bool Greater>
struct Extreme {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return (Greater ? b > a : b < a) ? b : a;
  }
};
/// n values p[0], p[stride], ... folded by the whole block; every thread gets the result. All threads
/// of the block must call it (it synchronises).
template <typename T>
struct BlockFold {
  const T* p;
  int64_t n, stride;

  template <typename Combine, typename F>
  __device__ T operator()(T init, Combine combine, F f) const {
    __shared__ double raw[kThreads];  // double-sized slots hold any element type
    T* shared = reinterpret_cast<T*>(raw);
    T acc = init;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) acc = combine(acc, f(p[r * stride]));
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + s]);
      __syncthreads();
    }
    T result = shared[0];
    __syncthreads();
    return result;
  }

  /// True for the one thread that writes the fold's results.
  __device__ bool leader() const { return threadIdx.x == 0; }

  /// Calls f(r * stride) for every r in [0, n), the rows split across the block's threads.
  template <typename F>
  __device__ void each(F f) const {
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) f(r * stride);
  }
};

/// n values p[0], p[stride], ... folded by one thread, in order.
template <typename T>
struct ThreadFold {
  const T* p;
  int64_t n, stride;

  template <typename Combine, typename F>
  __device__ T operator()(T init, Combine combine, F f) const {
    T acc = init;
    for (int64_t r = 0; r < n; ++r) acc = combine(acc, f(p[r * stride]));
    return acc;
  }

  __device__ bool leader() const { return true; }

  /// Calls f(r * stride) for every r in [0, n), in order.
  template <typename F>
  __device__ void each(F f) const {
    for (int64_t r = 0; r < n; ++r) f(r * stride);
  }
};

/// Runs row(fold, o * n * inner + i, o * inner + i) for every output element (o, i) of an
/// [outer, n, inner] layout, with fold a BlockFold (inner == 1) or ThreadFold over that element's n values.
template <typename T, typename Row>
__global__ void fold_rows_kernel(const T* data, int64_t outer, int64_t n, Row row) {
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) row(BlockFold<T>{data + o * n, n, 1}, o * n, o);
}

template <typename T, typename Row>
__global__ void fold_columns_kernel(const T* data, int64_t outer, int64_t n, int64_t inner, Row row) {
  int64_t total = outer * inner;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t o = k / inner, i = k % inner;
    row(ThreadFold<T>{data + o * n * inner + i, n, inner}, o * n * inner + i, k);
  }
}

/// Launches `row` over every output element of the layout on `device`'s stream.
template <typename T, typename Row>
void fold_layout(int device, const T* data, int64_t outer, int64_t n, int64_t inner, Row row) {
  if (outer * inner == 0) return;
  cudaStream_t s = stream(device);
  if (inner == 1) {
    fold_rows_kernel<T><<<blocks_for_rows(outer), kThreads, 0, s>>>(data, outer, n, row);
  } else {
    fold_columns_kernel<T><<<blocks_for(outer * inner), kThreads, 0, s>>>(data, outer, n, inner, row);
  }
  check_launch("fold_layout");
}

}  // namespace mf::cuda
