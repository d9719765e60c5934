// Shared by the reduction ops and the fused row ops (softmax): which dims a reduction covers, what
// shape it leaves and how its input is laid out for the kernels.
#pragma once

#include "core/tensor.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace mf {

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
  /// Items per parallel_for chunk, so that a chunk covers about cpu::kParallelGrain elements.
  int64_t grain() const;
  Slab slab(int64_t item) const {
    int64_t block = item % blocks(), o = item / blocks(), c0 = block * kBlock;
    return {o * n * inner + c0, o * inner + c0, std::min(kBlock, inner - c0)};
  }
};

/// A view of x when it is contiguous and the reduced dims are adjacent (size-1 dims aside), else a
/// contiguous copy with the reduced dims moved last (inner = 1).
ReduceLayout reduce_layout(const Tensor& x, const ReducePlan& plan);

/// The column sums of a contiguous [n, width] block into out[width], on the calling thread: what
/// sum over dim 0 gives, bit for bit (the same slabs, summed in the same order).
template <typename T>
void sum_rows_here(const T* p, int64_t n, int64_t width, T* out);

}  // namespace mf
