// CUDA kernels of the elementwise ops: arithmetic, unary math, comparisons, logic, selection, copies
// and casts. Each runs cuda::map with the same ops/math.h functor as its CPU kernel, so the formulas
// are the ones the CPU tests check. Checks and output allocation stay in the ops' fronts.
#include "cuda/kernels.h"
#include "cuda/loops.cuh"
#include "ops/math.h"

#include <limits>
#include <type_traits>

namespace mf::cuda {
namespace {

// ---- functors that are plumbing rather than math ---------------------------------------------------

template <typename To>
struct CastTo {
  template <typename From> __device__ To operator()(From x) const { return convert<To>(x); }
};
template <typename T>
struct FillWhere {
  T value;
  __device__ T operator()(T x, bool mask) const { return math::select(mask, value, x); }
};
template <typename T>
struct PowBy {
  T exponent;
  __device__ T operator()(T x) const { return math::Pow{}(x, exponent); }
};

// ---- kernels --------------------------------------------------------------------------------------

template <typename Fn>
void binary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) map<T, T, T>(out[0], {&in[0], &in[1]}, Fn{});
  });
}

template <typename Fn>
void binary_float(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_floating(out[0].dtype(), [&]<typename T>() { map<T, T, T>(out[0], {&in[0], &in[1]}, Fn{}); });
}

template <typename Fn>
void unary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) map<T, T>(out[0], {&in[0]}, Fn{});
  });
}

template <typename Fn>
void unary_float(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_floating(out[0].dtype(), [&]<typename T>() { map<T, T>(out[0], {&in[0]}, Fn{}); });
}

void pow_scalar(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>)
      map<T, T>(out[0], {&in[0]}, PowBy<T>{static_cast<T>(std::get<PowParams>(attrs).exponent)});
  });
}

void clamp(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      const auto& [min, max] = std::get<ClampParams>(attrs);
      auto fn = math::Clamp<T>::from(min, max);
      map<T, T>(out[0], {&in[0]}, fn);
    }
  });
}

template <typename Fn>
void compare(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename T>() { map<bool, T, T>(out[0], {&in[0], &in[1]}, Fn{}); });
}

void logical_not(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename A>() { map<bool, A>(out[0], {&in[0]}, math::LogicalNot{}); });
}

template <typename Fn>
void logical_binary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename A>() {
    visit_dtype(in[1].dtype(), [&]<typename B>() { map<bool, A, B>(out[0], {&in[0], &in[1]}, Fn{}); });
  });
}

void where(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() { map<T, bool, T, T>(out[0], {&in[0], &in[1], &in[2]}, math::Where{}); });
}

void masked_fill(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    map<T, T, bool>(out[0], {&in[0], &in[1]}, FillWhere<T>{static_cast<T>(std::get<FillParams>(attrs).value)});
  });
}

// Copies and casts take bfloat16 too, converting on the GPU with core/dtype.h's own rounding, so
// both devices give the same bits.
void copy(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_any_dtype(out[0].dtype(), [&]<typename T>() { map<T, T>(out[0], {&in[0]}, Identity{}); });
}

void cast(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_any_dtype(out[0].dtype(), [&]<typename To>() {
    visit_any_dtype(in[0].dtype(), [&]<typename From>() { map<To, From>(out[0], {&in[0]}, CastTo<To>{}); });
  });
}

}  // namespace

void register_elementwise(Registry& r) {
  auto set = [&](OpId id, KernelFn fn) { r.set_kernel(id, DeviceType::CUDA, fn); };
  set(OpId::add, binary<math::Add>);
  set(OpId::sub, binary<math::Sub>);
  set(OpId::mul, binary<math::Mul>);
  set(OpId::div, binary<math::Div>);
  set(OpId::pow, binary<math::Pow>);
  set(OpId::pow_scalar, pow_scalar);
  set(OpId::neg, unary<math::Neg>);
  set(OpId::abs, unary<math::Abs>);
  set(OpId::relu, unary<math::Relu>);
  set(OpId::exp, unary_float<math::Exp>);
  set(OpId::log, unary_float<math::Log>);
  set(OpId::sqrt, unary_float<math::Sqrt>);
  set(OpId::rsqrt, unary_float<math::Rsqrt>);
  set(OpId::gelu, unary_float<math::Gelu>);
  set(OpId::tanh, unary_float<math::Tanh>);
  set(OpId::sigmoid, unary_float<math::Sigmoid>);
  set(OpId::relu_backward, binary_float<math::ReluBackward>);
  set(OpId::gelu_backward, binary_float<math::GeluBackward>);
  set(OpId::gelu_tanh, unary_float<math::GeluTanh>);
  set(OpId::gelu_tanh_backward, binary_float<math::GeluTanhBackward>);
  set(OpId::clamp, clamp);
  set(OpId::eq, compare<math::Eq>);
  set(OpId::ne, compare<math::Ne>);
  set(OpId::lt, compare<math::Lt>);
  set(OpId::le, compare<math::Le>);
  set(OpId::gt, compare<math::Gt>);
  set(OpId::ge, compare<math::Ge>);
  set(OpId::logical_not, logical_not);
  set(OpId::logical_and, logical_binary<math::LogicalAnd>);
  set(OpId::logical_or, logical_binary<math::LogicalOr>);
  set(OpId::where, where);
  set(OpId::masked_fill, masked_fill);
  set(OpId::copy, copy);
  set(OpId::cast, cast);
}

}  // namespace mf::cuda
