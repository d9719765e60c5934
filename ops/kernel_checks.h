// Input checks and small helpers shared by the op fronts and the fused nn kernels (the dropout mask
// they share is ops/cpu/dropout.h).
#pragma once

#include "ops/cpu/loops.h"
#include "ops/kernel_api.h"

#include <cmath>
#include <optional>
#include <string_view>
#include <utility>

namespace mf::detail {

/// Rows per parallel_for chunk so that a chunk holds about kParallelGrain elements.
inline int64_t grain_for(int64_t elements_per_row) {
  return std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(elements_per_row, 1));
}

inline void expect_tensor(const Tensor& t, std::string_view name, const Shape& shape, DType dtype) {
  MF_CHECK(t.shape() == shape && t.dtype() == dtype, "{} has shape {} and dtype {}, expected {} and {}", name,
           shape_str(t.shape()), dtype_name(t.dtype()), shape_str(shape), dtype_name(dtype));
}

inline void expect_float(const Tensor& t, std::string_view name) {
  MF_CHECK(is_floating(t.dtype()), "expects a float32 or float64 {}, got {} (shape {})", name,
           dtype_name(t.dtype()), shape_str(t.shape()));
}

/// The first index outside [0, high) that is not `skip` (ignore_index), as {flat position, value}.
inline std::optional<std::pair<int64_t, int64_t>> find_bad_index(const Tensor& indices, int64_t high,
                                                          std::optional<int64_t> skip = std::nullopt) {
  Tensor host = dense(indices.to(Device::cpu()));
  const int64_t* values = host.data_ptr<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i)
    if ((values[i] < 0 || values[i] >= high) && values[i] != skip) return std::pair{i, values[i]};
  return std::nullopt;
}

/// A scalar attribute written into, or compared with, elements of `dtype` must be representable
/// there: converting NaN, an infinity or a value past int64's range to int64 is undefined behaviour.
inline void expect_representable(double value, DType dtype, std::string_view what) {
  if (dtype == DType::Int64)
    MF_CHECK(std::isfinite(value) && value >= -0x1p63 && value < 0x1p63, "{} {} is not representable in an int64 tensor",
             what, value);
  if (dtype == DType::Int8)  // truncated toward zero, as casts do: (-129, 128) holds -128 ... 127
    MF_CHECK(std::isfinite(value) && value > -129 && value < 128, "{} {} is not representable in an int8 tensor", what,
             value);
}

inline void expect_int64(const Tensor& t, std::string_view name) {
  MF_CHECK(t.dtype() == DType::Int64, "expects int64 {}, got {} (shape {})", name, dtype_name(t.dtype()),
           shape_str(t.shape()));
}

}  // namespace mf::detail
