// CPU helpers of the reduction ops and the fused row ops (softmax), over the layouts of ops/layout.h.
#pragma once

#include "ops/cpu/loops.h"
#include "ops/layout.h"

#include <algorithm>

#include <cstdint>

namespace mf {

/// Work items of `layout` per parallel_for chunk, so that a chunk covers about cpu::kParallelGrain
/// elements.
inline int64_t slab_grain(const ReduceLayout& layout) {
  return std::max<int64_t>(1, cpu::kParallelGrain /
                                  std::max<int64_t>(layout.n * std::min(layout.inner, ReduceLayout::kBlock), 1));
}

/// The column sums of a contiguous [n, width] block into out[width], on the calling thread: what
/// sum over dim 0 gives, bit for bit (the same slabs, summed in the same order).
template <typename T>
void sum_rows_here(const T* p, int64_t n, int64_t width, T* out);

}  // namespace mf
