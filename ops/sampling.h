// The arithmetic of the sampling ops (multinomial, randperm), shared by the CPU kernels and the CUDA
// kernels so that a seeded draw gives the same indices on either device. Element i of a draw keyed
// by a PhiloxStream takes 64 bits from Philox block (seed, counter + i / 2), words 2 (i % 2) and
// 2 (i % 2) + 1, as the other random ops do (ops/fill.cpp).
#pragma once

#include "core/generator.h"
#include "ops/math.h"

#include <array>
#include <cstdint>

namespace mf::sampling {

/// The 64 random bits of element i of the draw keyed (seed, counter).
MF_HOST_DEVICE inline uint64_t element_bits(uint64_t seed, uint64_t counter, uint64_t i) {
  std::array<uint32_t, 4> words = Philox::block(seed, 0, counter + i / 2);
  size_t k = 2 * (i % 2);
  return (uint64_t{words[k]} << 32) | words[k + 1];
}

/// Uniform in [0, 1) from the top 53 bits (core/generator.h's uniform_double of the two words).
MF_HOST_DEVICE inline double unit_interval(uint64_t bits) {
  return uniform_double(static_cast<uint32_t>(bits >> 32), static_cast<uint32_t>(bits));
}

/// floor(bits * n / 2^64), an integer in [0, n): the high half of the 128-bit product, from 32-bit
/// halves (Lemire's multiply-shift without its rejection step; the bias is below n / 2^64).
MF_HOST_DEVICE inline uint64_t scaled_below(uint64_t bits, uint64_t n) {
  uint64_t a_hi = bits >> 32, a_lo = bits & 0xffffffffu, b_hi = n >> 32, b_lo = n & 0xffffffffu;
  uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + (lo_hi & 0xffffffffu);
  return hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (middle >> 32);
}

/// The category that target u in [0, 1) picks from weights w[0], w[stride], ... (n of them), leaving
/// out those `taken` says: the first whose running sum exceeds u times the total, both summed in
/// double in index order. A zero weight is never picked; -1 when no weight is positive.
template <typename T, typename Taken>
MF_HOST_DEVICE int64_t pick_category(const T* w, int64_t n, int64_t stride, double u, Taken taken) {
  double total = 0;
  for (int64_t j = 0; j < n; ++j)
    if (!taken(j)) total += static_cast<double>(w[j * stride]);
  double target = u * total, running = 0;
  int64_t last = -1;
  for (int64_t j = 0; j < n; ++j) {
    double weight = static_cast<double>(w[j * stride]);
    if (taken(j) || !(weight > 0)) continue;
    running += weight;
    last = j;
    if (running > target) return j;
  }
  return last;  // rounding left the target at the final sum
}

}  // namespace mf::sampling
