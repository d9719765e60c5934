// Elementwise ops: arithmetic, powers, math functions, clamp, comparisons, logic, where/masked_fill,
// casts and copies. Binary ops broadcast (NumPy rules); the public functions promote mixed dtypes with
// a cast first, so kernels see one dtype (logical ops excepted: they read each operand as truthy).
#include "ops/families.h"
#include "ops/kernel_checks.h"
#include "ops/cpu/loops.h"
#include "ops/math.h"
#include "ops/functional.h"
#include "ops/reference.h"

#include <cmath>
#include <functional>
#include <limits>

namespace mf {
namespace {

// ---- shared helpers -----------------------------------------------------------------------------

/// A scalar operand as a 0-dim tensor beside `like`: same dtype, except a fractional value next to an
/// integer tensor, which promotes to float32, and a value other than 0 or 1 next to a bool tensor,
/// which promotes to int64, as in PyTorch.
Tensor scalar_like(double value, const Tensor& like) {
  DType dtype = like.dtype();
  if (dtype == DType::Bool && value != 0 && value != 1) dtype = DType::Int64;
  if (!is_floating(dtype) && value != std::floor(value)) dtype = DType::Float32;
  return scalar_tensor(value, dtype, like.device());
}

/// A bool tensor of 0s and 1s from a fixed seed (masks and conditions for samples).
Tensor sample_bools(const Shape& shape, uint64_t seed) { return reference::randint(shape, 2, seed).to(DType::Bool); }

// ---- shared fronts and kernels ------------------------------------------------------------------

std::vector<OutputSpec> infer_binary_arith(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  MF_CHECK(a.dtype() == b.dtype(), "dtypes {} and {} differ (promote first)", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  MF_CHECK(a.dtype() != DType::Bool, "not defined for bool tensors (shapes {} and {})", shape_str(a.shape()),
           shape_str(b.shape()));
  return {{broadcast_shapes(a.shape(), b.shape()), a.dtype()}};
}

std::vector<OutputSpec> infer_binary_float(const std::vector<Tensor>& in, const Attrs& attrs) {
  MF_CHECK(is_floating(in[0].dtype()), "expects floating tensors, got {}", dtype_name(in[0].dtype()));
  return infer_binary_arith(in, attrs);
}

std::vector<OutputSpec> infer_unary_same(const std::vector<Tensor>& in, const Attrs&) {
  MF_CHECK(in[0].dtype() != DType::Bool, "not defined for bool tensors (shape {})", shape_str(in[0].shape()));
  return {{in[0].shape(), in[0].dtype()}};
}

// The public functions cast integer inputs to float32 first, as PyTorch does for exp, log, ...
std::vector<OutputSpec> infer_unary_float(const std::vector<Tensor>& in, const Attrs&) {
  MF_CHECK(is_floating(in[0].dtype()), "expects a floating tensor, got {} (shape {})", dtype_name(in[0].dtype()),
           shape_str(in[0].shape()));
  return {{in[0].shape(), in[0].dtype()}};
}

template <typename Fn>
void cpu_binary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) cpu::map<T, T, T>(out[0], {&in[0], &in[1]}, Fn{});
  });
}

template <typename Fn>
void cpu_binary_float(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_floating(out[0].dtype(), [&]<typename T>() { cpu::map<T, T, T>(out[0], {&in[0], &in[1]}, Fn{}); });
}

template <typename Fn>
void cpu_unary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) cpu::map<T, T>(out[0], {&in[0]}, Fn{});
  });
}

template <typename Fn>
void cpu_unary_float(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_floating(out[0].dtype(), [&]<typename T>() { cpu::map<T, T>(out[0], {&in[0]}, Fn{}); });
}

// Float32 exp, log, sigmoid and tanh on the CPU take ops/cpu/simd.h's polynomials (within 1 ulp of e^x
// and ln x over every 1021st float, as libm's expf and logf; sigmoid within 2.08, as with expf; tanh
// within 1.33 over every float, where PyTorch's SLEEF tanhf promises 1), which run on the widest vectors
// where libm computes one element per call. The functors below take float packs and float values alike,
// so every ISA and layout gives the same bits; float64 keeps ops/math.h's libm functors
// (cpu_unary_packed's Precise).
struct PackedExp {
  template <typename V>
  MF_INLINE V operator()(V x) const { return cpu::exp_wide<V, cpu::IntLanes<V>>(x); }
};
struct PackedLog {
  template <typename V>
  MF_INLINE V operator()(V x) const { return cpu::log_poly<V, cpu::IntLanes<V>>(x); }
};
struct PackedTanh {
  template <typename V>
  MF_INLINE V operator()(V x) const { return cpu::tanh_poly<V, cpu::IntLanes<V>>(x); }
};
struct PackedSigmoid {
  template <typename V>
  MF_INLINE V operator()(V x) const { return 1.0f / (1.0f + PackedExp{}(-x)); }
};
/// gelu's tanh approximation on float packs: u = kScale (x + kCubic x^3), as math::GeluTanh::inner
/// computes it for scalars, and e^-2u, from which the forward and backward functors below take
/// s = (1 + tanh u) / 2 = 1 / (1 + e^-2u) without forming 1 + tanh u, which cancels for negative u
/// (float32 tanh u rounds to -1 below u = -9, where gelu_tanh is still 1.5e-8 x).
constexpr auto kGeluScale = static_cast<float>(math::GeluTanh::kScale);
constexpr auto kGeluCubic = static_cast<float>(math::GeluTanh::kCubic);
template <typename V>
MF_INLINE V gelu_tanh_exp(V x) {
  V u = (x + x * x * x * kGeluCubic) * kGeluScale;
  return PackedExp{}(-2.0f * u);
}

/// gelu_tanh as x s.
struct PackedGeluTanh {
  template <typename V>
  MF_INLINE V operator()(V x) const { return x / (1.0f + gelu_tanh_exp(x)); }
};

/// gelu_tanh_backward: with e = e^-2u and 1 - s = 1 / (1 + 1 / e), 1 - tanh^2 u = 4 s (1 - s), so
/// grad * g'(x) = grad * (s + 2 x s (1 - s) u'), u' = kScale (1 + 3 kCubic x^2): no 1 - tanh^2 u to
/// cancel either. e = inf (u below -44) gives s = 0 and 1 - s = 1, e = 0 the reverse.
struct PackedGeluTanhBackward {
  template <typename V>
  MF_INLINE V operator()(V grad, V x) const {
    V e = gelu_tanh_exp(x);
    V s = 1.0f / (1.0f + e);
    V rest = 1.0f / (1.0f + 1.0f / e);
    V du = (1.0f + x * x * (3 * kGeluCubic)) * kGeluScale;
    return grad * (s + 2.0f * x * (s * rest) * du);
  }
};

