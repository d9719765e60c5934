// Reductions over any set of dims, with keepdim: sum, mean, var, amax, amin, and the single-dim
// reductions that also give indices (max_dim, min_dim, argmax). Kernels view the input as
// [outer, reduced] rows and reduce each row on one thread, so results do not depend on the thread
// count.
#include "ops/families.h"
#include "ops/loops.h"
#include "ops/ops.h"
#include "ops/reduce_util.h"
#include "ops/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  if (x.numel() == 0) return Tensor::empty({outer, inner}, x.dtype(), x.device());  // nothing to copy
  return x.permute(order).contiguous().view({outer, inner});
}

namespace {

// ---- shared fronts ------------------------------------------------------------------------------

/// Rejects a reduction with no identity (max, min) over no elements, as PyTorch does.
void check_not_empty(const Tensor& x, const ReducePlan& plan) {
  if (plan.reduced_numel > 0) return;
  for (int64_t d = 0; d < x.dim(); ++d)
    MF_CHECK(!plan.reduced[d] || x.shape()[d] > 0, "cannot reduce over dim {} of size 0 in shape {} (there is no "
             "identity)", d, shape_str(x.shape()));
}

void check_floating(const Tensor& x) {
  MF_CHECK(is_floating(x.dtype()), "expects a float32 or float64 tensor, got {} of shape {} (cast it first)",
           dtype_name(x.dtype()), shape_str(x.shape()));
}

std::vector<OutputSpec> infer_sum(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  DType dtype = x.dtype() == DType::Bool ? DType::Int64 : x.dtype();
  return {{plan_reduction(x, attrs.dims, attrs.keepdim).out_shape, dtype}};
}

std::vector<OutputSpec> infer_float_reduction(const std::vector<Tensor>& in, const Attrs& attrs) {
  check_floating(in[0]);
  return {{plan_reduction(in[0], attrs.dims, attrs.keepdim).out_shape, in[0].dtype()}};
}

std::vector<OutputSpec> infer_extreme(const std::vector<Tensor>& in, const Attrs& attrs) {
  ReducePlan plan = plan_reduction(in[0], attrs.dims, attrs.keepdim);
  check_not_empty(in[0], plan);
  return {{plan.out_shape, in[0].dtype()}};
}

/// The single-dim reductions: plan over Attrs.dim, refusing an empty dim.
ReducePlan plan_dim(const Tensor& x, const Attrs& attrs) {
  ReducePlan plan = plan_reduction(x, {attrs.dim}, attrs.keepdim);
  check_not_empty(x, plan);
  return plan;
}

std::vector<OutputSpec> infer_values_indices(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape shape = plan_dim(in[0], attrs).out_shape;
  return {{shape, in[0].dtype()}, {shape, DType::Int64}};
}

std::vector<OutputSpec> infer_argmax(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {{plan_dim(in[0], attrs).out_shape, DType::Int64}};
}

// ---- kernels ------------------------------------------------------------------------------------

// Row reducers: Row{}(p, n, attrs) folds one contiguous row of n elements.
struct SumRow {
  template <typename T> T operator()(const T* p, int64_t n, const Attrs&) const { return cpu::row_sum(p, n); }
};
struct MeanRow {
  template <typename T> T operator()(const T* p, int64_t n, const Attrs&) const {
    return cpu::row_sum(p, n) / static_cast<T>(n);  // 0 / 0 = NaN for an empty row, as in PyTorch
  }
};
// Two passes (mean, then squared deviations), which stays accurate when the mean dwarfs the spread.
struct VarRow {
  template <typename T> T operator()(const T* p, int64_t n, const Attrs& attrs) const {
    T mean = cpu::row_sum(p, n) / static_cast<T>(n);
    T squares = cpu::row_sum(p, n, [mean](auto v) { return (v - mean) * (v - mean); });
    return squares / static_cast<T>(std::max<int64_t>(n - attrs.correction, 0));
  }
};
template <bool Greater>
struct ExtremeRow {
  template <typename T> T operator()(const T* p, int64_t n, const Attrs&) const {
    return cpu::row_extreme<Greater>(p, n);
  }
};

/// out[row] = Row over each reduced row. Arithmetic reducers skip bool (sum reads bool as int64).
template <typename Row, bool kArithmetic = true>
void cpu_reduce(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  ReducePlan plan = plan_reduction(in[0], attrs.dims, attrs.keepdim);
  Tensor rows = rows_to_reduce(in[0].to(out[0].dtype()), plan);  // [outer, reduced]
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!(kArithmetic && std::is_same_v<T, bool>)) {
      T* o = out[0].data_ptr<T>();
      cpu::for_each_row<T>(rows, [&](int64_t row, const T* p, int64_t n) { o[row] = Row{}(p, n, attrs); });
    }
  });
}

