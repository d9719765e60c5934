// Reductions over any set of dims, with keepdim: sum, mean, var, amax, amin, and the single-dim
// reductions that also give indices (max_dim, min_dim, argmax). Kernels read the input as
// [outer, reduced, inner] without copying when the reduced dims are adjacent: contiguous rows when
// inner is 1, else column slabs whose loops vectorise across inner. Each output element is folded
// on one thread in a fixed order, so results do not depend on the thread count.
#include "ops/families.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/cpu/reduce_util.h"
#include "ops/reference.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

namespace mf {

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
  const ReduceParams& reduce = reduction_of(attrs);
  return {{plan_reduction(x, reduce.dims, reduce.keepdim).out_shape, dtype}};
}

std::vector<OutputSpec> infer_float_reduction(const std::vector<Tensor>& in, const Attrs& attrs) {
  check_floating(in[0]);
  const ReduceParams& reduce = reduction_of(attrs);
  return {{plan_reduction(in[0], reduce.dims, reduce.keepdim).out_shape, in[0].dtype()}};
}

std::vector<OutputSpec> infer_var(const std::vector<Tensor>& in, const Attrs& attrs) {
  int64_t correction = std::get<VarParams>(attrs).correction;
  MF_CHECK(correction >= 0, "correction must be >= 0, got {}", correction);
  return infer_float_reduction(in, attrs);
}

std::vector<OutputSpec> infer_extreme(const std::vector<Tensor>& in, const Attrs& attrs) {
  const ReduceParams& reduce = reduction_of(attrs);
  ReducePlan plan = plan_reduction(in[0], reduce.dims, reduce.keepdim);
  check_not_empty(in[0], plan);
  return {{plan.out_shape, in[0].dtype()}};
}

/// The single-dim reductions: plan over their dim, refusing an empty dim.
ReducePlan plan_dim(const Tensor& x, const Attrs& attrs) {
  const auto& [dim, keepdim] = std::get<ReduceDimParams>(attrs);
  ReducePlan plan = plan_reduction(x, {dim}, keepdim);
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

// Reducers fold one work item of a ReduceLayout: row(p, n) a contiguous row, columns(p, n, inner,
// width, out) the `width` columns of an [n, inner] slab (stride inner), into out[0, width).
constexpr int64_t kBlock = ReduceLayout::kBlock;

/// out[c] = sum_r f(p[r * inner + c], c), in chunks of rows whose partial sums fold into out, so
/// float rounding grows with the chunk size and n / chunk rather than n.
template <typename T, typename F>
void column_sums(const T* p, int64_t n, int64_t inner, int64_t width, T* out, F f) {
  constexpr int64_t kChunk = 64;
  T part[kBlock];
  std::fill(out, out + width, T{0});
  for (int64_t r0 = 0; r0 < n; r0 += kChunk) {
    std::fill(part, part + width, T{0});
    for (int64_t r = r0; r < std::min(n, r0 + kChunk); ++r) {
      const T* row = p + r * inner;
      for (int64_t c = 0; c < width; ++c) part[c] += f(row[c], c);
    }
    for (int64_t c = 0; c < width; ++c) out[c] += part[c];
  }
}

/// combine(folds, count) of fold(chunk, length) over fixed chunks of a row. A long row (a full
/// reduction) so spreads over the pool; parallel_for runs the chunks serially when the caller is
/// already on the pool. The chunks depend on n alone, so results do not depend on the thread count.
template <typename T, typename Fold, typename Combine>
T fold_chunks(const T* p, int64_t n, Fold fold, Combine combine) {
  constexpr int64_t kChunk = cpu::kParallelGrain;
  if (n <= kChunk) return fold(p, n);
  int64_t count = (n + kChunk - 1) / kChunk;
  auto folds = std::make_unique<T[]>(static_cast<size_t>(count));  // not vector<bool>: threads write it
  parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) folds[k] = fold(p + k * kChunk, std::min(kChunk, n - k * kChunk));
  });
  return combine(folds.get(), count);
}

