// Elementwise ops: arithmetic, math functions, comparisons, logic, casts and copies.
// Binary ops broadcast (NumPy rules); the public functions promote mixed dtypes with a cast first,
// so kernels see one dtype.
#include "ops/families.h"
#include "ops/loops.h"
#include "ops/math.h"
#include "ops/ops.h"
#include "ops/reference.h"

#include <cmath>

namespace mf {
namespace {

// ---- shared fronts and kernels ------------------------------------------------------------------

std::vector<OutputSpec> infer_binary_arith(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  MF_CHECK(a.dtype() == b.dtype(), "dtypes {} and {} differ (promote first)", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  MF_CHECK(a.dtype() != DType::Bool, "not defined for bool tensors (shapes {} and {})", shape_str(a.shape()),
           shape_str(b.shape()));
  return {{broadcast_shapes(a.shape(), b.shape()), a.dtype()}};
}

std::vector<OutputSpec> infer_unary_same(const std::vector<Tensor>& in, const Attrs&) {
  MF_CHECK(in[0].dtype() != DType::Bool, "not defined for bool tensors (shape {})", shape_str(in[0].shape()));
  return {{in[0].shape(), in[0].dtype()}};
}

template <typename Fn>
void cpu_binary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) cpu::map<T, T, T>(out[0], {&in[0], &in[1]}, Fn{});
  });
}

template <typename Fn>
void cpu_unary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) cpu::map<T, T>(out[0], {&in[0]}, Fn{});
  });
}

template <typename Fn>
std::vector<Tensor> reference_binary(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return Fn{}(v[0], v[1]); })};
}

template <typename Fn>
std::vector<Tensor> reference_unary(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return Fn{}(v[0]); })};
}

/// Same-shape, broadcast rows/columns, trailing-dim and scalar cases, with b drawn from [low, high).
std::vector<Sample> binary_samples(double low, double high) {
  return {
      {"same shape", {reference::randn({3, 4}, 1), reference::uniform({3, 4}, low, high, 2)}},
      {"row x column", {reference::randn({3, 1}, 3), reference::uniform({1, 4}, low, high, 4)}},
      {"trailing dim", {reference::randn({2, 3, 4}, 5), reference::uniform({4}, low, high, 6)}},
      {"scalar", {reference::randn({}, 7), reference::uniform({2, 3}, low, high, 8)}},
  };
}

std::vector<Sample> unary_samples(double low, double high) {
  return {
      {"matrix", {reference::uniform({3, 4}, low, high, 11)}},
      {"3-d", {reference::uniform({2, 3, 5}, low, high, 12)}},
      {"scalar", {reference::uniform({}, low, high, 13)}},
  };
}

// ---- arithmetic ---------------------------------------------------------------------------------

std::vector<Tensor> add_backward(const GradContext& ctx) { return {ctx.grads[0], ctx.grads[0]}; }

std::vector<Tensor> sub_backward(const GradContext& ctx) {
  return {ctx.grads[0], ctx.needs_grad[1] ? neg(ctx.grads[0]) : Tensor()};
}

std::vector<Tensor> mul_backward(const GradContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1], &g = ctx.grads[0];
  return {ctx.needs_grad[0] ? mul(g, b) : Tensor(), ctx.needs_grad[1] ? mul(g, a) : Tensor()};
}

// d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
std::vector<Tensor> div_backward(const GradContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1], &g = ctx.grads[0];
  return {ctx.needs_grad[0] ? div(g, b) : Tensor(), ctx.needs_grad[1] ? neg(div(mul(g, a), mul(b, b))) : Tensor()};
}

std::vector<Tensor> neg_backward(const GradContext& ctx) { return {neg(ctx.grads[0])}; }

// ---- copies -------------------------------------------------------------------------------------

std::vector<OutputSpec> infer_copy(const std::vector<Tensor>& in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

void cpu_copy(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() { cpu::map<T, T>(out[0], {&in[0]}, [](T x) { return x; }); });
}

std::vector<Tensor> copy_backward(const GradContext& ctx) { return {ctx.grads[0]}; }