/// Index of the first extreme along Attrs.dim, and for max_dim / min_dim (two outputs) its value.
template <bool Greater>
void cpu_arg_extreme(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor rows = rows_to_reduce(in[0], plan_reduction(in[0], {attrs.dim}, attrs.keepdim));  // [outer, size]
  visit_dtype(in[0].dtype(), [&]<typename T>() {
    int64_t* indices = out.back().data_ptr<int64_t>();
    T* values = out.size() == 2 ? out[0].data_ptr<T>() : nullptr;
    cpu::for_each_row<T>(rows, [&](int64_t row, const T* p, int64_t n) {
      int64_t best = cpu::row_arg_extreme<Greater>(p, n);
      indices[row] = best;
      if (values) values[row] = p[best];
    });
  });
}

// ---- backward rules -----------------------------------------------------------------------------

/// The output gradient with the reduced dims restored as size 1, so it broadcasts against x.
Tensor kept_grad(const GradContext& ctx, const Shape& dims) {
  return ctx.grads[0].reshape(plan_reduction(ctx.inputs[0], dims, ctx.attrs.keepdim).kept_shape);
}

std::vector<Tensor> sum_backward(const GradContext& ctx) {
  return {kept_grad(ctx, ctx.attrs.dims).expand(ctx.inputs[0].shape())};
}

std::vector<Tensor> mean_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int64_t count = plan_reduction(x, ctx.attrs.dims, ctx.attrs.keepdim).reduced_numel;
  return {kept_grad(ctx, ctx.attrs.dims).expand(x.shape()).div(static_cast<double>(count))};
}

// d var / dx_i = 2 (x_i - mean) / (N - correction); the mean's own dependence on x_i cancels.
std::vector<Tensor> var_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  int64_t count = plan_reduction(x, ctx.attrs.dims, ctx.attrs.keepdim).reduced_numel;
  Tensor centred = sub(x, mean(x, ctx.attrs.dims, true));
  return {mul(centred, kept_grad(ctx, ctx.attrs.dims).mul(2.0 / static_cast<double>(count - ctx.attrs.correction)))};
}

// The gradient is shared evenly among the elements equal to the extreme (PyTorch's amax).
std::vector<Tensor> extreme_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Shape kept = plan_reduction(x, ctx.attrs.dims, ctx.attrs.keepdim).kept_shape;
  Tensor hits = call1(OpId::eq, {x, ctx.outputs[0].reshape(kept)}).to(x.dtype());
  return {mul(hits, div(kept_grad(ctx, ctx.attrs.dims), sum(hits, ctx.attrs.dims, true)))};
}

// The gradient goes to the chosen index alone: positions along the dim are compared with it.
std::vector<Tensor> arg_extreme_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dim() == 0) return {ctx.grads[0]};
  int64_t dim = normalize_dim(ctx.attrs.dim, x.dim());
  std::vector<int64_t> positions(static_cast<size_t>(x.shape()[dim]));
  std::iota(positions.begin(), positions.end(), 0);
  Shape grid_shape(static_cast<size_t>(x.dim() - dim), 1);
  grid_shape[0] = x.shape()[dim];  // [size, 1, ...]: broadcasts along the dims after `dim`
  Tensor grid = from_vector(positions, grid_shape, x.device());
  Shape kept = plan_reduction(x, {dim}, ctx.attrs.keepdim).kept_shape;
  Tensor chosen = call1(OpId::eq, {grid, ctx.outputs[1].reshape(kept)}).to(x.dtype());
  return {mul(chosen, kept_grad(ctx, {dim}))};
}

// ---- naive references ---------------------------------------------------------------------------

/// The values each output element folds, in the input's row-major order (so a single reduced dim's
/// values come in index order), one group per output element.
std::vector<std::vector<double>> reference_groups(const Tensor& x, const ReducePlan& plan) {
  std::vector<std::vector<double>> groups(static_cast<size_t>(shape_numel(plan.kept_shape)));
  Shape kept_strides = contiguous_strides(plan.kept_shape);
  reference::for_each_index(x.shape(), [&](const Shape& index) {
    int64_t position = 0;
    for (size_t d = 0; d < index.size(); ++d)
      if (!plan.reduced[d]) position += index[d] * kept_strides[d];
    groups[position].push_back(x.at<double>(index));
  });
  return groups;
}

