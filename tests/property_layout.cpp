#include "property_layout.h"

#include "ops/reference.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <numeric>

namespace mf::props {

Recipe random_recipe(const Shape& shape, Rng& rng, bool expand, bool slice) {
  Recipe r;
  size_t rank = shape.size();
  r.expanded.assign(rank, false);
  if (expand)
    for (size_t d = 0; d < rank; ++d) r.expanded[d] = shape[d] > 1 && rng.chance(0.25);
  r.order.resize(rank);
  std::iota(r.order.begin(), r.order.end(), 0);
  if (rng.chance(0.6)) std::shuffle(r.order.begin(), r.order.end(), std::mt19937_64(rng.seed()));
  r.step.assign(rank, 1);
  r.offset.assign(rank, 0);
  if (slice && rng.chance(0.6))
    for (size_t i = 0; i < rank; ++i) {
      r.step[i] = rng.integer(1, 3);
      r.offset[i] = rng.integer(0, 2);
    }
  return r;
}

namespace {

/// x's shape with the expanded dims as 1.
Shape base_shape(const Shape& shape, const Recipe& recipe) {
  Shape base = shape;
  for (size_t d = 0; d < base.size(); ++d)
    if (recipe.expanded[d]) base[d] = 1;
  return base;
}

/// x narrowed to index 0 along the expanded dims.
Tensor base_values(const Tensor& x, const Recipe& recipe) {
  Tensor base = x;
  for (size_t d = 0; d < recipe.expanded.size(); ++d)
    if (recipe.expanded[d]) base = base.narrow(static_cast<int64_t>(d), 0, 1);
  return base;
}

double junk(DType dtype) {
  if (is_floating(dtype)) return std::nan("");
  return dtype == DType::Bool ? 1.0 : 987654321.0;
}

}  // namespace

Tensor collapsed(const Tensor& x, const Recipe& recipe) {
  NoGradGuard no_grad;
  return base_values(x, recipe).expand(x.shape()).contiguous();
}

Tensor view_of_buffer(const Tensor& buffer, const Recipe& recipe, const Shape& shape) {
  Shape base = base_shape(shape, recipe);
  Tensor view = buffer;
  for (size_t i = 0; i < recipe.order.size(); ++i) {
    int64_t length = base[static_cast<size_t>(recipe.order[i])], d = static_cast<int64_t>(i);
    view = view.slice(d, recipe.offset[i], recipe.offset[i] + length * recipe.step[i], recipe.step[i]);
  }
  Shape inverse(recipe.order.size());
  for (size_t i = 0; i < recipe.order.size(); ++i)
    inverse[static_cast<size_t>(recipe.order[i])] = static_cast<int64_t>(i);
  return view.permute(inverse).expand(shape);
}

Laid lay_out(const Tensor& x, const Recipe& recipe) {
  NoGradGuard no_grad;
  Shape base = base_shape(x.shape(), recipe), buffer_shape;
  for (size_t i = 0; i < recipe.order.size(); ++i)
    buffer_shape.push_back(base[static_cast<size_t>(recipe.order[i])] * recipe.step[i] + recipe.offset[i]);
  Tensor buffer = reference::make(buffer_shape, x.dtype(),
                                  std::vector<double>(static_cast<size_t>(shape_numel(buffer_shape)), junk(x.dtype())));
  Tensor view = view_of_buffer(buffer, recipe, x.shape());
  Tensor window = view_of_buffer(buffer, recipe, base);
  window.copy_(base_values(x, recipe));
  return {buffer, view};
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} strides [{}] offset {} {}", shape_str(t.shape()), fmt::join(t.strides(), ", "), t.offset(),
                     dtype_name(t.dtype()));
}

std::string mismatch(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (!actual.defined()) return "the op returned an undefined tensor";
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return fmt::format("got {} {}, expected {} {}", shape_str(actual.shape()), dtype_name(actual.dtype()),
                       shape_str(expected.shape()), dtype_name(expected.dtype()));
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  bool exact = !is_floating(expected.dtype());
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok = a[i] == e[i] || (std::isnan(a[i]) && std::isnan(e[i])) ||
              (!exact && std::isfinite(e[i]) && std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i]));
    if (!ok) return fmt::format("element {} (row-major): got {}, expected {}", i, a[i], e[i]);
  }
  return "";
}

bool same_values(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  return true;
}

}  // namespace mf::props
