// The row kernels of softmax, shared by the softmax ops and fused attention. Always-inline templates
// over the vector width W (bytes), compiled for each ISA by their callers under with_widest_isa: exp
// is the cost that matters; float runs it as a Cephes-style polynomial on GCC vectors (within 2 ulp
// of std::exp), double calls std::exp.
#pragma once

#include "ops/cpu/simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace mf::cpu {

/// out[j] = exp(inp[j] - shift[kShiftPerElement ? j : 0]) for one vector of lanes (with kStore; without,
/// out is not touched); sum += the exps.
template <int W, bool kShiftPerElement, bool kStore>
MF_INLINE void exp_lanes(const float* inp, const float* shift, float* out, typename Simd<float, W>::V& sum) {
  using V = typename Simd<float, W>::V;
  using I = typename Simd<int32_t, W>::V;
  V x, b = V{} + shift[0];
  std::memcpy(&x, inp, sizeof(V));
  if constexpr (kShiftPerElement) std::memcpy(&b, shift, sizeof(V));
  V y = exp_poly<V, I>(x - b);
  if constexpr (kStore) std::memcpy(out, &y, sizeof(V));
  sum += y;
}

/// out[i] = exp(inp[i] - shift[kShiftPerElement ? i : 0]) for i < n (with kStore; without, out is
/// not touched and may be null); returns the sum of the exps, kept in kSumLanes partial sums whatever
/// W (the same bits on every ISA).
template <int W, bool kShiftPerElement, bool kStore = true, typename T>
MF_INLINE T exp_diff(const T* inp, const T* shift, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      double value = std::exp(inp[i] - shift[kShiftPerElement ? i : 0]);
      if constexpr (kStore) out[i] = value;
      total += value;
    }
    return total;
  } else {
    using S = Simd<float, W>;
    constexpr int64_t kParts = kSumParts<float, W>;
    typename S::V sum[kParts] = {};
    // Values [at, at + kSumLanes) of x, less their shift, part by part into the partial sums.
    auto exp_run = [&](const float* x, const float* x_shift, float* x_out) MF_LAMBDA_INLINE {
      for (int64_t part = 0; part < kParts; ++part) {
        int64_t at = part * S::kLanes;
        exp_lanes<W, kShiftPerElement, kStore>(x + at, x_shift + (kShiftPerElement ? at : 0),
                                               kStore ? x_out + at : nullptr, sum[part]);
      }
    };
    int64_t i = 0;
    for (; i + kSumLanes <= n; i += kSumLanes)
      exp_run(inp + i, shift + (kShiftPerElement ? i : 0), kStore ? out + i : nullptr);
    if (i < n) {  // the tail, padded with -inf, whose exp adds 0 to the sum
      float a[kSumLanes], b[kSumLanes], o[kSumLanes];
      std::fill(a, a + kSumLanes, -std::numeric_limits<float>::infinity());
      std::fill(b, b + kSumLanes, 0.0f);
      std::copy(inp + i, inp + n, a);
      std::copy(shift + (kShiftPerElement ? i : 0), shift + (kShiftPerElement ? n : 1), b);
      exp_run(a, b, o);
      if constexpr (kStore) std::copy(o, o + (n - i), out + i);
    }
    return fold_parts<float>(sum);
  }
}

/// What log_softmax subtracts from a contiguous row of n (n >= 1): out[i] = (inp[i] - max) - log_total,
/// in that order (max + log_total would round).
template <typename T>
struct LogSoftmaxShift {
  T max, log_total;
  MF_INLINE T apply(T x) const { return (x - max) - log_total; }
};

template <int W, typename T>
MF_INLINE LogSoftmaxShift<T> log_softmax_shift(const T* inp, int64_t n) {
  T max = row_extreme<true, W>(inp, n);
  return {max, std::log(exp_diff<W, false, false>(inp, &max, static_cast<T*>(nullptr), n))};
}

/// One contiguous row of n: out = softmax(inp) or log_softmax(inp). Log softmax needs only the exps'
/// sum, and writes out once.
template <int W, bool Log, typename T>
MF_INLINE void softmax_row(const T* inp, T* out, int64_t n) {
  if constexpr (Log) {
    const LogSoftmaxShift<T> shift = log_softmax_shift<W>(inp, n);
    for (int64_t i = 0; i < n; ++i) out[i] = shift.apply(inp[i]);
  } else {
    T max = row_extreme<true, W>(inp, n);
    T scale = T{1} / exp_diff<W, false, true>(inp, &max, out, n);
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
  }
}

}  // namespace mf::cpu