/// The exact gelu's normal distribution on float packs, for a = |x|: the upper tail Q(a) = P(X > a) =
/// erfc(a / sqrt 2) / 2 as Numerical Recipes' erfcc gives it, t e^(-a^2 / 2 + P(t)) / 2 with t = 1 / (1 +
/// a / (2 sqrt 2)) and P of degree 9 (a Chebyshev fit within 1.05e-7 of erfc, relative to it, for every
/// a: measured against float64's erfc), so that Phi(x) = Q(-x) keeps its relative accuracy far into the
/// left tail, where 1 + erf(x / sqrt 2) cancels (PyTorch 2.15's float32 kernel, which takes that form,
/// gives -0 from x = -5.7 on). a^2 / 2 is held exactly, in two parts (Dekker's product: no FMA, so
/// every ISA gives the same bits): rounded to one float (by up to 3.8e-6 where it nears 100) it would
/// move the result by as much, relatively: 60 ulp.
template <typename V>
struct NormalTail {
  using I = cpu::IntLanes<V>;
  V half_t;                          // t / 2
  V tail_exp;                        // e^(-a^2 / 2 + P(t)), so Q(a) = half_t tail_exp
  V half_square_hi, half_square_lo;  // a^2 / 2 = hi + lo

  MF_INLINE explicit NormalTail(V x) {
    V a = x < 0.0f ? -x : x;
    a = a < 16.0f ? a : V{} + 16.0f;  // Q(16) underflows; the cap keeps Dekker's split finite
    V scaled = a * 4097.0f;           // a = a_hi + a_lo, 12 bits each (Veltkamp's split)
    V a_hi = scaled - (scaled - a), a_lo = a - a_hi;
    V square = a * a;
    V error = ((a_hi * a_hi - square) + 2.0f * a_hi * a_lo) + a_lo * a_lo;  // a^2 - square, exactly
    half_square_hi = square * 0.5f;
    half_square_lo = error * 0.5f;
    V t = 1.0f / (1.0f + a * 0.353553390593273762f);
    // P by Estrin's scheme: pairs, then pairs of pairs, a quarter of Horner's chain of dependent steps.
    V t2 = t * t, t4 = t2 * t2;
    V p01 = t * 1.00002368f - 1.26551223f, p23 = t * 0.09678418f + 0.37409196f;
    V p45 = t * 0.27886807f - 0.18628806f, p67 = t * 1.48851587f - 1.13520398f;
    V p89 = t * 0.17087277f - 0.82215223f;
    V p = ((p01 + p23 * t2) + (p45 + p67 * t2) * t4) + p89 * (t4 * t4);
    half_t = 0.5f * t;
    tail_exp = cpu::exp_wide<V, I>(-half_square_hi, p - half_square_lo);
  }
  /// y Phi(x) for x < 0 (y Q(a), the subnormal tail_exp multiplied last, so that it rounds once) and
  /// for x >= 0 (y (1 - Q(a))).
  MF_INLINE V times_cdf(V y, V x) const {
    return x < 0.0f ? (y * half_t) * tail_exp : y * (1.0f - half_t * tail_exp);
  }
  /// y phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi) (the exponential, subnormal below x = -13.15, last).
  MF_INLINE V times_pdf(V y) const {
    return (y * 0.398942280401432678f) * cpu::exp_wide<V, I>(-half_square_hi, -half_square_lo);
  }
};

/// gelu as x Phi(x).
struct PackedGelu {
  template <typename V>
  MF_INLINE V operator()(V x) const { return NormalTail<V>(x).times_cdf(x, x); }
};

/// gelu_backward: grad * (Phi(x) + x phi(x)), as grad Phi(x) + (grad x) phi(x).
struct PackedGeluBackward {
  template <typename V>
  MF_INLINE V operator()(V grad, V x) const {
    NormalTail<V> normal(x);
    return normal.times_cdf(grad, x) + normal.times_pdf(grad * x);
  }
};

/// y = f<V>(i) over a contiguous float32 output, i the element's offset, in packs of the widest vectors,
/// split over the thread pool.
template <typename F>
void packed_float_map(Tensor& y, F f) {
  float* target = y.data_ptr<float>();
  parallel_for(0, y.numel(), cpu::kParallelGrain, [&](int64_t begin, int64_t end) {
    cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
      cpu::pack_map<W>(target + begin, end - begin, [&]<typename V>(int64_t c) MF_LAMBDA_INLINE {
        return f.template operator()<V>(begin + c);
      });
    });
  });
}

/// A float32 functor Packed (float packs and values) and its float64 twin Precise as one kernel:
/// contiguous float32 tensors go through packed_float_map; other float32 layouts through cpu::map, one
/// element at a time, to the same bits; float64 through Precise.
template <typename Packed, typename Precise>
void cpu_unary_packed(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  Tensor& y = out[0];
  if (y.dtype() != DType::Float32) return cpu_unary_float<Precise>(in, out, attrs);  // float64, or visit's error
  if (!x.is_contiguous() || !y.is_contiguous()) return cpu::map<float, float>(y, {&x}, Packed{});
  const float* source = x.data_ptr<float>();
  packed_float_map(y, [&]<typename V>(int64_t i) MF_LAMBDA_INLINE { return Packed{}(cpu::load<V>(source + i)); });
}

