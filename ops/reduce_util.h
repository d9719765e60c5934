// Shared by the reduction ops and the fused row ops (softmax): which dims a reduction covers, what
// shape it leaves, and the per-row kernels (sum, max, a vectorisable exp) they all run.
#pragma once

#include "core/tensor.h"
#include "ops/loops.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace mf {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // with or without the reduced dims, per keepdim
  Shape kept_shape;           // out_shape with reduced dims as size 1 (broadcasts against the input)
  int64_t reduced_numel = 1;  // elements folded into each output element
};

/// Normalises `dims` (empty = all), rejecting repeats and out-of-range dims.
ReducePlan plan_reduction(const Tensor& x, const Shape& dims, bool keepdim);

/// `x` as a contiguous [outer, reduced] matrix: kept dims first, reduced dims last (a copy unless
/// the reduced dims are already innermost).
Tensor rows_to_reduce(const Tensor& x, const ReducePlan& plan);

namespace cpu {

/// Independent accumulators per row: lets the compiler vectorise float reductions (which it may not
/// reorder otherwise) and keeps rounding error growing with n / kLanes rather than n.
inline constexpr int64_t kLanes = 16;

/// Calls fn(row, row_ptr, n) for every row of a contiguous [outer, n] matrix, rows split across
/// threads. Each row is reduced on one thread, so results do not depend on the thread count.
template <typename T, typename Fn>
void for_each_row(const Tensor& rows, Fn&& fn) {
  const T* data = static_cast<const T*>(rows.raw_data());
  int64_t n = rows.size(1);
  parallel_for(0, rows.size(0), std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t row = begin; row < end; ++row) fn(row, data + row * n, n);
               });
}

/// sum_i f(p[i]) over a contiguous run, in kLanes partial sums.
template <typename T, typename F>
T row_sum(const T* p, int64_t n, F f) {
  std::array<T, kLanes> lanes{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += f(p[i + k]);
  T total{0};
  for (; i < n; ++i) total += f(p[i]);
  for (T lane : lanes) total += lane;
  return total;
}

template <typename T>
T row_sum(const T* p, int64_t n) {
  return row_sum(p, n, [](T v) { return v; });
}

template <typename T>
constexpr bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

/// The row's largest (Greater) or smallest (Less) element, NaN if any element is NaN (as PyTorch's
/// amax). n >= 1.
template <typename T, bool Greater>
T row_extreme(const T* p, int64_t n) {
  auto pick = [](T a, T b) { return Greater ? (a > b ? a : b) : (a < b ? a : b); };
  std::array<T, kLanes> lanes;
  lanes.fill(p[0]);
  bool nan = false;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) {
      lanes[k] = pick(p[i + k], lanes[k]);
      nan |= is_nan(p[i + k]);
    }
  T best = p[0];
  for (; i < n; ++i) {
    best = pick(p[i], best);
    nan |= is_nan(p[i]);
  }
  for (T lane : lanes) best = pick(lane, best);
  return nan ? std::numeric_limits<T>::quiet_NaN() : best;
}

/// Index of the row's first largest (Greater) or smallest element, NaN counting as the extreme (as
/// PyTorch's max(dim) on CPU). n >= 1.
template <typename T, bool Greater>
int64_t row_arg_extreme(const T* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n && !is_nan(p[best]); ++i)
    if ((Greater ? p[i] > p[best] : p[i] < p[best]) || is_nan(p[i])) best = i;
  return best;
}

/// exp(x). Float runs a branch-free Cephes-style polynomial (within 2 ulp of std::exp) that the
/// compiler can vectorise: 0 below ln(FLT_MIN), inf above 88.376 (where 2^n would overflow), NaN for
/// NaN. Double calls std::exp.
template <typename T>
inline T exp_vec(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return std::exp(x);
  } else {
    constexpr float kHi = 88.3762626647949f, kLo = -87.3365478515625f;  // ln(FLT_MAX), ln(FLT_MIN)
    float c = x > kHi ? kHi : (x < kLo ? kLo : x);
    // n = round(c / ln 2) by the 1.5 * 2^23 trick, then r = c - n ln 2 in two parts (Cody-Waite).
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = c - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // 2^n
    float y = p * scale;
    y = x > kHi ? std::numeric_limits<float>::infinity() : y;
    y = x < kLo ? 0.0f : y;
    return x != x ? x : y;
  }
}

}  // namespace cpu
}  // namespace mf
