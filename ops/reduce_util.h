// Shared by the reduction ops and the fused row ops (softmax): which dims a reduction covers, what
// shape it leaves, how its input is laid out for the kernels, and the vectorised row kernels
// (sum, max) they run.
#pragma once

#include "core/tensor.h"
#include "ops/loops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
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

/// A reduction's input as a contiguous [outer, n, inner] block, n the reduced extent: output element
/// o * inner + i folds data[o, :, i]. Kernels run it as work items: single rows when inner is 1,
/// else slabs of up to kBlock columns of one [n, inner] block, each on one thread.
struct ReduceLayout {
  static constexpr int64_t kBlock = 256;
  Tensor data;
  int64_t outer = 1, n = 1, inner = 1;

  struct Slab {
    int64_t offset;  // of its first element in data
    int64_t out;     // its first output element
    int64_t width;   // columns, 1 for a row
  };
  int64_t blocks() const { return (inner + kBlock - 1) / kBlock; }
  int64_t items() const { return outer * blocks(); }
  /// Items per parallel_for chunk, so that a chunk covers about cpu::kParallelGrain elements.
  int64_t grain() const;
  Slab slab(int64_t item) const {
    int64_t block = item % blocks(), o = item / blocks(), c0 = block * kBlock;
    return {o * n * inner + c0, o * inner + c0, std::min(kBlock, inner - c0)};
  }
};

/// A view of x when it is contiguous and the reduced dims are adjacent (size-1 dims aside), else a
/// contiguous copy with the reduced dims moved last (inner = 1).
ReduceLayout reduce_layout(const Tensor& x, const ReducePlan& plan);

namespace cpu {

/// Forces inlining, so that kernels written once compile for the instruction set of each caller
/// (see softmax.cpp's per-ISA variants).
#define MF_INLINE [[gnu::always_inline]] inline

/// GCC vectors of W bytes of T (an alias template would drop the attribute). Kernels
/// use them only as locals, loaded and stored with memcpy (unaligned, no aliasing questions).
template <typename T, int W>
struct Simd {
  typedef T V __attribute__((vector_size(W)));
  using Int = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef Int Mask __attribute__((vector_size(W)));  // what comparisons of V give
  static constexpr int64_t kLanes = W / static_cast<int>(sizeof(T));
};

/// Bytes per vector on every x86-64 CPU (SSE2); wider variants are compiled per ISA where they pay.
inline constexpr int kBaselineWidth = 16;

/// sum_i f(p[i]) over a contiguous run; f takes scalars and, for float types, vectors. Floats add
/// in 4 vectors of partial sums: that lets them vectorise (the compiler may not reorder float adds
/// itself) and keeps rounding error growing with n / (4 * lanes) rather than n.
template <int W = kBaselineWidth, typename T, typename F>
MF_INLINE T row_sum(const T* p, int64_t n, F f) {
  T total{0};
  int64_t i = 0;
  if constexpr (std::is_floating_point_v<T>) {
    using S = Simd<T, W>;
    typename S::V acc[4] = {};
    for (; i + 4 * S::kLanes <= n; i += 4 * S::kLanes)
      for (int u = 0; u < 4; ++u) {
        typename S::V v;
        std::memcpy(&v, p + i + u * S::kLanes, sizeof(v));
        acc[u] += f(v);
      }
    typename S::V all = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (int64_t k = 0; k < S::kLanes; ++k) total += all[k];
  }
  for (; i < n; ++i) total += f(p[i]);
  return total;
}

template <int W = kBaselineWidth, typename T>
MF_INLINE T row_sum(const T* p, int64_t n) {
  return row_sum<W>(p, n, [](auto v) { return v; });
}

/// The row's largest (Greater) or smallest (Less) element, NaN if any element is NaN (as PyTorch's
/// amax). n >= 1.
template <bool Greater, int W = kBaselineWidth, typename T>
MF_INLINE T row_extreme(const T* p, int64_t n) {
  auto pick = [](T a, T b) { return (Greater ? a > b : a < b) ? a : b; };
  T best = p[0];
  bool nan = best != best;
  int64_t i = 0;
  if constexpr (std::is_floating_point_v<T>) {
    // Plain compare-and-select, NaNs tracked apart: the forms that compile to max / min instructions
    // on every ISA.
    using S = Simd<T, W>;
    typename S::V lanes = typename S::V{} + best;
    typename S::Mask nans{};
    for (; i + S::kLanes <= n; i += S::kLanes) {
      typename S::V v;
      std::memcpy(&v, p + i, sizeof(v));
      lanes = (Greater ? v > lanes : v < lanes) ? v : lanes;
      nans |= v != v;
    }
    for (int64_t k = 0; k < S::kLanes; ++k) {
      best = pick(lanes[k], best);
      nan |= nans[k] != 0;
    }
  }
  for (; i < n; ++i) {
    best = pick(p[i], best);
    nan |= p[i] != p[i];
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : best;
}

}  // namespace cpu
}  // namespace mf