/// cpu_unary_packed for two operands: packs where both are contiguous and of the output's shape (no
/// broadcasting), cpu::map elsewhere.
template <typename Packed, typename Precise>
void cpu_binary_packed(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &a = in[0], &b = in[1];
  Tensor& y = out[0];
  if (y.dtype() != DType::Float32) return cpu_binary_float<Precise>(in, out, attrs);
  if (!a.is_contiguous() || !b.is_contiguous() || !y.is_contiguous() || a.sizes() != y.sizes() ||
      b.sizes() != y.sizes())
    return cpu::map<float, float, float>(y, {&a, &b}, Packed{});
  const float *first = a.data_ptr<float>(), *second = b.data_ptr<float>();
  packed_float_map(y, [&]<typename V>(int64_t i) MF_LAMBDA_INLINE {
    return Packed{}(cpu::load<V>(first + i), cpu::load<V>(second + i));
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

/// Reference from a formula in double, written apart from the kernel's functor.
template <double (*F)(double)>
std::vector<Tensor> reference_formula(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return F(v[0]); })};
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

/// unary_samples(-2, 2) plus int64 values of both signs, for ops that keep integer dtypes.
std::vector<Sample> signed_samples() {
  std::vector<Sample> samples = unary_samples(-2, 2);
  samples.push_back({"int64", {reference::randint({7}, 9, 14).sub(4.0)}});
  return samples;
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

// ---- powers -------------------------------------------------------------------------------------

// d(a^b)/da = b a^(b-1) (0 where b = 0, even at a = 0); d(a^b)/db = a^b log(a) (0 where a = 0 and
// b >= 0, the limit PyTorch takes).
std::vector<Tensor> pow_backward(const GradContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1], &g = ctx.grads[0], &out = ctx.outputs[0];
  Tensor zero = scalar_like(0, a);
  Tensor da, db;
  if (ctx.needs_grad[0]) da = masked_fill(mul(g, mul(b, pow(a, b - 1.0))), eq(b, zero), 0);
  if (ctx.needs_grad[1]) db = masked_fill(mul(g, mul(out, log(a))), logical_and(eq(a, zero), ge(b, zero)), 0);
  return {da, db};
}

std::vector<Sample> pow_samples() {
  // Positive bases, so that log(base) in the exponent's gradient is finite.
  return {
      {"same shape", {reference::uniform({3, 4}, 0.5, 2, 31), reference::randn({3, 4}, 32)}},
      {"row x column", {reference::uniform({3, 1}, 0.5, 2, 33), reference::randn({1, 4}, 34)}},
      {"scalar exponent", {reference::uniform({2, 3}, 0.5, 2, 35), reference::randn({}, 36)}},
      {"scalar base", {reference::uniform({}, 0.5, 2, 37), reference::randn({2, 3}, 38)}},
      {"int64", {reference::randint({3, 4}, 5, 39), reference::randint({4}, 4, 40)}},
  };
}

std::vector<OutputSpec> infer_pow_scalar(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  double exponent = std::get<PowParams>(attrs).exponent;
  MF_CHECK(x.dtype() != DType::Bool, "not defined for bool tensors (shape {})", shape_str(x.shape()));
  detail::expect_representable(exponent, x.dtype(), "exponent");
  if (!is_floating(x.dtype()))
    MF_CHECK(exponent >= 0 && exponent == std::floor(exponent),
             "integer tensors (shape {}) need a non-negative integer exponent, got {}", shape_str(x.shape()),
             exponent);
  return {{x.shape(), x.dtype()}};
}

void cpu_pow_scalar(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  double exponent = std::get<PowParams>(attrs).exponent;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      T c = static_cast<T>(exponent);
      if (exponent == 2) {
        cpu::map<T, T>(out[0], {&in[0]}, [](T x) { return x * x; });
      } else {
        cpu::map<T, T>(out[0], {&in[0]}, [c](T x) { return math::Pow{}(x, c); });
      }
    }
  });
}

// d(x^c)/dx = c x^(c-1), and 0 for c = 0.
std::vector<Tensor> pow_scalar_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  double c = std::get<PowParams>(ctx.attrs).exponent;
  if (c == 0) return {zeros_like(ctx.grads[0])};
  return {mul(ctx.grads[0], pow(x, c - 1).mul(c))};
}

std::vector<Tensor> reference_pow_scalar(const std::vector<Tensor>& in, const Attrs& attrs) {
  double exponent = std::get<PowParams>(attrs).exponent;
  return {reference::map(in, in[0].dtype(), [&](std::span<const double> v) { return std::pow(v[0], exponent); })};
}

std::vector<Sample> pow_scalar_samples() {
  return {
      {"square", {reference::randn({3, 4}, 41)}, PowParams{.exponent = 2}},
      {"cube, 3-d", {reference::randn({2, 3, 4}, 42)}, PowParams{.exponent = 3}},
      {"square root", {reference::uniform({3, 4}, 0.5, 2, 43)}, PowParams{.exponent = 0.5}},
      {"negative fractional", {reference::uniform({5}, 0.5, 2, 44)}, PowParams{.exponent = -1.5}},
      {"zero exponent", {reference::randn({4}, 45)}, PowParams{.exponent = 0}},
      {"scalar", {reference::uniform({}, 0.5, 2, 46)}, PowParams{.exponent = 2.5}},
      {"int64", {reference::randint({6}, 5, 47)}, PowParams{.exponent = 3}},
  };
}

// ---- unary math ---------------------------------------------------------------------------------

// d|x|/dx = sign(x), 0 at 0 as in PyTorch.
std::vector<Tensor> abs_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor zero = scalar_like(0, x);
  return {mul(ctx.grads[0], sub(gt(x, zero).to(x.dtype()), lt(x, zero).to(x.dtype())))};
}

// Rules below that read the output save it (saves_outputs) instead of the input.
std::vector<Tensor> exp_backward(const GradContext& ctx) { return {mul(ctx.grads[0], ctx.outputs[0])}; }
std::vector<Tensor> log_backward(const GradContext& ctx) { return {div(ctx.grads[0], ctx.inputs[0])}; }
// d sqrt(x)/dx = 1 / (2 sqrt(x))
std::vector<Tensor> sqrt_backward(const GradContext& ctx) { return {div(ctx.grads[0], ctx.outputs[0] * 2.0)}; }
// d x^(-1/2)/dx = -x^(-3/2) / 2 = -out^3 / 2
std::vector<Tensor> rsqrt_backward(const GradContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  return {mul(ctx.grads[0], out * out * out * -0.5)};
}
// Gradient where the output is positive, in one pass (PyTorch's threshold_backward on the result).
std::vector<Tensor> relu_backward(const GradContext& ctx) {
  return {call1<OpId::relu_backward>({ctx.grads[0], ctx.outputs[0]}, {}, ctx.site)};
}
// relu_backward is linear in grad and piecewise constant in out.
std::vector<Tensor> relu_backward_backward(const GradContext& ctx) {
  Tensor dgrad = ctx.needs_grad[0] ? call1<OpId::relu_backward>({ctx.grads[0], ctx.inputs[1]}, {}, ctx.site) : Tensor();
  return {dgrad, ctx.needs_grad[1] ? zeros_like(ctx.inputs[1]) : Tensor()};
}
// d tanh/dx = 1 - tanh^2
std::vector<Tensor> tanh_backward(const GradContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  return {mul(ctx.grads[0], 1.0 - out * out)};
}
// d sigmoid/dx = sigmoid (1 - sigmoid)
std::vector<Tensor> sigmoid_backward(const GradContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  return {mul(ctx.grads[0], out * (1.0 - out))};
}

std::vector<Tensor> gelu_backward(const GradContext& ctx) {
  return {call1<OpId::gelu_backward>({ctx.grads[0], ctx.inputs[0]}, {}, ctx.site)};
}

