// Input checks and small helpers shared by the op fronts and the fused nn kernels.
#pragma once

#include "core/generator.h"
#include "core/graph.h"
#include "core/tensor.h"
#include "ops/cpu/loops.h"
#include "ops/kernel_api.h"
#include "ops/registry.h"
#include "ops/cpu/simd.h"

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
  if (dtype != DType::Int64) return;
  MF_CHECK(std::isfinite(value) && value >= -0x1p63 && value < 0x1p63, "{} {} is not representable in an int64 tensor",
           what, value);
}

inline void expect_int64(const Tensor& t, std::string_view name) {
  MF_CHECK(t.dtype() == DType::Int64, "expects int64 {}, got {} (shape {})", name, dtype_name(t.dtype()),
           shape_str(t.shape()));
}

/// Dropout with its probability p and Philox stream (seed, counter) on elements [first, first + n)
/// of a contiguous tensor: out[j] = in[j] * (0 or 1 / (1 - p)), element i kept when word i % 4 of
/// Philox block (seed, counter + i / 4), as a uniform on [0, 1), is >= p. The mask depends on the
/// stream and the element index alone, never on how the work is split. out may be in; a second
/// pair (in2, out2), where given, gets the same mask from the same draws. Inlined into its callers'
/// with_widest_isa bodies, where the loops vectorise.
template <typename T>
MF_INLINE void apply_dropout(const DropoutParams& dropout, int64_t first, int64_t n, const T* in, T* out,
                             const T* in2 = nullptr, T* out2 = nullptr) {
  double p = dropout.p;
  // uniform_float(word) >= p  <=>  word >> 8 >= p * 2^24 (exact in double)  <=>  word >> 8 >= threshold:
  // an integer compare, which vectorises.
  auto threshold = static_cast<uint32_t>(std::ceil(p * 0x1p24));
  T scale = p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T{0};
  constexpr int64_t kBatchBlocks = 64;  // Philox blocks made per batch: 1 KiB of words on the stack
  uint32_t words[4 * kBatchBlocks];
  for (int64_t done = 0; done < n;) {
    int64_t element = first + done, skip = element % 4, count = std::min(4 * kBatchBlocks - skip, n - done);
    philox_fill(dropout.stream.seed, dropout.stream.counter + static_cast<uint64_t>(element / 4),
                (skip + count + 3) / 4, words);
    const uint32_t* w = words + skip;
    // A multiply by the scale or 0, not a select: that vectorises.
    auto keep = [=](int64_t j) MF_LAMBDA_INLINE { return scale * static_cast<T>((w[j] >> 8) >= threshold); };
    for (int64_t j = 0; j < count; ++j) out[done + j] = in[done + j] * keep(j);
    if (in2 != nullptr)
      for (int64_t j = 0; j < count; ++j) out2[done + j] = in2[done + j] * keep(j);
    done += count;
  }
}

}  // namespace mf::detail