/// One output element per group, computed by fold(group, attrs).
template <typename Fold>
std::vector<Tensor> reference_reduce(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  ReducePlan plan = plan_reduction(x, attrs.dims, attrs.keepdim);
  std::vector<double> values;
  for (const std::vector<double>& group : reference_groups(x, plan)) values.push_back(Fold{}(group, attrs));
  return {reference::make(plan.out_shape, x.dtype() == DType::Bool ? DType::Int64 : x.dtype(), values)};
}

struct SumFold {
  double operator()(const std::vector<double>& v, const Attrs&) const {
    double total = 0;
    for (double e : v) total += e;
    return total;
  }
};
struct MeanFold {
  double operator()(const std::vector<double>& v, const Attrs& attrs) const {
    return SumFold{}(v, attrs) / static_cast<double>(v.size());
  }
};
struct VarFold {
  double operator()(const std::vector<double>& v, const Attrs& attrs) const {
    double mean = MeanFold{}(v, attrs), squares = 0;
    for (double e : v) squares += (e - mean) * (e - mean);
    return squares / static_cast<double>(std::max<int64_t>(static_cast<int64_t>(v.size()) - attrs.correction, 0));
  }
};
template <bool Greater>
struct ExtremeFold {
  double operator()(const std::vector<double>& v, const Attrs&) const {
    double best = v[0];
    for (double e : v) best = Greater ? std::max(best, e) : std::min(best, e);
    return best;
  }
};

/// Values and first indices of the extremes along Attrs.dim (indices only when `with_values` is
/// false).
template <bool Greater, bool kWithValues>
std::vector<Tensor> reference_arg_extreme(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  ReducePlan plan = plan_reduction(x, {attrs.dim}, attrs.keepdim);
  std::vector<double> values, indices;
  for (const std::vector<double>& group : reference_groups(x, plan)) {
    size_t best = 0;
    for (size_t i = 1; i < group.size(); ++i)
      if (Greater ? group[i] > group[best] : group[i] < group[best]) best = i;
    values.push_back(group[best]);
    indices.push_back(static_cast<double>(best));
  }
  Tensor index_tensor = reference::make(plan.out_shape, DType::Int64, indices);
  if (!kWithValues) return {index_tensor};
  return {reference::make(plan.out_shape, x.dtype(), values), index_tensor};
}

// ---- samples ------------------------------------------------------------------------------------

std::vector<Sample> reduction_samples() {
  return {
      {"all dims", {reference::randn({3, 4}, 61)}, {}},
      {"last dim", {reference::randn({3, 4}, 62)}, {.dims = {-1}}},
      {"first dim, keepdim", {reference::randn({3, 4}, 63)}, {.dims = {0}, .keepdim = true}},
      {"two of three dims", {reference::randn({2, 3, 4}, 64)}, {.dims = {0, 2}}},
      {"size-1 dim", {reference::randn({3, 1, 2}, 66)}, {.dims = {1}}},
      {"scalar", {reference::randn({}, 65)}, {}},
  };
}

std::vector<double> offset_values() {
  std::vector<double> values;
  for (int i = 0; i < 32; ++i) values.push_back(1e4 + (i * 5 % 16) / 8.0);
  return values;
}

std::vector<Sample> var_samples() {
  std::vector<Sample> samples = {
      {"correction 0", {reference::randn({3, 5}, 67)}, {.dims = {1}, .correction = 0}},
      {"correction 2, keepdim", {reference::randn({2, 6}, 68)}, {.dims = {-1}, .keepdim = true, .correction = 2}},
      // A large mean over a small spread (values exact in float32): one-pass sum-of-squares formulas
      // lose every digit here.
      {"offset 1e4", {reference::make({4, 8}, DType::Float64, offset_values())}, {.dims = {1}}},
  };
  for (Sample& s : reduction_samples())
    if (s.name != "scalar" && s.name != "size-1 dim") samples.push_back(s);  // one element: 0 / 0
  return samples;
}

// Two-way ties: central differences see half the step on each tied element, which is exactly the
// even split the rule gives.
std::vector<Sample> extreme_samples() {
  std::vector<Sample> samples = reduction_samples();
  samples.push_back({"two-way ties", {reference::make({2, 4}, DType::Float64, {1, 3, 3, 1, 5, 0, 5, 0})},
                     {.dims = {1}}});
  return samples;
}