// gelu_backward(grad, x) = grad * (Phi(x) + x phi(x)); its derivative in x is
// grad * (phi + phi + x phi') = grad * phi(x) (2 - x^2), since phi'(x) = -x phi(x).
std::vector<Tensor> gelu_backward_backward(const GradContext& ctx) {
  const Tensor &grad = ctx.inputs[0], &x = ctx.inputs[1], &gg = ctx.grads[0];
  Tensor dgrad, dx;
  if (ctx.needs_grad[0]) dgrad = call1<OpId::gelu_backward>({gg, x}, {}, ctx.site);
  if (ctx.needs_grad[1]) {
    Tensor pdf = exp(x * x * -0.5) * 0.39894228040143267794;
    dx = mul(gg * grad, pdf * (2.0 - x * x));
  }
  return {dgrad, dx};
}

std::vector<Tensor> gelu_tanh_backward(const GradContext& ctx) {
  return {call1<OpId::gelu_tanh_backward>({ctx.grads[0], ctx.inputs[0]}, {}, ctx.site)};
}

// gelu_tanh_backward(grad, x) = grad * g'(x); its derivative in x is grad * g''(x), with t = tanh(u):
// g'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2), u' = c (1 + 3 a x^2), u'' = 6 c a x (c and a are
// math::GeluTanh's kScale and kCubic), from differentiating math::GeluTanhBackward's formula once more.
std::vector<Tensor> gelu_tanh_backward_backward(const GradContext& ctx) {
  const Tensor &grad = ctx.inputs[0], &x = ctx.inputs[1], &gg = ctx.grads[0];
  Tensor dgrad, dx;
  if (ctx.needs_grad[0]) dgrad = call1<OpId::gelu_tanh_backward>({gg, x}, {}, ctx.site);
  if (ctx.needs_grad[1]) {
    const double c = math::GeluTanh::kScale, a = math::GeluTanh::kCubic;
    Tensor t = tanh((x + x * x * x * a) * c);
    Tensor du = (x * x * (3 * a) + 1.0) * c, ddu = x * (6 * c * a);
    Tensor second = (1.0 - t * t) * (du + x * (ddu - t * du * du * 2.0) * 0.5);
    dx = mul(gg * grad, second);
  }
  return {dgrad, dx};
}

double ref_abs(double x) { return std::fabs(x); }
double ref_exp(double x) { return std::exp(x); }
double ref_log(double x) { return std::log(x); }
double ref_sqrt(double x) { return std::sqrt(x); }
double ref_rsqrt(double x) { return 1.0 / std::sqrt(x); }
double ref_relu(double x) { return x > 0 ? x : 0; }
double ref_tanh(double x) { return std::tanh(x); }
double ref_sigmoid(double x) { return 0.5 * (1 + std::tanh(x / 2)); }
double ref_gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double ref_gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

std::vector<Tensor> reference_relu_backward(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return v[1] > 0 ? v[0] : 0.0; })};
}

std::vector<Tensor> reference_gelu_tanh_backward(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) {
    // d/dx of x (1 + tanh(u)) / 2 in the sech^2 form: (1 + tanh u) / 2 + x sech^2(u) u' / 2.
    double x = v[1], u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    double sech = 1 / std::cosh(u), du = std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
    return v[0] * (0.5 * (1 + std::tanh(u)) + 0.5 * x * sech * sech * du);
  })};
}

std::vector<Tensor> reference_gelu_backward(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) {
    double x = v[1];
    return v[0] * (0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI));
  })};
}

// ---- clamp --------------------------------------------------------------------------------------

std::vector<OutputSpec> infer_clamp(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [min, max] = std::get<ClampParams>(attrs);
  MF_CHECK(min || max, "at least one of min and max must be given");
  if (min) detail::expect_representable(*min, in[0].dtype(), "min");
  if (max) detail::expect_representable(*max, in[0].dtype(), "max");
  return infer_unary_same(in, attrs);
}

void cpu_clamp(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      const auto& [min, max] = std::get<ClampParams>(attrs);
      auto fn = math::Clamp<T>::from(min, max);
      cpu::map<T, T>(out[0], {&in[0]}, fn);
    }
  });
}

// The gradient passes where min <= x <= max (bounds included, as PyTorch).
std::vector<Tensor> clamp_backward(const GradContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const auto& [min, max] = std::get<ClampParams>(ctx.attrs);
  Tensor outside;
  if (min) outside = lt(x, scalar_like(*min, x));
  if (max) {
    Tensor above = gt(x, scalar_like(*max, x));
    outside = outside.defined() ? logical_or(outside, above) : above;
  }
  return {masked_fill(ctx.grads[0], outside, 0)};
}

std::vector<Tensor> reference_clamp(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [min, max] = std::get<ClampParams>(attrs);
  return {reference::map(in, in[0].dtype(), [&](std::span<const double> v) {
    double x = v[0];
    if (min) x = std::max(x, *min);
    if (max) x = std::min(x, *max);
    return x;
  })};
}

std::vector<Sample> clamp_samples() {
  return {
      {"both bounds", {reference::randn({3, 4}, 71)}, ClampParams{.min = -0.5, .max = 0.5}},
      {"min only, 3-d", {reference::randn({2, 3, 4}, 72)}, ClampParams{.min = 0}},
      {"max only, scalar", {reference::randn({}, 73)}, ClampParams{.max = -0.25}},
      {"min above max", {reference::randn({5}, 74)}, ClampParams{.min = 1, .max = -1}},
      {"int64", {reference::randint({6}, 9, 75)}, ClampParams{.min = 2, .max = 5}},
  };
}

// ---- comparisons and logic ----------------------------------------------------------------------

std::vector<OutputSpec> infer_compare(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  MF_CHECK(a.dtype() == b.dtype(), "dtypes {} and {} differ (promote first)", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  return {{broadcast_shapes(a.shape(), b.shape()), DType::Bool}};
}

template <typename Fn>
void cpu_compare(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename T>() { cpu::map<bool, T, T>(out[0], {&in[0], &in[1]}, Fn{}); });
}

template <typename Compare>
std::vector<Tensor> reference_compare(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, DType::Bool, [](std::span<const double> v) { return Compare{}(v[0], v[1]) ? 1.0 : 0.0; })};
}

std::vector<Sample> compare_samples() {
  return {
      {"floats", {reference::randn({3, 4}, 81), reference::randn({3, 4}, 82)}},
      {"ties, row x column",
       {reference::randint({3, 1}, 3, 83).to(DType::Float64), reference::randint({1, 4}, 3, 84).to(DType::Float64)}},
      {"int64, trailing dim", {reference::randint({2, 3, 4}, 3, 85), reference::randint({4}, 3, 86)}},
      {"bool", {sample_bools({2, 3}, 87), sample_bools({2, 3}, 88)}},
      {"scalar", {reference::randn({}, 89), reference::randn({2, 3}, 90)}},
  };
}

