// CPU helpers of the reduction ops and the fused row ops (softmax), over the layouts of ops/layout.h.
#pragma once

#include "ops/layout.h"

#include <cstdint>

namespace mf {

/// The column sums of a contiguous [n, width] block into out[width], on the calling thread: what
/// sum over dim 0 gives, bit for bit (the same slabs, summed in the same order).
template <typename T>
void sum_rows_here(const T* p, int64_t n, int64_t width, T* out);

}  // namespace mf