template <typename T>
T row_sum(const T* p, int64_t n) {
  auto sum = [](const T* q, int64_t m) { return cpu::row_sum(q, m); };
  return fold_chunks(p, n, sum, sum);
}

struct SumOp {
  template <typename T> static T row(const T* p, int64_t n, const Attrs&) { return row_sum(p, n); }
  template <typename T> static void columns(const T* p, int64_t n, int64_t inner, int64_t width, T* out, const Attrs&) {
    column_sums(p, n, inner, width, out, [](T v, int64_t) { return v; });
  }
};

// Means of no elements are 0 / 0 = NaN, as in PyTorch.
struct MeanOp {
  template <typename T> static T row(const T* p, int64_t n, const Attrs& attrs) {
    return SumOp::row(p, n, attrs) / static_cast<T>(n);
  }
  template <typename T> static void columns(const T* p, int64_t n, int64_t inner, int64_t width, T* out,
                                            const Attrs& attrs) {
    SumOp::columns(p, n, inner, width, out, attrs);
    for (int64_t c = 0; c < width; ++c) out[c] /= static_cast<T>(n);
  }
};

// Two passes (the mean, then squared deviations), which stay accurate when the mean dwarfs the spread.
struct VarOp {
  template <typename T> static T divisor(int64_t n, const Attrs& attrs) {
    return static_cast<T>(std::max<int64_t>(n - std::get<VarParams>(attrs).correction, 0));
  }
  template <typename T> static T row(const T* p, int64_t n, const Attrs& attrs) {
    T mean = MeanOp::row(p, n, attrs);
    auto squares = [mean](const T* q, int64_t m) {
      return cpu::row_sum(q, m, [mean](auto v) { return (v - mean) * (v - mean); });
    };
    return fold_chunks(p, n, squares, row_sum<T>) / divisor<T>(n, attrs);
  }
  template <typename T> static void columns(const T* p, int64_t n, int64_t inner, int64_t width, T* out,
                                            const Attrs& attrs) {
    T mean[kBlock];
    MeanOp::columns(p, n, inner, width, mean, attrs);
    column_sums(p, n, inner, width, out, [&mean](T v, int64_t c) { return (v - mean[c]) * (v - mean[c]); });
    const T divide_by = divisor<T>(n, attrs);
    for (int64_t c = 0; c < width; ++c) out[c] /= divide_by;
  }
};

// Largest (Greater) or smallest values, NaN where a NaN was folded, as PyTorch's amax. n >= 1.
template <bool Greater>
struct ExtremeOp {
  template <typename T> static T row(const T* p, int64_t n, const Attrs&) {
    auto extreme = [](const T* q, int64_t m) { return cpu::row_extreme<Greater>(q, m); };
    return fold_chunks(p, n, extreme, extreme);
  }
  template <typename T> static void columns(const T* p, int64_t n, int64_t inner, int64_t width, T* out, const Attrs&) {
    T nan[kBlock];  // holds a NaN where one was seen (plain selects, so the loops vectorise)
    std::copy(p, p + width, out);
    std::copy(p, p + width, nan);
    for (int64_t r = 1; r < n; ++r) {
      const T* row = p + r * inner;
      for (int64_t c = 0; c < width; ++c) {
        out[c] = (Greater ? row[c] > out[c] : row[c] < out[c]) ? row[c] : out[c];
        nan[c] = row[c] != row[c] ? row[c] : nan[c];
      }
    }
    for (int64_t c = 0; c < width; ++c) out[c] = nan[c] != nan[c] ? nan[c] : out[c];
  }
};

/// out[k] = Op over each work item of the layout. Arithmetic ops skip bool (sum reads bool as int64).
template <typename Op, bool kArithmetic = true>
void cpu_reduce(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const ReduceParams& reduce = reduction_of(attrs);
  ReduceLayout layout = reduce_layout(in[0].to(out[0].dtype()), plan_reduction(in[0], reduce.dims, reduce.keepdim));
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!(kArithmetic && std::is_same_v<T, bool>)) {
      const T* p = static_cast<const T*>(layout.data.raw_data());  // [outer, n, inner]
      T* o = out[0].data_ptr<T>();                                 // [outer, inner]
      parallel_for(0, layout.items(), slab_grain(layout), [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          ReduceLayout::Slab s = layout.slab(item);
          if (layout.inner == 1) o[s.out] = Op::row(p + s.offset, layout.n, attrs);
          else Op::columns(p + s.offset, layout.n, layout.inner, s.width, o + s.out, attrs);
        }
      });
    }
  });
}