std::vector<OutputSpec> infer_logical(const std::vector<Tensor>& in, const Attrs&) {
  Shape shape = in[0].shape();
  if (in.size() == 2) shape = broadcast_shapes(shape, in[1].shape());
  return {{shape, DType::Bool}};
}

void cpu_logical_not(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename A>() { cpu::map<bool, A>(out[0], {&in[0]}, math::LogicalNot{}); });
}

// Operands may have different dtypes: each is read as truthy in its own type.
template <typename Fn>
void cpu_logical_binary(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(in[0].dtype(), [&]<typename A>() {
    visit_dtype(in[1].dtype(), [&]<typename B>() { cpu::map<bool, A, B>(out[0], {&in[0], &in[1]}, Fn{}); });
  });
}

std::vector<Tensor> reference_logical_not(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, DType::Bool, [](std::span<const double> v) { return v[0] == 0 ? 1.0 : 0.0; })};
}

template <bool kAnd>
std::vector<Tensor> reference_logical(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, DType::Bool, [](std::span<const double> v) {
    bool a = v[0] != 0, b = v[1] != 0;
    return (kAnd ? a && b : a || b) ? 1.0 : 0.0;
  })};
}

std::vector<Sample> logical_samples(bool binary) {
  Tensor truthy = reference::randint({2, 3}, 3, 91).to(DType::Float64);  // 0, 1, 2
  if (!binary)
    return {{"bool", {sample_bools({3, 4}, 92)}}, {"float", {truthy}}, {"int64", {reference::randint({5}, 2, 93)}}};
  return {
      {"bool, row x column", {sample_bools({3, 1}, 94), sample_bools({1, 4}, 95)}},
      {"float and int64", {truthy, reference::randint({3}, 2, 96)}},
      {"scalar", {sample_bools({}, 97), sample_bools({2, 2}, 98)}},
  };
}

// ---- selection ----------------------------------------------------------------------------------

std::vector<OutputSpec> infer_where(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &cond = in[0], &a = in[1], &b = in[2];
  MF_CHECK(cond.dtype() == DType::Bool, "condition must be a bool tensor, got {} (shape {})",
           dtype_name(cond.dtype()), shape_str(cond.shape()));
  MF_CHECK(a.dtype() == b.dtype(), "dtypes {} and {} differ (promote first)", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  return {{broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape())), a.dtype()}};
}

void cpu_where(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    cpu::map<T, bool, T, T>(out[0], {&in[0], &in[1], &in[2]}, math::Where{});
  });
}

std::vector<Tensor> where_backward(const GradContext& ctx) {
  const Tensor &cond = ctx.inputs[0], &g = ctx.grads[0];
  return {Tensor(), ctx.needs_grad[1] ? masked_fill(g, logical_not(cond), 0) : Tensor(),
          ctx.needs_grad[2] ? masked_fill(g, cond, 0) : Tensor()};
}

std::vector<Tensor> reference_where(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[1].dtype(), [](std::span<const double> v) { return v[0] != 0 ? v[1] : v[2]; })};
}

std::vector<OutputSpec> infer_masked_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &mask = in[1];
  MF_CHECK(mask.dtype() == DType::Bool, "mask must be a bool tensor, got {} (shape {})", dtype_name(mask.dtype()),
           shape_str(mask.shape()));
  MF_CHECK(broadcasts_to(mask.shape(), x.shape()), "mask of shape {} does not broadcast to the input's shape {}",
           shape_str(mask.shape()), shape_str(x.shape()));
  detail::expect_representable(std::get<FillParams>(attrs).value, x.dtype(), "fill value");
  return {{x.shape(), x.dtype()}};
}

void cpu_masked_fill(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    auto value = static_cast<T>(std::get<FillParams>(attrs).value);
    cpu::map<T, T, bool>(out[0], {&in[0], &in[1]}, [value](T x, bool m) { return math::select(m, value, x); });
  });
}

std::vector<Tensor> masked_fill_backward(const GradContext& ctx) {
  return {masked_fill(ctx.grads[0], ctx.inputs[1], 0), Tensor()};
}

std::vector<Tensor> reference_masked_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  double value = std::get<FillParams>(attrs).value;
  return {reference::map(in, in[0].dtype(), [&](std::span<const double> v) { return v[1] != 0 ? value : v[0]; })};
}

// ---- copies -------------------------------------------------------------------------------------

