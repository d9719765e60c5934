#include "ops/anomaly.h"

#include "core/graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace mf {
namespace {

/// Counts of one tensor with the row-major positions of its first NaN and first inf (-1: none).
struct Scan {
  NonFiniteCount count;
  int64_t first_nan = -1, first_inf = -1;
};

Scan scan(const Tensor& t) {
  Scan s;
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return s;
  NoGradGuard no_grad;
  Tensor c = t.to(Device::cpu()).contiguous();
  if (c.dtype() == DType::BFloat16) c = c.to(DType::Float32);  // exact: NaN and infinities stay
  visit_floating(c.dtype(), [&]<typename T>() {
    const T* data = c.data_ptr<T>();
    for (int64_t i = 0, n = c.numel(); i < n; ++i) {
      if (std::isnan(data[i])) {
        if (s.count.nan++ == 0) s.first_nan = i;
      } else if (std::isinf(data[i])) {
        if (s.count.inf++ == 0) s.first_inf = i;
      }
    }
  });
  return s;
}

/// The multi-index of row-major position `flat` in `shape`: "[1, 2]".
std::string index_str(const Shape& shape, int64_t flat) {
  Shape index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return fmt::format("[{}]", fmt::join(index, ", "));
}

}  // namespace

NonFiniteCount count_nonfinite(const std::vector<Tensor>& tensors) {
  NonFiniteCount total;
  for (const Tensor& t : tensors) {
    NonFiniteCount c = scan(t).count;
    total.nan += c.nan;
    total.inf += c.inf;
  }
  return total;
}

std::string find_anomaly(const std::vector<Tensor>& results, const std::function<NonFiniteCount()>& sources,
                         std::string_view result_noun, std::string_view source_noun) {
  bool counted = false;
  NonFiniteCount in;
  for (size_t i = 0; i < results.size(); ++i) {
    Scan out = scan(results[i]);
    if (out.count.nan == 0 && out.count.inf == 0) continue;
    if (!counted) {
      in = sources();
      counted = true;
    }
    auto describe = [&](int64_t count, std::string_view what, int64_t first, std::string_view because) {
      return fmt::format("anomaly detected: {} {} ({}, {}) has {} {} value{} (first at {}) although {}", result_noun,
                         i, shape_str(results[i].shape()), dtype_name(results[i].dtype()), count, what,
                         count == 1 ? "" : "s", index_str(results[i].shape(), first), because);
    };
    if (out.count.nan > 0 && in.nan == 0)
      return describe(out.count.nan, "NaN", out.first_nan, fmt::format("no {} had NaN", source_noun));
    if (out.count.inf > 0 && in.nan == 0 && in.inf == 0)
      return describe(out.count.inf, "inf", out.first_inf, fmt::format("every {} was finite", source_noun));
  }
  return {};
}

}  // namespace mf