/// Index of the first extreme along the dim (NaN counting as the extreme, as PyTorch's max(dim) on
/// CPU), and for max_dim / min_dim (two outputs) its value: the extreme first, then the first index
/// holding it.
template <bool Greater>
void cpu_arg_extreme(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const auto& [dim, keepdim] = std::get<ReduceDimParams>(attrs);
  ReduceLayout layout = reduce_layout(in[0], plan_reduction(in[0], {dim}, keepdim));
  visit_dtype(in[0].dtype(), [&]<typename T>() {
    const T* p = static_cast<const T*>(layout.data.raw_data());  // [outer, n, inner]
    int64_t* indices = out.back().data_ptr<int64_t>();           // [outer, inner]
    T* values = out.size() == 2 ? out[0].data_ptr<T>() : nullptr;
    auto holds = [](T v, T best) { return v == best || (best != best && v != v); };
    parallel_for(0, layout.items(), slab_grain(layout), [&](int64_t begin, int64_t end) {
      T best[kBlock];
      for (int64_t item = begin; item < end; ++item) {
        ReduceLayout::Slab s = layout.slab(item);
        const T* slab = p + s.offset;
        int64_t* index = indices + s.out;
        if (layout.inner == 1) {
          best[0] = ExtremeOp<Greater>::row(slab, layout.n, attrs);
          index[0] = 0;
          while (!holds(slab[index[0]], best[0])) ++index[0];
        } else {
          ExtremeOp<Greater>::columns(slab, layout.n, layout.inner, s.width, best, attrs);
          std::fill(index, index + s.width, layout.n);
          for (int64_t r = layout.n - 1; r >= 0; --r)  // backwards, so the first match is the last written
            for (int64_t c = 0; c < s.width; ++c) index[c] = holds(slab[r * layout.inner + c], best[c]) ? r : index[c];
        }
        if (values) std::copy(best, best + s.width, values + s.out);
      }
    });
  });
}

// ---- backward rules -----------------------------------------------------------------------------

/// The output gradient with the reduced dims restored as size 1, so it broadcasts against x.
Tensor kept_grad(const GradContext& ctx, const Shape& dims, bool keepdim) {
  return ctx.grads[0].reshape(plan_reduction(ctx.inputs[0], dims, keepdim).kept_shape);
}

std::vector<Tensor> sum_backward(const GradContext& ctx) {
  const auto& [dims, keepdim] = std::get<ReduceParams>(ctx.attrs);
  return {kept_grad(ctx, dims, keepdim).expand(ctx.inputs[0].shape())};
}

std::vector<Tensor> mean_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const auto& [dims, keepdim] = std::get<ReduceParams>(ctx.attrs);
  int64_t count = plan_reduction(x, dims, keepdim).reduced_numel;
  return {kept_grad(ctx, dims, keepdim).expand(x.shape()).div(static_cast<double>(count))};
}

// d var / dx_i = 2 (x_i - mean) / (N - correction); the mean's own dependence on x_i cancels.
std::vector<Tensor> var_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const VarParams& var = std::get<VarParams>(ctx.attrs);
  int64_t count = plan_reduction(x, var.dims, var.keepdim).reduced_numel;
  Tensor centred = sub(x, mean(x, var.dims, true));
  return {mul(centred, kept_grad(ctx, var.dims, var.keepdim).mul(2.0 / static_cast<double>(count - var.correction)))};
}

// The gradient is shared evenly among the elements equal to the extreme (PyTorch's amax).
std::vector<Tensor> extreme_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const auto& [dims, keepdim] = std::get<ReduceParams>(ctx.attrs);
  Shape kept = plan_reduction(x, dims, keepdim).kept_shape;
  Tensor hits = eq(x, ctx.outputs[0].reshape(kept)).to(x.dtype());
  return {mul(hits, div(kept_grad(ctx, dims, keepdim), sum(hits, dims, true)))};
}