std::vector<OutputSpec> infer_copy(const std::vector<Tensor>& in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

void cpu_copy(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_any_dtype(out[0].dtype(), [&]<typename T>() { cpu::map<T, T>(out[0], {&in[0]}, [](T x) { return x; }); });
}

std::vector<Tensor> copy_backward(const GradContext& ctx) { return {ctx.grads[0]}; }

std::vector<Tensor> reference_copy(const std::vector<Tensor>& in, const Attrs&) {
  return {reference::map(in, in[0].dtype(), [](std::span<const double> v) { return v[0]; })};
}

// Copies between devices. The CPU kernel serves cpu -> cpu; copies that touch a GPU belong to the CUDA
// layer (a build without CUDA cannot even allocate the CUDA output, and says so).
void cpu_to_device(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  MF_CHECK(out[0].device().is_cpu(), "copying from cpu to {} needs the CUDA backend", out[0].device().str());
  cpu_copy(in, out, attrs);
}

std::vector<Tensor> to_device_backward(const GradContext& ctx) {
  return {ctx.grads[0].to(ctx.inputs[0].device(), ctx.site)};
}

std::vector<OutputSpec> infer_cast(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {{in[0].shape(), std::get<CastParams>(attrs).dtype}};
}

void cpu_cast(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  visit_any_dtype(out[0].dtype(), [&]<typename To>() {
    visit_any_dtype(in[0].dtype(), [&]<typename From>() {
      cpu::map<To, From>(out[0], {&in[0]}, [](From x) { return convert<To>(x); });
    });
  });
}

// Gradients flow back in the input's dtype; casts from or to integer types carry none.
std::vector<Tensor> cast_backward(const GradContext& ctx) {
  return {ctx.grads[0].to(ctx.inputs[0].dtype())};
}

std::vector<Tensor> reference_cast(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {reference::map(in, std::get<CastParams>(attrs).dtype, [](std::span<const double> v) { return v[0]; })};
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
                        .saves_inputs = false, .takes_storage_dtypes = true, .samples = [] { return unary_samples(-2, 2); },
                        .reference = reference_copy});
  r.define(OpId::cast,
           {.name = "cast",
            .infer = infer_cast,
            .kernels = {cpu_cast},
            .backward = cast_backward,
            .takes_storage_dtypes = true,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"to float32", {reference::randn({3, 4}, 21)}, CastParams{.dtype = DType::Float32}, {}, false},
                      {"to int64", {reference::uniform({5}, -9, 9, 22)}, CastParams{.dtype = DType::Int64}, {}, false},
                      {"to float64", {reference::randn({2, 3}, 23)}, CastParams{.dtype = DType::Float64}},
                  };
                },
            .reference = reference_cast});
  r.define(OpId::to_device,
           {.name = "to_device",
            .infer = infer_copy,
            .kernels = {cpu_to_device},
            .backward = to_device_backward,
            .mixes_devices = true,
            .takes_storage_dtypes = true,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"cpu to cpu", {reference::randn({3, 4}, 24)}, ToDeviceParams{.device = Device::cpu()}},
                      {"int64 scalar", {reference::randint({}, 9, 25)}, ToDeviceParams{.device = Device::cpu()}},
                  };
                },
            .reference = reference_copy});

  r.define(OpId::pow, {.name = "pow", .infer = infer_binary_arith, .kernels = {cpu_binary<math::Pow>},
                       .backward = pow_backward, .saves_outputs = true, .samples = pow_samples,
                       .reference = reference_binary<math::Pow>});
  r.define(OpId::pow_scalar, {.name = "pow_scalar", .infer = infer_pow_scalar, .kernels = {cpu_pow_scalar},
                              .backward = pow_scalar_backward, .samples = pow_scalar_samples,
                              .reference = reference_pow_scalar});

  auto unary = [&](OpId id, std::string_view name, InferFn infer, KernelFn kernel, BackwardFn backward,
                   bool saves_output, SamplesFn samples, ReferenceFn reference) {
    r.define(id, {.name = name, .infer = infer, .kernels = {kernel}, .backward = backward,
                  .saves_inputs = !saves_output, .saves_outputs = saves_output, .samples = samples,
                  .reference = reference});
  };
  SamplesFn any_sign = [] { return unary_samples(-2, 2); };
  SamplesFn positive = [] { return unary_samples(0.5, 3); };
  SamplesFn wide = [] { return unary_samples(-4, 4); };
  unary(OpId::abs, "abs", infer_unary_same, cpu_unary<math::Abs>, abs_backward, false, signed_samples,
        reference_formula<ref_abs>);
  unary(OpId::exp, "exp", infer_unary_float, cpu_unary_packed<PackedExp, math::Exp>, exp_backward, true,
        any_sign, reference_formula<ref_exp>);
  unary(OpId::log, "log", infer_unary_float, cpu_unary_packed<PackedLog, math::Log>, log_backward, false,
        positive, reference_formula<ref_log>);
  unary(OpId::sqrt, "sqrt", infer_unary_float, cpu_unary_float<math::Sqrt>, sqrt_backward, true, positive,
        reference_formula<ref_sqrt>);
  unary(OpId::rsqrt, "rsqrt", infer_unary_float, cpu_unary_float<math::Rsqrt>, rsqrt_backward, true, positive,
        reference_formula<ref_rsqrt>);
  unary(OpId::relu, "relu", infer_unary_same, cpu_unary<math::Relu>, relu_backward, true, signed_samples,
        reference_formula<ref_relu>);
  unary(OpId::gelu, "gelu", infer_unary_float, cpu_unary_packed<PackedGelu, math::Gelu>, gelu_backward, false, wide,
        reference_formula<ref_gelu>);
  unary(OpId::gelu_tanh, "gelu_tanh", infer_unary_float, cpu_unary_packed<PackedGeluTanh, math::GeluTanh>,
        gelu_tanh_backward, false, wide, reference_formula<ref_gelu_tanh>);
  unary(OpId::tanh, "tanh", infer_unary_float, cpu_unary_packed<PackedTanh, math::Tanh>, tanh_backward, true,
        wide, reference_formula<ref_tanh>);
  unary(OpId::sigmoid, "sigmoid", infer_unary_float, cpu_unary_packed<PackedSigmoid, math::Sigmoid>,
        sigmoid_backward, true, wide, reference_formula<ref_sigmoid>);
  r.define(OpId::relu_backward, {.name = "relu_backward", .infer = infer_binary_float,
                                 .kernels = {cpu_binary_float<math::ReluBackward>},
                                 .backward = relu_backward_backward, .samples = [] { return binary_samples(-2, 2); },
                                 .reference = reference_relu_backward});
  r.define(OpId::gelu_backward, {.name = "gelu_backward", .infer = infer_binary_float,
                                 .kernels = {cpu_binary_packed<PackedGeluBackward, math::GeluBackward>},
                                 .backward = gelu_backward_backward, .samples = [] { return binary_samples(-3, 3); },
                                 .reference = reference_gelu_backward});
  r.define(OpId::gelu_tanh_backward, {.name = "gelu_tanh_backward", .infer = infer_binary_float,
                                      .kernels = {cpu_binary_packed<PackedGeluTanhBackward, math::GeluTanhBackward>},
                                      .backward = gelu_tanh_backward_backward,
                                      .samples = [] { return binary_samples(-3, 3); },
                                      .reference = reference_gelu_tanh_backward});
  r.define(OpId::clamp, {.name = "clamp", .infer = infer_clamp, .kernels = {cpu_clamp}, .backward = clamp_backward,
                         .samples = clamp_samples, .reference = reference_clamp});

  auto comparison = [&](OpId id, std::string_view name, KernelFn kernel, ReferenceFn reference) {
    r.define(id, {.name = name, .infer = infer_compare, .kernels = {kernel}, .samples = compare_samples,
                  .reference = reference});
  };
  comparison(OpId::eq, "eq", cpu_compare<math::Eq>, reference_compare<std::equal_to<>>);
  comparison(OpId::ne, "ne", cpu_compare<math::Ne>, reference_compare<std::not_equal_to<>>);
  comparison(OpId::lt, "lt", cpu_compare<math::Lt>, reference_compare<std::less<>>);
  comparison(OpId::le, "le", cpu_compare<math::Le>, reference_compare<std::less_equal<>>);
  comparison(OpId::gt, "gt", cpu_compare<math::Gt>, reference_compare<std::greater<>>);
  comparison(OpId::ge, "ge", cpu_compare<math::Ge>, reference_compare<std::greater_equal<>>);
  r.define(OpId::logical_not, {.name = "logical_not", .infer = infer_logical, .kernels = {cpu_logical_not},
                               .samples = [] { return logical_samples(false); }, .reference = reference_logical_not});
  r.define(OpId::logical_and, {.name = "logical_and", .infer = infer_logical,
                               .kernels = {cpu_logical_binary<math::LogicalAnd>},
                               .samples = [] { return logical_samples(true); }, .reference = reference_logical<true>});
  r.define(OpId::logical_or, {.name = "logical_or", .infer = infer_logical,
                              .kernels = {cpu_logical_binary<math::LogicalOr>},
                              .samples = [] { return logical_samples(true); }, .reference = reference_logical<false>});

  r.define(OpId::where, {.name = "where", .infer = infer_where, .kernels = {cpu_where}, .backward = where_backward,
                         .samples = [] {
                           return std::vector<Sample>{
                               {"same shape", {sample_bools({3, 4}, 101), reference::randn({3, 4}, 102),
                                               reference::randn({3, 4}, 103)}},
                               {"all three broadcast", {sample_bools({3, 1}, 104), reference::randn({1, 4}, 105),
                                                        reference::randn({}, 106)}},
                               {"3-d, int64", {sample_bools({4}, 107), reference::randint({2, 3, 4}, 9, 108),
                                               reference::randint({3, 1}, 9, 109)}},
                           };
                         },
                         .reference = reference_where});
  r.define(
      OpId::masked_fill,
      {.name = "masked_fill",
       .infer = infer_masked_fill,
       .kernels = {cpu_masked_fill},
       .backward = masked_fill_backward,
       .samples =
           [] {
             return std::vector<Sample>{
                 {"same shape", {reference::randn({3, 4}, 111), sample_bools({3, 4}, 112)}, FillParams{.value = -7.5}},
                 {"broadcast mask",
                  {reference::randn({2, 3, 4}, 113), sample_bools({3, 1}, 114)},
                  FillParams{.value = 2.5}},
                 {"scalar mask", {reference::randn({2, 3}, 115), sample_bools({}, 116)}, FillParams{}},
                 {"int64", {reference::randint({5}, 9, 117), sample_bools({5}, 118)}, FillParams{.value = -3}},
             };
           },
       .reference = reference_masked_fill});
}