std::vector<Tensor> reference_copy(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return v[0]; })};
}

std::vector<OutputSpec> infer_cast(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {{in[0].shape(), attrs.dtype}};
}

void cpu_cast(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename To>() {
    visit_dtype(in[0].dtype(), [&]<typename From>() {
      cpu::map<To, From>(out[0], {&in[0]}, [](From x) { return static_cast<To>(x); });
    });
  });
}

// Gradients flow back in the input's dtype; casts from or to integer types carry none.
std::vector<Tensor> cast_backward(const GradContext& ctx) {
  return {ctx.grads[0].to(ctx.inputs[0].dtype())};
}

std::vector<Tensor> reference_cast(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {reference::map(in, attrs.dtype, [](std::span<const double> v) { return v[0]; })};
}

}  // namespace

void register_elementwise_ops(Registry& r) {
  r.define(OpId::add, {.name = "add", .infer = infer_binary_arith, .kernels = {cpu_binary<math::Add>},
                       .backward = add_backward, .saves_inputs = false,
                       .samples = [] { return binary_samples(-2, 2); }, .reference = reference_binary<math::Add>});
  r.define(OpId::sub, {.name = "sub", .infer = infer_binary_arith, .kernels = {cpu_binary<math::Sub>},
                       .backward = sub_backward, .saves_inputs = false,
                       .samples = [] { return binary_samples(-2, 2); }, .reference = reference_binary<math::Sub>});
  r.define(OpId::mul, {.name = "mul", .infer = infer_binary_arith, .kernels = {cpu_binary<math::Mul>},
                       .backward = mul_backward,
                       .samples = [] { return binary_samples(-2, 2); }, .reference = reference_binary<math::Mul>});
  r.define(OpId::div, {.name = "div", .infer = infer_binary_arith, .kernels = {cpu_binary<math::Div>},
                       .backward = div_backward,
                       .samples = [] { return binary_samples(0.5, 2); }, .reference = reference_binary<math::Div>});
  r.define(OpId::neg, {.name = "neg", .infer = infer_unary_same, .kernels = {cpu_unary<math::Neg>},
                       .backward = neg_backward, .saves_inputs = false,
                       .samples = [] { return unary_samples(-2, 2); }, .reference = reference_unary<math::Neg>});
  r.define(OpId::copy, {.name = "copy", .infer = infer_copy, .kernels = {cpu_copy}, .backward = copy_backward,
                        .saves_inputs = false, .samples = [] { return unary_samples(-2, 2); },
                        .reference = reference_copy});
  r.define(OpId::cast, {.name = "cast", .infer = infer_cast, .kernels = {cpu_cast}, .backward = cast_backward,
                        .samples = [] {
                          return std::vector<Sample>{
                              {"to float32", {reference::randn({3, 4}, 21)}, {.dtype = DType::Float32}, {}, false},
                              {"to int64", {reference::uniform({5}, -9, 9, 22)}, {.dtype = DType::Int64}, {}, false},
                              {"to float64", {reference::randn({2, 3}, 23)}, {.dtype = DType::Float64}},
                          };
                        },
                        .reference = reference_cast});
}

// ---- public API -----------------------------------------------------------------------------------

namespace {
/// Casts both operands to their promoted dtype (recorded, so gradients flow back through the cast).
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b, const Site& site) {
  DType dtype = promote_types(a.dtype(), b.dtype());
  return {a.dtype() == dtype ? a : a.to(dtype, site), b.dtype() == dtype ? b : b.to(dtype, site)};
}

/// A scalar operand as a 0-dim tensor beside `like`: same dtype, except a fractional value next to an
/// integer tensor, which promotes to float32 as in PyTorch.
Tensor scalar_like(double value, const Tensor& like) {
  DType dtype = like.dtype();
  if (!is_floating(dtype) && value != std::floor(value)) dtype = DType::Float32;
  return scalar_tensor(value, dtype, like.device());
}

