// The loop and reduction layouts of ops/layout.h, shared by the CPU and CUDA kernels.
#include "ops/layout.h"

#include "core/error.h"

namespace mf {

Shape byte_strides_for(const Tensor& t, const Shape& shape) {
  Shape strides = broadcast_strides(t.shape(), t.strides(), shape);
  for (int64_t& stride : strides) stride *= static_cast<int64_t>(t.element_size());
  return strides;
}

ReducePlan plan_reduction(const Tensor& x, const Shape& dims, bool keepdim) {
  ReducePlan plan;
  plan.reduced.assign(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) {
    int64_t dim = normalize_dim(d, x.dim());
    if (x.dim() == 0) continue;
    MF_CHECK(!plan.reduced[dim], "dim {} appears twice in {}", dim, shape_str(dims));
    plan.reduced[dim] = true;
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    int64_t size = x.shape()[d];
    if (plan.reduced[d]) {
      plan.reduced_numel *= size;
      plan.kept_shape.push_back(1);
      if (keepdim) plan.out_shape.push_back(1);
    } else {
      plan.kept_shape.push_back(size);
      plan.out_shape.push_back(size);
    }
  }
  return plan;
}

ReduceLayout reduce_layout(const Tensor& x, const ReducePlan& plan) {
  ReduceLayout layout;
  layout.n = plan.reduced_numel;
  if (x.numel() == 0) {  // no element is read: no rows, or rows of none
    layout.outer = shape_numel(plan.kept_shape);
    layout.data = Tensor::empty({0}, x.dtype(), x.device());
    return layout;
  }
  // The reduced dims of size > 1 must be one run, broken by no kept dim of size > 1.
  int64_t first = x.dim(), last = -1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!plan.reduced[d] || x.shape()[d] == 1) continue;
    if (last < 0) first = d;
    last = d;
  }
  bool adjacent = true;
  for (int64_t d = first; d < last; ++d) adjacent &= plan.reduced[d] || x.shape()[d] == 1;
  if (adjacent) {
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!plan.reduced[d] || x.shape()[d] == 1) (d < first ? layout.outer : layout.inner) *= x.shape()[d];
    layout.data = x.contiguous();
    return layout;
  }
  Shape order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!plan.reduced[d]) order.push_back(d);
  for (int64_t d = 0; d < x.dim(); ++d)
    if (plan.reduced[d]) order.push_back(d);
  layout.outer = shape_numel(plan.kept_shape);
  layout.data = x.permute(order).contiguous();
  return layout;
}

}  // namespace mf