// ---- public API -----------------------------------------------------------------------------------

namespace {
/// Casts both operands to their promoted dtype (recorded, so gradients flow back through the cast).
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b, const Site& site) {
  DType dtype = promote_types(a.dtype(), b.dtype());
  return {a.dtype() == dtype ? a : a.to(dtype, site), b.dtype() == dtype ? b : b.to(dtype, site)};
}

/// Integer and bool inputs of float-only functions compute in float32, as in PyTorch.
Tensor floating(const Tensor& x, const Site& site) { return is_floating(x.dtype()) ? x : x.to(DType::Float32, site); }

bool fractional(std::optional<double> value) { return value && *value != std::floor(*value); }

Tensor binary(OpId id, const Tensor& a, const Tensor& b, const Site& site) {
  auto [x, y] = promoted(a, b, site);
  return call1(id, {x, y}, {}, site);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::add, a, b, site); }
Tensor sub(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::sub, a, b, site); }
Tensor mul(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::mul, a, b, site); }
Tensor div(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::div, a, b, site); }
Tensor neg(const Tensor& x, Site site) { return call1<OpId::neg>({x}, {}, site); }

Tensor pow(const Tensor& base, const Tensor& exponent, Site site) { return binary(OpId::pow, base, exponent, site); }
Tensor pow(const Tensor& base, double exponent, Site site) {
  Tensor x = fractional(exponent) ? floating(base, site) : base;
  return call1<OpId::pow_scalar>({x}, {.exponent = exponent}, site);
}
Tensor abs(const Tensor& x, Site site) { return call1<OpId::abs>({x}, {}, site); }
Tensor exp(const Tensor& x, Site site) { return call1<OpId::exp>({floating(x, site)}, {}, site); }
Tensor log(const Tensor& x, Site site) { return call1<OpId::log>({floating(x, site)}, {}, site); }
Tensor sqrt(const Tensor& x, Site site) { return call1<OpId::sqrt>({floating(x, site)}, {}, site); }
Tensor rsqrt(const Tensor& x, Site site) { return call1<OpId::rsqrt>({floating(x, site)}, {}, site); }
Tensor relu(const Tensor& x, Site site) { return call1<OpId::relu>({x}, {}, site); }
Tensor gelu(const Tensor& x, std::string_view approximate, Site site) {
  MF_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh', got '{}' at {}",
           approximate, format_location(site));
  if (approximate == "tanh") return call1<OpId::gelu_tanh>({floating(x, site)}, {}, site);
  return call1<OpId::gelu>({floating(x, site)}, {}, site);
}
Tensor tanh(const Tensor& x, Site site) { return call1<OpId::tanh>({floating(x, site)}, {}, site); }
Tensor sigmoid(const Tensor& x, Site site) { return call1<OpId::sigmoid>({floating(x, site)}, {}, site); }
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max, Site site) {
  Tensor input = fractional(min) || fractional(max) ? floating(x, site) : x;
  return call1<OpId::clamp>({input}, {.min = min, .max = max}, site);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Site site) {
  auto [x, y] = promoted(a, b, site);
  return call1<OpId::where>({cond, x, y}, {}, site);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Site site) {
  return call1<OpId::masked_fill>({x, mask}, {.value = value}, site);
}

Tensor eq(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::eq, a, b, site); }
Tensor ne(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::ne, a, b, site); }
Tensor lt(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::lt, a, b, site); }
Tensor le(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::le, a, b, site); }
Tensor gt(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::gt, a, b, site); }
Tensor ge(const Tensor& a, const Tensor& b, Site site) { return binary(OpId::ge, a, b, site); }
Tensor logical_not(const Tensor& x, Site site) { return call1<OpId::logical_not>({x}, {}, site); }
Tensor logical_and(const Tensor& a, const Tensor& b, Site site) { return call1<OpId::logical_and>({a, b}, {}, site); }
Tensor logical_or(const Tensor& a, const Tensor& b, Site site) { return call1<OpId::logical_or>({a, b}, {}, site); }