// The gradient goes to the chosen index alone: positions along the dim are compared with it.
std::vector<Tensor> arg_extreme_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dim() == 0) return {ctx.grads[0]};
  const ReduceDimParams& reduce = std::get<ReduceDimParams>(ctx.attrs);
  int64_t dim = normalize_dim(reduce.dim, x.dim());
  std::vector<int64_t> positions(static_cast<size_t>(x.shape()[dim]));
  std::iota(positions.begin(), positions.end(), 0);
  Shape grid_shape(static_cast<size_t>(x.dim() - dim), 1);
  grid_shape[0] = x.shape()[dim];  // [size, 1, ...]: broadcasts along the dims after `dim`
  Tensor grid = from_vector(positions, grid_shape, x.device());
  Shape kept = plan_reduction(x, {dim}, reduce.keepdim).kept_shape;
  Tensor chosen = eq(grid, ctx.outputs[1].reshape(kept)).to(x.dtype());
  return {mul(chosen, kept_grad(ctx, {dim}, reduce.keepdim))};
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
  const ReduceParams& reduce = reduction_of(attrs);
  ReducePlan plan = plan_reduction(x, reduce.dims, reduce.keepdim);
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
    int64_t correction = std::get<VarParams>(attrs).correction;
    return squares / static_cast<double>(std::max<int64_t>(static_cast<int64_t>(v.size()) - correction, 0));
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

/// Values and first indices of the extremes along the dim (indices only when `with_values` is
/// false).
template <bool Greater, bool kWithValues>
std::vector<Tensor> reference_arg_extreme(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const auto& [dim, keepdim] = std::get<ReduceDimParams>(attrs);
  ReducePlan plan = plan_reduction(x, {dim}, keepdim);
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
      {"all dims", {reference::randn({3, 4}, 61)}, ReduceParams{}},
      {"last dim", {reference::randn({3, 4}, 62)}, ReduceParams{.dims = {-1}}},
      {"first dim, keepdim", {reference::randn({3, 4}, 63)}, ReduceParams{.dims = {0}, .keepdim = true}},
      {"two of three dims", {reference::randn({2, 3, 4}, 64)}, ReduceParams{.dims = {0, 2}}},
      {"size-1 dim", {reference::randn({3, 1, 2}, 66)}, ReduceParams{.dims = {1}}},
      {"scalar", {reference::randn({}, 65)}, ReduceParams{}},
  };
}

std::vector<double> offset_values() {
  std::vector<double> values;
  for (int i = 0; i < 32; ++i) values.push_back(1e4 + (i * 5 % 16) / 8.0);
  return values;
}

std::vector<Sample> var_samples() {
  std::vector<Sample> samples = {
      {"correction 0", {reference::randn({3, 5}, 67)}, VarParams{{.dims = {1}}, 0}},
      {"correction 2, keepdim", {reference::randn({2, 6}, 68)}, VarParams{{.dims = {-1}, .keepdim = true}, 2}},
      // A large mean over a small spread (values exact in float32): one-pass sum-of-squares formulas
      // lose every digit here.
      {"offset 1e4", {reference::make({4, 8}, DType::Float64, offset_values())}, VarParams{{.dims = {1}}}},
  };
  for (Sample& s : reduction_samples()) {
    if (s.name == "scalar" || s.name == "size-1 dim") continue;  // one element: 0 / 0
    s.attrs = VarParams{std::get<ReduceParams>(s.attrs)};
    samples.push_back(s);
  }
  return samples;
}

// Two-way ties: central differences see half the step on each tied element, which is exactly the
// even split the rule gives.
std::vector<Sample> extreme_samples() {
  std::vector<Sample> samples = reduction_samples();
  samples.push_back({"two-way ties", {reference::make({2, 4}, DType::Float64, {1, 3, 3, 1, 5, 0, 5, 0})},
                     ReduceParams{.dims = {1}}});
  return samples;
}