std::vector<Sample> arg_extreme_samples() {
  return {
      {"last dim", {reference::randn({3, 5}, 71)}, {.dim = -1}},
      {"middle dim, keepdim", {reference::randn({2, 3, 4}, 72)}, {.dim = 1, .keepdim = true}},
      {"first dim", {reference::randn({4, 3}, 73)}, {.dim = 0}},
      {"size-1 dim", {reference::randn({3, 1}, 74)}, {.dim = 1}},
      {"scalar", {reference::randn({}, 75)}, {.dim = 0}},
      // The first index wins a tie; finite differences at a tie see a kink, not that choice.
      {"ties", {reference::make({2, 4}, DType::Float64, {1, 3, 3, 1, 5, 0, 5, 0})}, {.dim = 1}, {}, false},
  };
}

}  // namespace

void register_reduction_ops(Registry& r) {
  r.define(OpId::sum, {.name = "sum", .infer = infer_sum, .kernels = {cpu_reduce<SumRow>}, .backward = sum_backward,
                       .samples = reduction_samples, .reference = reference_reduce<SumFold>});
  r.define(OpId::mean, {.name = "mean", .infer = infer_float_reduction, .kernels = {cpu_reduce<MeanRow>},
                        .backward = mean_backward, .samples = reduction_samples,
                        .reference = reference_reduce<MeanFold>});
  r.define(OpId::var, {.name = "var", .infer = infer_float_reduction, .kernels = {cpu_reduce<VarRow>},
                       .backward = var_backward, .samples = var_samples, .reference = reference_reduce<VarFold>});
  r.define(OpId::amax, {.name = "amax", .infer = infer_extreme, .kernels = {cpu_reduce<ExtremeRow<true>, false>},
                        .backward = extreme_backward, .saves_outputs = true, .samples = extreme_samples,
                        .reference = reference_reduce<ExtremeFold<true>>});
  r.define(OpId::amin, {.name = "amin", .infer = infer_extreme, .kernels = {cpu_reduce<ExtremeRow<false>, false>},
                        .backward = extreme_backward, .saves_outputs = true, .samples = extreme_samples,
                        .reference = reference_reduce<ExtremeFold<false>>});
  r.define(OpId::max_dim, {.name = "max_dim", .infer = infer_values_indices, .kernels = {cpu_arg_extreme<true>},
                           .backward = arg_extreme_backward, .saves_outputs = true, .samples = arg_extreme_samples,
                           .reference = reference_arg_extreme<true, true>});
  r.define(OpId::min_dim, {.name = "min_dim", .infer = infer_values_indices, .kernels = {cpu_arg_extreme<false>},
                           .backward = arg_extreme_backward, .saves_outputs = true, .samples = arg_extreme_samples,
                           .reference = reference_arg_extreme<false, true>});
  r.define(OpId::argmax, {.name = "argmax", .infer = infer_argmax, .kernels = {cpu_arg_extreme<true>},
                          .saves_inputs = false, .samples = arg_extreme_samples,
                          .reference = reference_arg_extreme<true, false>});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1(OpId::sum, {x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1(OpId::mean, {x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim, Site site) {
  return call1(OpId::var, {x}, {.dims = dims, .keepdim = keepdim, .correction = correction}, site);
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1(OpId::amax, {x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor amin(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1(OpId::amin, {x}, {.dims = dims, .keepdim = keepdim}, site);
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
Tensor Tensor::mean(const Shape& dims, bool keepdim, Site site) const { return mf::mean(*this, dims, keepdim, site); }
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim, Site site) const {
  return mf::var(*this, dims, correction, keepdim, site);
}
Tensor Tensor::max(Site site) const { return amax(*this, {}, false, site); }
Tensor Tensor::min(Site site) const { return amin(*this, {}, false, site); }

std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim, Site site) const {
  std::vector<Tensor> out = call(OpId::max_dim, {*this}, {.dim = dim, .keepdim = keepdim}, site);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim, Site site) const {
  std::vector<Tensor> out = call(OpId::min_dim, {*this}, {.dim = dim, .keepdim = keepdim}, site);
  return {out[0], out[1]};
}

Tensor Tensor::argmax(int64_t dim, bool keepdim, Site site) const {
  return call1(OpId::argmax, {*this}, {.dim = dim, .keepdim = keepdim}, site);
}

}  // namespace mf
