// Vector building blocks for CPU row kernels, on GCC vector types: loads and stores go through
// memcpy (unaligned, no aliasing questions), and code written once as always-inline templates compiles
// for the instruction set of each caller (see with_widest_isa below).
#pragma once

#include "core/isa.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace mf {
namespace cpu {

/// Forces inlining, so that kernels written once compile for the instruction set of each caller.
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

/// x converted to To: a float or int32 value as static_cast does, a vector lane by lane (the float
/// ones rounded toward zero).
template <typename To, typename From>
MF_INLINE To convert(From x) {
  if constexpr (std::is_arithmetic_v<From>)
    return static_cast<To>(x);
  else
    return __builtin_convertvector(x, To);
}

/// 2^k lane by lane for k in [-126, 127] (V a float value or vector, I its int32 one), built in the
/// exponent bits.
template <typename V, typename I>
MF_INLINE V power_of_two(I k) {
  return std::bit_cast<V>((k + 127) << 23);
}

/// The core of Cephes' expf, shared by exp_poly and exp_wide: for finite c = hi + lo, k = round(c / ln 2)
/// and returns e^r for r = hi - k ln 2 + lo (ln 2 in two parts, Cody-Waite; |r| <= ln(2) / 2) by a
/// degree-7 polynomial, so that e^c = e^r 2^k. hi - k ln 2's first part is exact, so an exponent given
/// in two parts keeps the bits of lo that hi + lo would round away.
template <typename V>
MF_INLINE V exp_reduced(V hi, V lo, V& k) {
  k = ((hi + lo) * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded by adding 1.5 * 2^23
  V r = (hi - k * 0.693359375f + lo) + k * 2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

/// e^x lane by lane for a float vector V (I: the int32 vector of the same width; scalars work too),
/// within 2 ulp of std::exp, for softmax's shifted scores (never above 0). Above 88.38 gives inf,
/// below -87.34 gives 0 (exp_wide covers float's whole range), NaN stays NaN.
template <typename V, typename I>
MF_INLINE V exp_poly(V x) {
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365478515625f;
  V c = x < kHi ? x : V{} + kHi;
  // Lanes below kLo, whose result is 0 (a masked score's -1e9), run on c = 0: at kLo itself the
  // product below would be subnormal, and a subnormal result costs a microcode assist of ~100 cycles.
  c = c >= kLo ? c : V{};
  V k;
  V y = exp_reduced(c, -V{}, k) * power_of_two<V>(convert<I>(k));  // c + -0 is c, bit for bit
  y = x > kHi ? V{} + std::numeric_limits<float>::infinity() : y;
  y = x < kLo ? V{} : y;
  return x != x ? x : y;
}

/// e^(hi + lo) lane by lane (V, I as for exp_poly) over float's whole range, for an exponent that one
/// float would hold less precisely: |lo| at most a few units (a rounding error, or a small term whose
/// sum with a large hi would round); exp_reduced then never rounds hi + lo. exp_wide(x) is the case
/// lo = -0.
template <typename V, typename I>
MF_INLINE V exp_wide(V hi, V lo) {
  constexpr float kHi = 88.8f, kLo = -104.0f;  // e^88.8 overflows; e^-104 is below half the least subnormal
  V x = hi + lo;
  auto in_range = (x < kHi) & (x >= kLo);
  // Out of range, the lanes run on 0 (as in exp_poly: no subnormal work for lanes whose result is 0).
  V k;
  V p = exp_reduced(in_range ? hi : V{}, in_range ? lo : -V{}, k);
  I whole = convert<I>(k);
  I second = whole > 0 ? I{} + 64 : I{} - 64;  // leaves whole - second within [-86, 64]
  V y = (p * power_of_two<V>(whole - second)) * power_of_two<V>(second);
  y = x >= kHi ? V{} + std::numeric_limits<float>::infinity() : y;
  y = x < kLo ? V{} : y;
  return x != x ? x : y;
}

/// e^x lane by lane (V, I as for exp_poly) over float's whole range, for the elementwise exp: exp_poly's
/// results where it gives them (within 0.94 ulp of std::exp over every 1021st float), and also the
/// largest finite results (x up to 88.72) and the subnormal ones (x down to -103.97; below, e^x rounds
/// to 0), 2^k applied as two powers of two so that the second multiply rounds once.
template <typename V, typename I>
MF_INLINE V exp_wide(V x) {
  V y = exp_wide<V, I>(x, -V{});  // x + -0 is x, bit for bit
  return x != x ? x : y;
}

/// The bits of a float value or vector as the int32 value or vector I.
template <typename I, typename V>
MF_INLINE I float_bits(V x) {
  return std::bit_cast<I>(x);
}

/// ln x lane by lane (V, I as for exp_poly): Cephes' logf, with x = m 2^e, m in [sqrt(1/2), sqrt(2)),
/// ln(1 + f) for f = m - 1 by a degree-9 polynomial and e ln 2 in two parts; within 0.76 ulp of
/// std::log over every 1021st float. Subnormals are scaled by 2^25 first; 0 gives -inf, negatives NaN,
/// inf inf, NaN NaN.
template <typename V, typename I>
MF_INLINE V log_poly(V x) {
  constexpr float kSmallestNormal = 0x1p-126f;
  V scaled = x < kSmallestNormal ? x * 0x1p25f : x;
  I bits = float_bits<I>(scaled);
  I exponent = (bits >> 23) - (x < kSmallestNormal ? I{} + (126 + 25) : I{} + 126);
  V m = std::bit_cast<V>((bits & 0x007fffff) | 0x3f000000);  // in [1/2, 1)
  auto below_root_half = m < 0.707106781186547524f;
  exponent = below_root_half ? exponent - 1 : exponent;
  V f = (below_root_half ? m + m : m) - 1.0f;
  V z = f * f;
  V p = f * 7.0376836292e-2f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  V e = convert<V>(exponent);
  V y = p * f * z + e * -2.12194440e-4f - z * 0.5f;
  y = (f + y) + e * 0.693359375f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  y = x == kInf ? V{} + kInf : y;
  y = x == 0 ? V{} - kInf : y;
  y = x < 0 ? V{} + std::numeric_limits<float>::quiet_NaN() : y;
  return x != x ? x : y;
}

/// tanh x lane by lane (V, I as for exp_poly), Cephes' tanhf: below |x| = 0.625 an odd polynomial of
/// degree 11, from there 1 - 2 / (e^2|x| + 1) with exp_wide, the sign of x put back; within 1.33 ulp
/// of std::tanh over every float (the largest errors just above 0.625, where e^2|x|'s rounding weighs
/// most). tanh(+-inf) = +-1, -0 stays -0, NaN NaN.
template <typename V, typename I>
MF_INLINE V tanh_poly(V x) {
  const I kSignBit = I{} + static_cast<int32_t>(0x80000000u);
  I sign = float_bits<I>(x) & kSignBit;
  V a = std::bit_cast<V>(float_bits<I>(x) & ~kSignBit);
  V z = x * x;
  V p = z * -5.70498872745e-3f + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  V near_zero = p * z * a + a;
  V far = 1.0f - 2.0f / (exp_wide<V, I>(a + a) + 1.0f);
  V y = std::bit_cast<V>(float_bits<I>(a < 0.625f ? near_zero : far) | sign);
  return x != x ? x : y;
}

// Float rows go through packs of W bytes (a GCC/Clang vector: W = 16 is one SSE/NEON register; wider
// W run under with_widest_isa). Left to itself the compiler keeps these loops scalar: it may not
// reorder a float sum, and under the default -ftrapping-math it does not turn comparisons into
// selects. Float64 rows (the tests' precise path) use packs of one. Loop bodies are lambdas
// []<typename V>(int64_t c) that load what they need at column c as V: a pack, or one value in the
// row's tail.

template <typename T, int W = kBaselineWidth>
using Pack = std::conditional_t<std::is_same_v<T, float>, typename Simd<float, W>::V, T>;
template <typename T, int W = kBaselineWidth>
constexpr int64_t kPackWidth = sizeof(Pack<T, W>) / sizeof(T);

/// The pack (or value) V stored at data.
template <typename V, typename T>
MF_INLINE V load(const T* data) {
  V v;
  std::memcpy(&v, data, sizeof(V));
  return v;
}

/// Floats of the partial sums a float reduction keeps, on every ISA: 16 lanes, folded in lane
/// order. A vector width narrower than 16 floats holds them in two (AVX2) or four (SSE2) packs, which
/// add alike, so each path sums in the same order and training gives the same bits on every CPU.
inline constexpr int64_t kSumLanes = 16;

/// Packs of W bytes that hold kSumLanes values of T (1 for double, whose packs are single values).
template <typename T, int W>
constexpr int64_t kSumParts = std::is_same_v<T, float> ? kSumLanes / kPackWidth<T, W> : 1;

/// The sum of the packs' lanes, one after another in order: part 0's lanes first.
template <typename T, typename P, int64_t Parts>
MF_INLINE T fold_parts(const P (&parts)[Parts]) {
  if constexpr (std::is_same_v<P, T>) {
    static_assert(Parts == 1);
    return parts[0];
  } else {
    T total = parts[0][0];
    for (size_t j = 1; j < sizeof(P) / sizeof(T); ++j) total += parts[0][j];
    for (int64_t part = 1; part < Parts; ++part)
      for (size_t j = 0; j < sizeof(P) / sizeof(T); ++j) total += parts[part][j];
    return total;
  }
}

/// sum_c f<V>(c) for c < C: kSumLanes partial sums in T over blocks of 256 columns, blocks in
/// double; the same bits whatever W.
template <typename T, int W = kBaselineWidth, typename F>
MF_INLINE double pack_sum(int64_t C, F f) {
  constexpr int64_t kWidth = kPackWidth<T, W>, kParts = kSumParts<T, W>, kStep = kWidth * kParts, kBlock = 256;
  int64_t packed = C - C % kStep;
  double result = 0;
  for (int64_t start = 0; start < packed; start += kBlock) {
    Pack<T, W> total[kParts] = {};
    for (int64_t c = start, end = std::min(packed, start + kBlock); c < end; c += kStep)
      for (int64_t part = 0; part < kParts; ++part) total[part] += f.template operator()<Pack<T, W>>(c + part * kWidth);
    result += fold_parts<T>(total);
  }
  for (int64_t c = packed; c < C; ++c) result += f.template operator()<T>(c);
  return result;
}

/// out_c = f<V>(c) for c < C.
template <int W = kBaselineWidth, typename T, typename F>
MF_INLINE void pack_map(T* out, int64_t C, F f) {
  int64_t c = 0;
  for (; c + kPackWidth<T, W> <= C; c += kPackWidth<T, W>) {
    Pack<T, W> v = f.template operator()<Pack<T, W>>(c);
    std::memcpy(out + c, &v, sizeof(v));
  }
  for (; c < C; ++c) out[c] = f.template operator()<T>(c);
}

/// The int32 lanes beside a float pack V (int32_t beside a float).
template <typename V>
using IntLanes = std::conditional_t<std::is_same_v<V, float>, int32_t, typename Simd<float, sizeof(V)>::Mask>;

/// e^x for the pack types: exp_poly for float and float packs (the same bits at every vector width),
/// the C library for double (the precise path tests compare against).
template <typename V>
MF_INLINE V exp_of(V x) {
  if constexpr (std::is_same_v<V, double>) return std::exp(x);
  else return exp_poly<V, IntLanes<V>>(x);
}

/// Marks a lambda always-inline, so that with_widest_isa's ISA-specific callers compile its body.
#define MF_LAMBDA_INLINE __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
template <typename Body>
[[gnu::target("avx512f")]] void run_avx512(Body& body) {
  body.template operator()<64>();
}
template <typename Body>
[[gnu::target("avx2,fma")]] void run_avx2(Body& body) {
  body.template operator()<32>();
}
#endif

/// Runs body.template operator()<W>() with W the vector width in bytes of kernel_isa() (the widest
/// this CPU runs unless MINIFLOW_ISA narrows it), compiled for that instruction set (runtime
/// dispatch: release builds stay portable). body must be declared `[&]<int W>() MF_LAMBDA_INLINE
/// { ... }` and call only MF_INLINE code in its hot loops.
template <typename Body>
void with_widest_isa(Body&& body) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (kernel_isa()) {
    case Isa::avx512: return run_avx512(body);
    case Isa::avx2: return run_avx2(body);
    case Isa::baseline: break;
  }
#endif
  body.template operator()<kBaselineWidth>();
}

}  // namespace cpu
}  // namespace mf
