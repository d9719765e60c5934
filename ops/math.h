// Per-element math, shared by the CPU loops and the CUDA kernels so the CPU tests cover the formulas
// on both devices. Functors whose formula only makes sense for floating types say so; the op fronts
// keep other dtypes away from them.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"  // MF_HOST_DEVICE

namespace mf::math {

// ---- arithmetic ---------------------------------------------------------------------------------

struct Add { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a + b; } };
struct Sub { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a - b; } };
struct Mul { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a * b; } };
struct Div { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a / b; } };
struct Neg { template <typename T> MF_HOST_DEVICE T operator()(T a) const { return -a; } };

/// Integer power by squaring. Negative exponents give the truncated quotient 1 / a^-b: 1 for a = 1,
/// +-1 for a = -1, 0 otherwise (PyTorch's integer pow).
template <typename T>
MF_HOST_DEVICE T int_pow(T a, T b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b & 1) ? -1 : 1;
    return 0;
  }
  T result = 1;
  while (b > 0) {
    if (b & 1) result *= a;
    a *= a;
    b >>= 1;
  }
  return result;
}

struct Pow {
  template <typename T>
  MF_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return int_pow(a, b);
    } else {
      return std::pow(a, b);
    }
  }
};

// ---- unary math (floating, except Abs and Relu) ---------------------------------------------------

struct Abs {
  template <typename T>
  MF_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) {
      return x < 0 ? -x : x;
    } else {
      return std::fabs(x);  // also turns -0 into +0
    }
  }
};
// NaN compares false, so it passes through as in PyTorch.
struct Relu {
  template <typename T> MF_HOST_DEVICE T operator()(T x) const { return x < T(0) ? T(0) : x; }
};
struct Exp { template <typename T> MF_HOST_DEVICE T operator()(T x) const { return std::exp(x); } };
struct Log { template <typename T> MF_HOST_DEVICE T operator()(T x) const { return std::log(x); } };
struct Sqrt { template <typename T> MF_HOST_DEVICE T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <typename T> MF_HOST_DEVICE T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Tanh { template <typename T> MF_HOST_DEVICE T operator()(T x) const { return std::tanh(x); } };
struct Sigmoid {
  template <typename T> MF_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + std::exp(-x)); }
};

/// The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, as erfc keeps it: (1 + erf(x / sqrt 2)) / 2
/// is the same in exact arithmetic but cancels to 0 in the left tail (below x = -8.3 in double).
template <typename T>
MF_HOST_DEVICE T normal_cdf(T x) {
  return T(0.5) * std::erfc(x * T(-0.70710678118654752440));
}

/// Exact GELU: x * Phi(x).
struct Gelu {
  template <typename T>
  MF_HOST_DEVICE T operator()(T x) const { return x * normal_cdf(x); }
};

/// GELU's tanh approximation (PyTorch's approximate='tanh'): x (1 + tanh(u)) / 2 with
/// u = kScale (x + kCubic x^3), kScale = sqrt(2 / pi).
struct GeluTanh {
  static constexpr double kScale = 0.79788456080286535588, kCubic = 0.044715;
  template <typename T>
  MF_HOST_DEVICE static T inner(T x) {
    return T(kScale) * (x + T(kCubic) * x * x * x);
  }
  template <typename T>
  MF_HOST_DEVICE T operator()(T x) const {
    return T(0.5) * x * (T(1) + std::tanh(inner(x)));
  }
};

/// grad * d gelu_tanh / dx = grad * ((1 + t) / 2 + x (1 - t^2) u' / 2), t = tanh(u), u' = kScale
/// (1 + 3 kCubic x^2).
struct GeluTanhBackward {
  template <typename T>
  MF_HOST_DEVICE T operator()(T grad, T x) const {
    T t = std::tanh(GeluTanh::inner(x));
    T du = T(GeluTanh::kScale) * (T(1) + T(3 * GeluTanh::kCubic) * x * x);
    return grad * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};

/// relu's gradient from its output (PyTorch's threshold_backward(grad, out, 0)): grad where out > 0.
struct ReluBackward {
  template <typename T>
  MF_HOST_DEVICE T operator()(T grad, T out) const { return out <= T(0) ? T(0) : grad; }
};

/// grad * d gelu / dx, with d gelu / dx = Phi(x) + x * phi(x) and phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
struct GeluBackward {
  template <typename T>
  MF_HOST_DEVICE T operator()(T grad, T x) const {
    T pdf = T(0.39894228040143267794) * std::exp(T(-0.5) * x * x);
    return grad * (normal_cdf(x) + x * pdf);
  }
};

// ---- comparisons and logic (bool results) -------------------------------------------------------

struct Eq { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a < b; } };
struct Le { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <typename T> MF_HOST_DEVICE bool operator()(T a, T b) const { return a >= b; } };

/// Any dtype is read as truthy: non-zero (NaN included) is true.
struct LogicalNot { template <typename A> MF_HOST_DEVICE bool operator()(A a) const { return a == A(0); } };
struct LogicalAnd {
  template <typename A, typename B>
  MF_HOST_DEVICE bool operator()(A a, B b) const { return a != A(0) && b != B(0); }
};
struct LogicalOr {
  template <typename A, typename B>
  MF_HOST_DEVICE bool operator()(A a, B b) const { return a != A(0) || b != B(0); }
};

/// cond ? a : b without a branch (random conditions would mispredict half the time on a CPU).
template <typename T>
MF_HOST_DEVICE T select(bool cond, T a, T b) {
  T choices[2] = {b, a};
  return choices[cond];
}

struct Where {
  template <typename T> MF_HOST_DEVICE T operator()(bool cond, T a, T b) const { return select(cond, a, b); }
};

/// min(max(x, lo), hi), so lo > hi gives hi and NaN stays NaN, as torch.clamp. An absent bound is
/// passed as -inf / +inf (the lowest / highest value for integers).
template <typename T>
struct Clamp {
  T lo, hi;
  MF_HOST_DEVICE T operator()(T x) const {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
  }
  /// Bounds from clamp's optional attrs; a missing one is the type's own extreme.
  static Clamp from(const std::optional<double>& min, const std::optional<double>& max) {
    using limits = std::numeric_limits<T>;
    T lowest = limits::has_infinity ? -limits::infinity() : limits::lowest();
    T highest = limits::has_infinity ? limits::infinity() : limits::max();
    return {min ? static_cast<T>(*min) : lowest, max ? static_cast<T>(*max) : highest};
  }
};

}  // namespace mf::math
