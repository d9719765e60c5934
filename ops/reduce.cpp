// Reductions over any set of dims, with keepdim. Kernels view the input as [outer, reduced] rows and
// reduce each row on one thread, so results do not depend on the thread count.
#include "ops/families.h"
#include "ops/loops.h"
#include "ops/ops.h"
#include "ops/reduce_util.h"
#include "ops/reference.h"

#include <algorithm>
#include <numeric>

namespace mf {

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

Tensor rows_to_reduce(const Tensor& x, const ReducePlan& plan) {
  Shape order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!plan.reduced[d]) order.push_back(d);
  for (int64_t d = 0; d < x.dim(); ++d)
    if (plan.reduced[d]) order.push_back(d);
  int64_t inner = plan.reduced_numel;
  int64_t outer = inner == 0 ? shape_numel(plan.kept_shape) : x.numel() / std::max<int64_t>(inner, 1);
  return x.permute(order).contiguous().view({outer, inner});
}

namespace {

std::vector<OutputSpec> infer_sum(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  DType dtype = x.dtype() == DType::Bool ? DType::Int64 : x.dtype();
  return {{plan_reduction(x, attrs.dims, attrs.keepdim).out_shape, dtype}};
}

void cpu_sum(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  ReducePlan plan = plan_reduction(in[0], attrs.dims, attrs.keepdim);
  Tensor rows = rows_to_reduce(in[0].to(out[0].dtype()), plan);  // [outer, reduced]
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      const T* inp = rows.data_ptr<T>();
      T* o = out[0].data_ptr<T>();
      int64_t n = rows.size(1);
      parallel_for(0, rows.size(0), std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row)
                       o[row] = std::accumulate(inp + row * n, inp + (row + 1) * n, T{0});
                   });
    }
  });
}

std::vector<Tensor> sum_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  ReducePlan plan = plan_reduction(x, ctx.attrs.dims, ctx.attrs.keepdim);
  return {ctx.grads[0].reshape(plan.kept_shape).expand(x.shape())};
}

std::vector<Tensor> reference_sum(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  ReducePlan plan = plan_reduction(x, attrs.dims, attrs.keepdim);
  std::vector<double> totals(static_cast<size_t>(shape_numel(plan.kept_shape)), 0.0);
  Shape kept_strides = contiguous_strides(plan.kept_shape);
  reference::for_each_index(x.shape(), [&](const Shape& index) {
    int64_t position = 0;
    for (size_t d = 0; d < index.size(); ++d)
      if (!plan.reduced[d]) position += index[d] * kept_strides[d];
    totals[position] += x.at<double>(index);
  });
  return {reference::make(plan.out_shape, x.dtype() == DType::Bool ? DType::Int64 : x.dtype(), totals)};
}

std::vector<Sample> reduction_samples() {
  return {
      {"all dims", {reference::randn({3, 4}, 61)}, {}},
      {"last dim", {reference::randn({3, 4}, 62)}, {.dims = {-1}}},
      {"first dim, keepdim", {reference::randn({3, 4}, 63)}, {.dims = {0}, .keepdim = true}},
      {"two of three dims", {reference::randn({2, 3, 4}, 64)}, {.dims = {0, 2}}},
      {"scalar", {reference::randn({}, 65)}, {}},
  };
}

}  // namespace

void register_reduction_ops(Registry& r) {
  r.define(OpId::sum, {.name = "sum", .infer = infer_sum, .kernels = {cpu_sum}, .backward = sum_backward,
                       .samples = reduction_samples, .reference = reference_sum});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1(OpId::sum, {x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor sum_to(const Tensor& x, const Shape& shape, Site site) {
  if (x.shape() == shape) return x;
  MF_CHECK(shape.size() <= x.shape().size(), "sum_to: cannot sum shape {} to {} at {}", shape_str(x.shape()),
           shape_str(shape), format_location(site));
  size_t lead = x.shape().size() - shape.size();
  Shape dims;
  for (size_t d = 0; d < x.shape().size(); ++d) {
    if (d < lead) {
      dims.push_back(static_cast<int64_t>(d));
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(static_cast<int64_t>(d));
    } else {
      MF_CHECK(shape[d - lead] == x.shape()[d], "sum_to: cannot sum shape {} to {} at {}", shape_str(x.shape()),
               shape_str(shape), format_location(site));
    }
  }
  if (dims.empty()) return x.reshape(shape, site);
  return sum(x, dims, true, site).reshape(shape, site);
}

Tensor Tensor::sum(const Shape& dims, bool keepdim, Site site) const { return mf::sum(*this, dims, keepdim, site); }

}  // namespace mf