std::vector<Sample> arg_extreme_samples() {
  return {
      {"last dim", {reference::randn({3, 5}, 71)}, ReduceDimParams{.dim = -1}},
      {"middle dim, keepdim", {reference::randn({2, 3, 4}, 72)}, ReduceDimParams{.dim = 1, .keepdim = true}},
      {"first dim", {reference::randn({4, 3}, 73)}, ReduceDimParams{.dim = 0}},
      {"size-1 dim", {reference::randn({3, 1}, 74)}, ReduceDimParams{.dim = 1}},
      {"scalar", {reference::randn({}, 75)}, ReduceDimParams{.dim = 0}},
      // The first index wins a tie; finite differences at a tie see a kink, not that choice.
      {"ties",
       {reference::make({2, 4}, DType::Float64, {1, 3, 3, 1, 5, 0, 5, 0})},
       ReduceDimParams{.dim = 1},
       {},
       false},
      {"ties down columns",
       {reference::make({4, 2}, DType::Float64, {1, 5, 3, 0, 3, 5, 1, 0})},
       ReduceDimParams{.dim = 0},
       {},
       false},
  };
}

}  // namespace

template <typename T>
void sum_rows_here(const T* p, int64_t n, int64_t width, T* out) {
  if (width == 1) {  // reduce_layout sees one row
    out[0] = SumOp::row(p, n, Attrs{});
    return;
  }
  for (int64_t c0 = 0; c0 < width; c0 += ReduceLayout::kBlock)
    SumOp::columns(p + c0, n, width, std::min(ReduceLayout::kBlock, width - c0), out + c0, Attrs{});
}
template void sum_rows_here(const float*, int64_t, int64_t, float*);
template void sum_rows_here(const double*, int64_t, int64_t, double*);

void register_reduction_ops(Registry& r) {
  r.define(OpId::sum, {.name = "sum", .infer = infer_sum, .kernels = {cpu_reduce<SumOp>}, .backward = sum_backward,
                       .samples = reduction_samples, .reference = reference_reduce<SumFold>});
  r.define(OpId::mean, {.name = "mean", .infer = infer_float_reduction, .kernels = {cpu_reduce<MeanOp>},
                        .backward = mean_backward, .samples = reduction_samples,
                        .reference = reference_reduce<MeanFold>});
  r.define(OpId::var, {.name = "var", .infer = infer_var, .kernels = {cpu_reduce<VarOp>},
                       .backward = var_backward, .samples = var_samples, .reference = reference_reduce<VarFold>});
  r.define(OpId::amax, {.name = "amax", .infer = infer_extreme, .kernels = {cpu_reduce<ExtremeOp<true>, false>},
                        .backward = extreme_backward, .saves_outputs = true, .samples = extreme_samples,
                        .reference = reference_reduce<ExtremeFold<true>>});
  r.define(OpId::amin, {.name = "amin", .infer = infer_extreme, .kernels = {cpu_reduce<ExtremeOp<false>, false>},
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
  return call1<OpId::sum>({x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1<OpId::mean>({x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim, Site site) {
  return call1<OpId::var>({x}, {{.dims = dims, .keepdim = keepdim}, correction}, site);
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1<OpId::amax>({x}, {.dims = dims, .keepdim = keepdim}, site);
}

Tensor amin(const Tensor& x, const Shape& dims, bool keepdim, Site site) {
  return call1<OpId::amin>({x}, {.dims = dims, .keepdim = keepdim}, site);
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
  std::vector<Tensor> out = call<OpId::max_dim>({*this}, {.dim = dim, .keepdim = keepdim}, site);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim, Site site) const {
  std::vector<Tensor> out = call<OpId::min_dim>({*this}, {.dim = dim, .keepdim = keepdim}, site);
  return {out[0], out[1]};
}

Tensor Tensor::argmax(int64_t dim, bool keepdim, Site site) const {
  return call1<OpId::argmax>({*this}, {.dim = dim, .keepdim = keepdim}, site);
}

}  // namespace mf