Tensor binary(OpId id, const Tensor& a, const Tensor& b, const Site& site) {
  auto [x, y] = promoted(a, b, site);
  return call1(id, {x, y}, {}, site);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::add, a, b, site); }
Tensor sub(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::sub, a, b, site); }
Tensor mul(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::mul, a, b, site); }
Tensor div(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::div, a, b, site); }
Tensor neg(const Tensor& x, Site site) { return call1(OpId::neg, {x}, {}, site); }

Tensor Tensor::add(const Tensor& other, Site site) const { return mf::add(*this, other, site); }
Tensor Tensor::sub(const Tensor& other, Site site) const { return mf::sub(*this, other, site); }
Tensor Tensor::mul(const Tensor& other, Site site) const { return mf::mul(*this, other, site); }
Tensor Tensor::div(const Tensor& other, Site site) const { return mf::div(*this, other, site); }
Tensor Tensor::add(double other, Site site) const { return mf::add(*this, scalar_like(other, *this), site); }
Tensor Tensor::sub(double other, Site site) const { return mf::sub(*this, scalar_like(other, *this), site); }
Tensor Tensor::mul(double other, Site site) const { return mf::mul(*this, scalar_like(other, *this), site); }
Tensor Tensor::div(double other, Site site) const { return mf::div(*this, scalar_like(other, *this), site); }
Tensor Tensor::neg(Site site) const { return mf::neg(*this, site); }

Tensor operator+(At a, const Tensor& b) { return add(a.tensor, b, a.site); }
Tensor operator-(At a, const Tensor& b) { return sub(a.tensor, b, a.site); }
Tensor operator*(At a, const Tensor& b) { return mul(a.tensor, b, a.site); }
Tensor operator/(At a, const Tensor& b) { return div(a.tensor, b, a.site); }
Tensor operator+(At a, double b) { return a.tensor.add(b, a.site); }
Tensor operator-(At a, double b) { return a.tensor.sub(b, a.site); }
Tensor operator*(At a, double b) { return a.tensor.mul(b, a.site); }
Tensor operator/(At a, double b) { return a.tensor.div(b, a.site); }
Tensor operator+(double a, At b) { return add(scalar_like(a, b.tensor), b.tensor, b.site); }
Tensor operator-(double a, At b) { return sub(scalar_like(a, b.tensor), b.tensor, b.site); }
Tensor operator*(double a, At b) { return mul(scalar_like(a, b.tensor), b.tensor, b.site); }
Tensor operator/(double a, At b) { return div(scalar_like(a, b.tensor), b.tensor, b.site); }
Tensor operator-(At a) { return neg(a.tensor, a.site); }

Tensor& Tensor::add_(const Tensor& other, Site site) {
  call_inplace(OpId::add, *this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::add_(double other, Site site) { return add_(scalar_tensor(other, dtype(), device()), site); }
Tensor& Tensor::sub_(const Tensor& other, Site site) {
  call_inplace(OpId::sub, *this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::mul_(const Tensor& other, Site site) {
  call_inplace(OpId::mul, *this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::mul_(double other, Site site) { return mul_(scalar_tensor(other, dtype(), device()), site); }
Tensor& Tensor::div_(const Tensor& other, Site site) {
  call_inplace(OpId::div, *this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src, Site site) {
  Tensor source = src.device() == device() ? src : src.to(device(), site);
  if (source.dtype() != dtype()) source = source.to(dtype(), site);
  if (source.shape() != shape()) source = source.expand(shape(), site);
  call_inplace(OpId::copy, *this, {source}, {}, site);
  return *this;
}

Tensor Tensor::clone(Site site) const { return call1(OpId::copy, {*this}, {}, site); }

Tensor Tensor::contiguous(Site site) const { return is_contiguous() ? *this : clone(site); }

Tensor Tensor::to(Device device, Site site) const {
  return device == this->device() ? *this : call1(OpId::to_device, {*this}, {.device = device}, site);
}

Tensor Tensor::to(DType dtype, Site site) const {
  return dtype == this->dtype() ? *this : call1(OpId::cast, {*this}, {.dtype = dtype}, site);
}

}  // namespace mf
