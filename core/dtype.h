// Element types a tensor can hold, and the compile-time mapping between them and C++ types.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

// Marks functions that CUDA kernels call too (bfloat16's conversions, ops/math.h's functors).
#if defined(__CUDACC__)
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

namespace mf {

/// The element types. BFloat16 and Int8 are storage types: tensors hold them, print them, cast to and
/// from them, copy, fill and view them, and checkpoints store them (Int8 holds quantized weights);
/// kernels never compute in them. The dispatcher runs an op on bfloat16 inputs in float32 and rounds
/// its results (as PyTorch's CPU kernels do); an op that does arithmetic refuses int8.
enum class DType : uint8_t { Float32, Float64, Int64, Bool, BFloat16, Int8 };
inline constexpr int kDTypeCount = 6;

/// bfloat16: float32's sign, 8 exponent bits and top 7 fraction bits (Google Brain's format, as in
/// PyTorch and the AVX512-BF16 instructions). Conversions from float and double round to nearest,
/// ties to even, and keep infinities and NaN (a NaN stays a NaN, made quiet); subnormals are kept,
/// not flushed. To float it is exact.
struct bfloat16 {
  uint16_t bits = 0;

  constexpr bfloat16() = default;
  MF_HOST_DEVICE explicit bfloat16(float value) : bits(round_float(value)) {}
  MF_HOST_DEVICE explicit bfloat16(double value) : bfloat16(round_to_odd(value)) {}
  /// Holders of integers and bools convert through double, as static_cast between arithmetic types does.
  template <typename T>
    requires std::is_integral_v<T>
  MF_HOST_DEVICE explicit bfloat16(T value) : bfloat16(static_cast<double>(value)) {}
  MF_HOST_DEVICE static constexpr bfloat16 from_bits(uint16_t bits) {
    bfloat16 b;
    b.bits = bits;
    return b;
  }

  MF_HOST_DEVICE explicit operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  MF_HOST_DEVICE explicit operator double() const { return static_cast<float>(*this); }
  template <typename T>
    requires std::is_integral_v<T>
  MF_HOST_DEVICE explicit operator T() const {
    return static_cast<T>(static_cast<float>(*this));
  }

 private:
  MF_HOST_DEVICE static uint16_t round_float(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x0040);  // quiet, sign and payload top kept
    // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to the even kept value; a carry
    // out of the fraction moves the exponent up (to infinity past the largest finite value).
    return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  /// value rounded to a float whose lowest bit records whether anything was dropped (round to odd):
  /// rounding that float to bfloat16 then gives the correctly rounded double, with float's 16 extra
  /// fraction bits to spare (round to odd is exact for a second rounding with at least 2 fewer bits).
  MF_HOST_DEVICE static float round_to_odd(double value) {
    float f = static_cast<float>(value);
    if (!std::isfinite(f) || static_cast<double>(f) == value) return f;
    if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);  // truncate
    return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
  }
};

/// Short PyTorch-style name ("float32", "int64", ...).
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
  }
  return "?";
}

/// Bytes per element.
constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
  }
  return 0;
}

/// Float32, Float64 and BFloat16 (PyTorch's is_floating_point).
constexpr bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::BFloat16;
}

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::Int8; };
template <typename T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// The C++ types tensor elements are stored as: one per dtype.
template <typename T>
concept ElementType = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, bool> || std::is_same_v<T, bfloat16> || std::is_same_v<T, int8_t>;

/// The dtypes tensors store but ops do not compute in yet (bfloat16, int8).
constexpr bool is_storage_only(DType dtype) { return dtype == DType::BFloat16 || dtype == DType::Int8; }

/// One element converted as a cast converts it: static_cast, except that floating values reach int8
/// through int64 (truncated toward zero, then wrapped modulo 256, as PyTorch's CPU casts give), since
/// static_cast of a float outside int8's range is undefined.
template <typename To, typename From>
MF_HOST_DEVICE To convert(From x) {
  if constexpr (std::is_same_v<To, int8_t> && !std::is_integral_v<From>)
    return static_cast<int8_t>(static_cast<int64_t>(x));
  else
    return static_cast<To>(x);
}

namespace detail {
/// Throws mf::Error: a tensor of a storage-only dtype reached code that computes only in float32,
/// float64, int64 or bool (the dispatcher refuses it before any kernel that does; core/error.cpp).
[[noreturn]] void fail_not_computed(DType dtype);
}  // namespace detail

/// Calls `fn.template operator()<T>()` with T the C++ type of `dtype`, for the types kernels compute
/// in (float, double, int64_t, bool); a storage-only dtype throws (visit_any_dtype takes it):
///   visit_dtype(t.dtype(), [&]<typename T>() { fill<T>(t); });
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: return std::forward<Fn>(fn).template operator()<float>();
    case DType::Float64: return std::forward<Fn>(fn).template operator()<double>();
    case DType::Int64: return std::forward<Fn>(fn).template operator()<int64_t>();
    case DType::Bool: return std::forward<Fn>(fn).template operator()<bool>();
    case DType::BFloat16:
    case DType::Int8: detail::fail_not_computed(dtype);
  }
  return std::forward<Fn>(fn).template operator()<float>();
}

/// visit_dtype over every dtype, the storage-only ones included: for code that moves or converts
/// elements (copies, casts, fills, printing, checkpoints), where T converts with convert<>.
template <typename Fn>
decltype(auto) visit_any_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::BFloat16) return std::forward<Fn>(fn).template operator()<bfloat16>();
  if (dtype == DType::Int8) return std::forward<Fn>(fn).template operator()<int8_t>();
  return visit_dtype(dtype, std::forward<Fn>(fn));
}

/// Like visit_dtype, for float and double only; other dtypes reach `fn` as float, so callers
/// validate the dtype first (op fronts do; the dispatcher refuses storage-only dtypes before them).
template <typename Fn>
decltype(auto) visit_floating(DType dtype, Fn&& fn) {
  if (dtype == DType::Float64) return std::forward<Fn>(fn).template operator()<double>();
  if (is_storage_only(dtype)) detail::fail_not_computed(dtype);
  return std::forward<Fn>(fn).template operator()<float>();
}

/// The type two operands are computed in (PyTorch's promotion: bfloat16 with a wider float gives the
/// wider one, with an integer or bool stays bfloat16; int8 with int64 gives int64, with bool int8).
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  if (a == DType::Float32 || b == DType::Float32) return DType::Float32;
  if (a == DType::BFloat16 || b == DType::BFloat16) return DType::BFloat16;
  if (a == DType::Int64 || b == DType::Int64) return DType::Int64;
  if (a == DType::Int8 || b == DType::Int8) return DType::Int8;
  return DType::Bool;
}

}  // namespace mf