Tensor Tensor::add(const Tensor& other, Site site) const { return mf::add(*this, other, site); }
Tensor Tensor::sub(const Tensor& other, Site site) const { return mf::sub(*this, other, site); }
Tensor Tensor::mul(const Tensor& other, Site site) const { return mf::mul(*this, other, site); }
Tensor Tensor::div(const Tensor& other, Site site) const { return mf::div(*this, other, site); }
Tensor Tensor::add(double other, Site site) const { return mf::add(*this, scalar_like(other, *this), site); }
Tensor Tensor::sub(double other, Site site) const { return mf::sub(*this, scalar_like(other, *this), site); }
Tensor Tensor::mul(double other, Site site) const { return mf::mul(*this, scalar_like(other, *this), site); }
Tensor Tensor::div(double other, Site site) const { return mf::div(*this, scalar_like(other, *this), site); }
Tensor Tensor::neg(Site site) const { return mf::neg(*this, site); }
Tensor Tensor::pow(double exponent, Site site) const { return mf::pow(*this, exponent, site); }
Tensor Tensor::pow(const Tensor& exponent, Site site) const { return mf::pow(*this, exponent, site); }
Tensor Tensor::abs(Site site) const { return mf::abs(*this, site); }
Tensor Tensor::exp(Site site) const { return mf::exp(*this, site); }
Tensor Tensor::log(Site site) const { return mf::log(*this, site); }
Tensor Tensor::sqrt(Site site) const { return mf::sqrt(*this, site); }
Tensor Tensor::rsqrt(Site site) const { return mf::rsqrt(*this, site); }
Tensor Tensor::relu(Site site) const { return mf::relu(*this, site); }
Tensor Tensor::gelu(std::string_view approximate, Site site) const { return mf::gelu(*this, approximate, site); }
Tensor Tensor::tanh(Site site) const { return mf::tanh(*this, site); }
Tensor Tensor::sigmoid(Site site) const { return mf::sigmoid(*this, site); }
Tensor Tensor::clamp(std::optional<double> min, std::optional<double> max, Site site) const {
  return mf::clamp(*this, min, max, site);
}
Tensor Tensor::masked_fill(const Tensor& mask, double value, Site site) const {
  return mf::masked_fill(*this, mask, value, site);
}

Tensor Tensor::eq(const Tensor& other, Site site) const { return mf::eq(*this, other, site); }
Tensor Tensor::ne(const Tensor& other, Site site) const { return mf::ne(*this, other, site); }
Tensor Tensor::lt(const Tensor& other, Site site) const { return mf::lt(*this, other, site); }
Tensor Tensor::le(const Tensor& other, Site site) const { return mf::le(*this, other, site); }
Tensor Tensor::gt(const Tensor& other, Site site) const { return mf::gt(*this, other, site); }
Tensor Tensor::ge(const Tensor& other, Site site) const { return mf::ge(*this, other, site); }
Tensor Tensor::eq(double other, Site site) const { return mf::eq(*this, scalar_like(other, *this), site); }
Tensor Tensor::ne(double other, Site site) const { return mf::ne(*this, scalar_like(other, *this), site); }
Tensor Tensor::lt(double other, Site site) const { return mf::lt(*this, scalar_like(other, *this), site); }
Tensor Tensor::le(double other, Site site) const { return mf::le(*this, scalar_like(other, *this), site); }
Tensor Tensor::gt(double other, Site site) const { return mf::gt(*this, scalar_like(other, *this), site); }
Tensor Tensor::ge(double other, Site site) const { return mf::ge(*this, scalar_like(other, *this), site); }
Tensor Tensor::logical_not(Site site) const { return mf::logical_not(*this, site); }
Tensor Tensor::logical_and(const Tensor& other, Site site) const { return mf::logical_and(*this, other, site); }
Tensor Tensor::logical_or(const Tensor& other, Site site) const { return mf::logical_or(*this, other, site); }

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
  call_inplace<OpId::add>(*this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::add_(double other, Site site) { return add_(scalar_tensor(other, dtype(), device()), site); }
Tensor& Tensor::sub_(const Tensor& other, Site site) {
  call_inplace<OpId::sub>(*this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::mul_(const Tensor& other, Site site) {
  call_inplace<OpId::mul>(*this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::mul_(double other, Site site) { return mul_(scalar_tensor(other, dtype(), device()), site); }
Tensor& Tensor::div_(const Tensor& other, Site site) {
  call_inplace<OpId::div>(*this, {*this, other.dtype() == dtype() ? other : other.to(dtype(), site)}, {}, site);
  return *this;
}
Tensor& Tensor::sub_(double other, Site site) { return sub_(scalar_tensor(other, dtype(), device()), site); }
Tensor& Tensor::div_(double other, Site site) { return div_(scalar_tensor(other, dtype(), device()), site); }

Tensor operator<(At a, const Tensor& b) { return lt(a.tensor, b, a.site); }
Tensor operator<=(At a, const Tensor& b) { return le(a.tensor, b, a.site); }
Tensor operator>(At a, const Tensor& b) { return gt(a.tensor, b, a.site); }
Tensor operator>=(At a, const Tensor& b) { return ge(a.tensor, b, a.site); }
Tensor operator<(At a, double b) { return a.tensor.lt(b, a.site); }
Tensor operator<=(At a, double b) { return a.tensor.le(b, a.site); }
Tensor operator>(At a, double b) { return a.tensor.gt(b, a.site); }
Tensor operator>=(At a, double b) { return a.tensor.ge(b, a.site); }

Tensor& operator+=(InPlaceAt a, const Tensor& b) { return a.tensor.add_(b, a.site); }
Tensor& operator-=(InPlaceAt a, const Tensor& b) { return a.tensor.sub_(b, a.site); }
Tensor& operator*=(InPlaceAt a, const Tensor& b) { return a.tensor.mul_(b, a.site); }
Tensor& operator/=(InPlaceAt a, const Tensor& b) { return a.tensor.div_(b, a.site); }
Tensor& operator+=(InPlaceAt a, double b) { return a.tensor.add_(b, a.site); }
Tensor& operator-=(InPlaceAt a, double b) { return a.tensor.sub_(b, a.site); }
Tensor& operator*=(InPlaceAt a, double b) { return a.tensor.mul_(b, a.site); }
Tensor& operator/=(InPlaceAt a, double b) { return a.tensor.div_(b, a.site); }

Tensor& Tensor::masked_fill_(const Tensor& mask, double value, Site site) {
  call_inplace<OpId::masked_fill>(*this, {*this, mask}, {.value = value}, site);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src, Site site) {
  Tensor source = src.device() == device() ? src : src.to(device(), site);
  if (source.dtype() != dtype()) source = source.to(dtype(), site);
  if (source.shape() != shape()) source = source.expand(shape(), site);
  call_inplace<OpId::copy>(*this, {source}, {}, site);
  return *this;
}

Tensor Tensor::clone(Site site) const { return call1<OpId::copy>({*this}, {}, site); }

Tensor Tensor::contiguous(Site site) const { return is_contiguous() ? *this : clone(site); }

Tensor Tensor::to(Device device, Site site) const {
  return device == this->device() ? *this : call1<OpId::to_device>({*this}, {.device = device}, site);
}

Tensor Tensor::to(DType dtype, Site site) const {
  return dtype == this->dtype() ? *this : call1<OpId::cast>({*this}, {.dtype = dtype}, site);
}

}  // namespace mf
