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
#include "ops/loops.h"
#include "ops/ops.h"
#include "ops/reduce_util.h"
#include "ops/reference.h"

#include <cmath>
#include <limits>

namespace mf {
namespace {

std::vector<OutputSpec> infer_softmax(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  MF_CHECK(is_floating(x.dtype()), "expects a float32 or float64 tensor, got {} of shape {} (cast it first)",
           dtype_name(x.dtype()), shape_str(x.shape()));
  normalize_dim(attrs.dim, x.dim());
  return {{x.shape(), x.dtype()}};
}

/// [outer, N, inner] around the softmax dim.
struct RowLayout {
  int64_t outer = 1, n = 1, inner = 1;
  RowLayout(const Shape& shape, int64_t dim) {
    if (shape.empty()) return;
    int64_t d = normalize_dim(dim, static_cast<int64_t>(shape.size()));
    for (int64_t i = 0; i < d; ++i) outer *= shape[i];
    n = shape[d];
    for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  }
};

/// One contiguous row of n: out = softmax(inp) or log_softmax(inp).
template <typename T, bool Log>
void softmax_row(const T* inp, T* out, int64_t n) {
  T max = cpu::row_extreme<T, true>(inp, n);
  if constexpr (Log) {
    T total = cpu::row_sum(inp, n, [max](T v) { return cpu::exp_vec(v - max); });
    T log_total = std::log(total);
    for (int64_t i = 0; i < n; ++i) out[i] = (inp[i] - max) - log_total;  // max + log_total would round
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = cpu::exp_vec(inp[i] - max);
    T scale = T{1} / cpu::row_sum(out, n);
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
  }
}

/// Columns [0, width) of one [N, inner] slab (width <= kBlock): the same three passes, each
/// vectorised across the columns.
constexpr int64_t kBlock = 256;

template <typename T, bool Log>
void softmax_columns(const T* inp, T* out, int64_t n, int64_t inner, int64_t width) {
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
    const T* row = inp + r * inner;
    T* o = out + r * inner;
    for (int64_t c = 0; c < width; ++c) {
      T e = cpu::exp_vec(row[c] - max[c]);
      total[c] += e;
      if constexpr (!Log) o[c] = e;
    }
  }
  for (int64_t c = 0; c < width; ++c) total[c] = Log ? std::log(total[c]) : T{1} / total[c];
  for (int64_t r = 0; r < n; ++r) {
    const T* row = inp + r * inner;
    T* o = out + r * inner;
    for (int64_t c = 0; c < width; ++c) o[c] = Log ? (row[c] - max[c]) - total[c] : o[c] * total[c];
  }
}

template <bool Log>
void cpu_softmax(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor x = in[0].contiguous();
  RowLayout layout(x.shape(), attrs.dim);
  int64_t n = layout.n, inner = layout.inner;
  if (x.numel() == 0) return;
  visit_floating(x.dtype(), [&]<typename T>() {
    const T* inp = x.data_ptr<T>();  // [outer, N, inner]
    T* o = out[0].data_ptr<T>();     // [outer, N, inner]
    if (inner == 1) {
      parallel_for(0, layout.outer, std::max<int64_t>(1, cpu::kParallelGrain / n), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) softmax_row<T, Log>(inp + row * n, o + row * n, n);
      });
      return;
    }
    int64_t blocks = (inner + kBlock - 1) / kBlock;
    int64_t grain = std::max<int64_t>(1, cpu::kParallelGrain / (n * std::min(inner, kBlock)));
    parallel_for(0, layout.outer * blocks, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        int64_t slab = item / blocks, c0 = (item % blocks) * kBlock;
        int64_t offset = slab * n * inner + c0;
        softmax_columns<T, Log>(inp + offset, o + offset, n, inner, std::min(kBlock, inner - c0));
      }
    });
  });
}

std::vector<Tensor> softmax_backward(const GradContext& ctx) {
  const Tensor &y = ctx.outputs[0], &g = ctx.grads[0];
  return {mul(y, sub(g, sum(mul(g, y), {ctx.attrs.dim}, true)))};
}

std::vector<Tensor> log_softmax_backward(const GradContext& ctx) {
  const Tensor &y = ctx.outputs[0], &g = ctx.grads[0];
  return {sub(g, mul(call1(OpId::exp, {y}), sum(g, {ctx.attrs.dim}, true)))};
}

/// Plain loops in double: every element rescans its line along the dim for the max and the sum.
template <bool Log>
std::vector<Tensor> reference_softmax(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  int64_t dim = x.dim() == 0 ? -1 : normalize_dim(attrs.dim, x.dim());
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
      {"last dim", {reference::randn({3, 5}, 81)}, {.dim = -1}},
      {"middle dim", {reference::randn({2, 3, 4}, 82)}, {.dim = 1}},
      {"first dim", {reference::randn({4, 3}, 83)}, {.dim = 0}},
      {"long rows", {reference::randn({2, 37}, 84)}, {.dim = 1}},
      {"size-1 dim", {reference::randn({3, 1}, 85)}, {.dim = -1}},
      {"size-1 outer and inner", {reference::randn({1, 4, 1}, 86)}, {.dim = 1}},
      {"scalar", {reference::randn({}, 87)}, {.dim = 0}},
      // exp(1000) overflows even in double: only the max-shifted form gets these right.
      {"logits of +-1000", {reference::make({2, 3}, DType::Float64, {1000, 999, -1000, -1000, -999.5, 1000})},
       {.dim = -1}},
      {"logits of +-1000, middle dim", {reference::uniform({2, 3, 2}, -1000, 1000, 88)}, {.dim = 1}},
  };
  // Masked entries give softmax 0 (log_softmax would give -inf, which no closeness check accepts).
  if (masked)
    samples.push_back({"-inf entries", {reference::make({2, 3}, DType::Float64, {0.5, -kInf, 1.5, -kInf, 2, -1})},
                       {.dim = 1}});
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

Tensor softmax(const Tensor& x, int64_t dim, Site site) { return call1(OpId::softmax, {x}, {.dim = dim}, site); }
Tensor log_softmax(const Tensor& x, int64_t dim, Site site) {
  return call1(OpId::log_softmax, {x}, {.dim = dim}, site);
}

Tensor Tensor::softmax(int64_t dim, Site site) const { return mf::softmax(*this, dim, site); }
Tensor Tensor::log_softmax(int64_t dim, Site site) const { return mf::log_softmax(*this, dim, site); }

}  // namespace mf
