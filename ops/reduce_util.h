// Shared by the reduction ops: which dims a reduction covers and what shape it leaves.
#pragma once

#include "core/tensor.h"

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

/// `x` as a contiguous [outer, reduced] matrix: kept dims first, reduced dims last (a copy unless
/// the reduced dims are already innermost).
Tensor rows_to_reduce(const Tensor& x, const ReducePlan& plan);

}  // namespace mf
