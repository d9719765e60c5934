// softmax and log_softmax along one dim, fused: one pass for the max, one for exp and the sum, one to
// normalise, numerically stable by subtracting the max. The input is read as [outer, N, inner] with
// N the softmax dim, so no dim is ever transposed: when the dim is last (inner = 1, the hot path)
// each row is contiguous and the loops vectorise along it; otherwise they vectorise across `inner`,
// one column block at a time. Work splits over threads by rows (or column blocks).
//
// Both ops save their output, and their backward rules are written with ops:
//   softmax:      dx = y * (g - sum(g * y, dim))
//   log_softmax:  dx = g - exp(y) * sum(g, dim)
#include "ops/families.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/cpu/reduce_util.h"
#include "ops/reference.h"
#include "ops/cpu/softmax_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace mf {
namespace {

using cpu::exp_diff;
using cpu::softmax_row;

std::vector<OutputSpec> infer_softmax(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  MF_CHECK(is_floating(x.dtype()), "expects a float32 or float64 tensor, got {} of shape {} (cast it first)",
           dtype_name(x.dtype()), shape_str(x.shape()));
  normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  return {{x.shape(), x.dtype()}};
}

// ---- kernels -----------------------------------------------------------------------------------
//
// Written once as always-inline templates over the vector width W (bytes), then compiled three times
// (AVX-512, AVX2 + FMA, and the baseline) and picked once at run time from the CPU's features, as
// PyTorch's CPU kernels are. Contiguous rows go through softmax_row (ops/cpu/softmax_row.h).

/// Columns [0, width) of one [N, inner] slab (width <= kBlock): softmax_row's passes, each vectorised
/// across the columns.
constexpr int64_t kBlock = ReduceLayout::kBlock;

template <int W, bool Log, typename T>
MF_INLINE void softmax_columns(const T* inp, T* out, int64_t n, int64_t inner, int64_t width) {
  T max[kBlock], total[kBlock];
  for (int64_t c = 0; c < width; ++c) {
    max[c] = inp[c];
    total[c] = 0;
  }
  for (int64_t r = 1; r < n; ++r) {
    const T* row = inp + r * inner;
    for (int64_t c = 0; c < width; ++c) max[c] = row[c] > max[c] ? row[c] : max[c];
  }
  for (int64_t r = 0; r < n; ++r) {
    T* o = out + r * inner;
    exp_diff<W, true>(inp + r * inner, max, o, width);
    for (int64_t c = 0; c < width; ++c) total[c] += o[c];
  }
  for (int64_t c = 0; c < width; ++c) total[c] = Log ? std::log(total[c]) : T{1} / total[c];
  for (int64_t r = 0; r < n; ++r) {
    const T* row = inp + r * inner;
    T* o = out + r * inner;
    for (int64_t c = 0; c < width; ++c) o[c] = Log ? (row[c] - max[c]) - total[c] : o[c] * total[c];
  }
}

/// Work items [begin, end) of the input's [outer, N, inner] layout (which the output shares).
template <int W, bool Log, typename T>
MF_INLINE void softmax_items(const T* inp, T* out, const ReduceLayout& layout, int64_t begin, int64_t end) {
  for (int64_t item = begin; item < end; ++item) {
    ReduceLayout::Slab s = layout.slab(item);
    if (layout.inner == 1) softmax_row<W, Log>(inp + s.offset, out + s.offset, layout.n);
    else softmax_columns<W, Log>(inp + s.offset, out + s.offset, layout.n, layout.inner, s.width);
  }
}

template <bool Log>
void cpu_softmax(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  if (in[0].numel() == 0) return;
  ReduceLayout layout = reduce_layout(in[0], plan_reduction(in[0], {std::get<DimParams>(attrs).dim}, false));
  visit_floating(in[0].dtype(), [&]<typename T>() {
    const T* inp = layout.data.data_ptr<T>();  // [outer, N, inner]
    T* o = out[0].data_ptr<T>();               // [outer, N, inner]
    parallel_for(0, layout.items(), slab_grain(layout), [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE { softmax_items<W, Log>(inp, o, layout, begin, end); });
    });
  });
}

