// Element types a tensor can hold, and the compile-time mapping between them and C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace mf {

enum class DType : uint8_t { Float32, Float64, Int64, Bool };
inline constexpr int kDTypeCount = 4;

/// Short PyTorch-style name ("float32", "int64", ...).
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
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
  }
  return 0;
}

constexpr bool is_floating(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <typename T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// The C++ types tensor elements are stored as: one per dtype.
template <typename T>
concept ElementType = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, bool>;

/// Calls `fn.template operator()<T>()` with T the C++ type of `dtype`:
///   visit_dtype(t.dtype(), [&]<typename T>() { fill<T>(t); });
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: return std::forward<Fn>(fn).template operator()<float>();
    case DType::Float64: return std::forward<Fn>(fn).template operator()<double>();
    case DType::Int64: return std::forward<Fn>(fn).template operator()<int64_t>();
    case DType::Bool: return std::forward<Fn>(fn).template operator()<bool>();
  }
  return std::forward<Fn>(fn).template operator()<float>();
}

/// Like visit_dtype, for the floating types only; other dtypes reach `fn` as float, so callers
/// validate the dtype first (op fronts do).
template <typename Fn>
decltype(auto) visit_floating(DType dtype, Fn&& fn) {
  if (dtype == DType::Float64) return std::forward<Fn>(fn).template operator()<double>();
  return std::forward<Fn>(fn).template operator()<float>();
}

/// The type two operands are computed in (PyTorch's promotion for these four types).
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  if (a == DType::Float32 || b == DType::Float32) return DType::Float32;
  if (a == DType::Int64 || b == DType::Int64) return DType::Int64;
  return DType::Bool;
}

}  // namespace mf
