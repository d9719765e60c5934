// The CPU dropout mask, shared by the dropout op and the fused attention: one Philox stream gives the
// same mask whichever kernel applies it and however the work is split.
#pragma once

#include "core/generator.h"
#include "ops/cpu/simd.h"
#include "ops/registry.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mf::detail {

/// Dropout with its probability p and Philox stream (seed, counter) on elements [first, first + n)
/// of a contiguous tensor: out[j] = in[j] * (0 or 1 / (1 - p)), element i kept when word i % 4 of
/// Philox block (seed, counter + i / 4), as a uniform on [0, 1), is >= p. The mask depends on the
/// stream and the element index alone, never on how the work is split. out may be in; a second
/// pair (in2, out2), where given, gets the same mask from the same draws. Inlined into its callers'
/// with_widest_isa bodies: W is their vector width in bytes.
template <int W, typename T>
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
    // A multiply by the scale or 0: out = in * keep(j) whatever in holds (inf and NaN stay NaN where
    // dropped, as PyTorch's mask-multiply gives).
    auto keep = [=](int64_t j) MF_LAMBDA_INLINE { return scale * static_cast<T>((w[j] >> 8) >= threshold); };
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>) {
      // The compiler keeps the scalar form as a branch (a mispredicted one, at random): here the scale
      // or +0 is picked by masking the scale's bits, the bits the scalar form's product gives.
      using S = cpu::Simd<float, W>;
      using Words = typename cpu::Simd<uint32_t, W>::V;
      const typename S::Mask scale_bits = typename S::Mask{} + std::bit_cast<int32_t>(scale);
      for (; j + S::kLanes <= count; j += S::kLanes) {
        // Shifted right by 8, a word fits in 24 bits: a signed compare is exact.
        const Words shifted = cpu::load<Words>(w + j) >> 8;
        const typename S::Mask kept = std::bit_cast<typename S::Mask>(shifted) >= static_cast<int32_t>(threshold);
        const auto factor = std::bit_cast<typename S::V>(kept & scale_bits);
        auto product = cpu::load<typename S::V>(in + done + j) * factor;
        std::memcpy(out + done + j, &product, sizeof(product));
        if (in2 != nullptr) {
          product = cpu::load<typename S::V>(in2 + done + j) * factor;
          std::memcpy(out2 + done + j, &product, sizeof(product));
        }
      }
    }
    for (int64_t tail = j; tail < count; ++tail) out[done + tail] = in[done + tail] * keep(tail);
    if (in2 != nullptr)
      for (int64_t tail = j; tail < count; ++tail) out2[done + tail] = in2[done + tail] * keep(tail);
    done += count;
  }
}

}  // namespace mf::detail