std::vector<Tensor> softmax_backward(const GradContext& ctx) {
  const Tensor &y = ctx.outputs[0], &g = ctx.grads[0];
  return {mul(y, sub(g, sum(mul(g, y), {std::get<DimParams>(ctx.attrs).dim}, true)))};
}

std::vector<Tensor> log_softmax_backward(const GradContext& ctx) {
  const Tensor &y = ctx.outputs[0], &g = ctx.grads[0];
  return {sub(g, mul(exp(y), sum(g, {std::get<DimParams>(ctx.attrs).dim}, true)))};
}

/// Plain loops in double: every element rescans its line along the dim for the max and the sum.
template <bool Log>
std::vector<Tensor> reference_softmax(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  int64_t dim = x.dim() == 0 ? -1 : normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  std::vector<double> values;
  reference::for_each_index(x.shape(), [&](const Shape& index) {
    Shape line = index;
    int64_t size = dim < 0 ? 1 : x.shape()[dim];
    auto at = [&](int64_t i) {
      if (dim >= 0) line[dim] = i;
      return x.at<double>(line);
    };
    double max = -std::numeric_limits<double>::infinity(), total = 0;
    for (int64_t i = 0; i < size; ++i) max = std::max(max, at(i));
    for (int64_t i = 0; i < size; ++i) total += std::exp(at(i) - max);
    double v = x.at<double>(index) - max;
    values.push_back(Log ? v - std::log(total) : std::exp(v) / total);
  });
  return {reference::make(x.shape(), x.dtype(), values)};
}

std::vector<Sample> softmax_samples(bool masked) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<Sample> samples = {
      {"last dim", {reference::randn({3, 5}, 81)}, DimParams{.dim = -1}},
      {"middle dim", {reference::randn({2, 3, 4}, 82)}, DimParams{.dim = 1}},
      {"first dim", {reference::randn({4, 3}, 83)}, DimParams{.dim = 0}},
      {"long rows", {reference::randn({2, 37}, 84)}, DimParams{.dim = 1}},
      {"size-1 dim", {reference::randn({3, 1}, 85)}, DimParams{.dim = -1}},
      {"size-1 outer and inner", {reference::randn({1, 4, 1}, 86)}, DimParams{.dim = 1}},
      {"scalar", {reference::randn({}, 87)}, DimParams{.dim = 0}},
      // exp(1000) overflows even in double: only the max-shifted form gets these right.
      {"logits of +-1000", {reference::make({2, 3}, DType::Float64, {1000, 999, -1000, -1000, -999.5, 1000})},
       DimParams{.dim = -1}},
      {"logits of +-1000, middle dim", {reference::uniform({2, 3, 2}, -1000, 1000, 88)}, DimParams{.dim = 1}},
  };
  // Masked entries give softmax 0 (log_softmax would give -inf, which no closeness check accepts).
  if (masked)
    samples.push_back({"-inf entries", {reference::make({2, 3}, DType::Float64, {0.5, -kInf, 1.5, -kInf, 2, -1})},
                       DimParams{.dim = 1}});
  return samples;
}

}  // namespace

void register_softmax_ops(Registry& r) {
  r.define(OpId::softmax, {.name = "softmax", .infer = infer_softmax, .kernels = {cpu_softmax<false>},
                           .backward = softmax_backward, .saves_inputs = false, .saves_outputs = true,
                           .samples = [] { return softmax_samples(true); }, .reference = reference_softmax<false>});
  r.define(OpId::log_softmax, {.name = "log_softmax", .infer = infer_softmax, .kernels = {cpu_softmax<true>},
                               .backward = log_softmax_backward, .saves_inputs = false, .saves_outputs = true,
                               .samples = [] { return softmax_samples(false); },
                               .reference = reference_softmax<true>});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor softmax(const Tensor& x, int64_t dim, Site site) { return call1<OpId::softmax>({x}, {.dim = dim}, site); }
Tensor log_softmax(const Tensor& x, int64_t dim, Site site) {
  return call1<OpId::log_softmax>({x}, {.dim = dim}, site);
}

Tensor Tensor::softmax(int64_t dim, Site site) const { return mf::softmax(*this, dim, site); }
Tensor Tensor::log_softmax(int64_t dim, Site site) const { return mf::log_softmax(*this, dim, site); }

}  // namespace mf
