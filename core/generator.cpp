#include "core/generator.h"

#include "core/isa.h"

#include <immintrin.h>

// The vector helpers below take and return vectors by value; they are always inlined into callers
// compiled for their ISA, so the ABI change GCC warns about never happens.
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(), which its flow analysis
// then reports as maybe uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace mf {
namespace {

constexpr uint32_t kMultiplier0 = Philox::kMultiplier0, kMultiplier1 = Philox::kMultiplier1;
constexpr uint32_t kWeyl0 = Philox::kWeyl0, kWeyl1 = Philox::kWeyl1;

void philox_fill_scalar(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out) {
  for (int64_t i = 0; i < blocks; ++i) {
    auto words = Philox::block(key, 0, counter + static_cast<uint64_t>(i));
    for (int j = 0; j < 4; ++j) out[4 * i + j] = words[j];
  }
}

// The vector variants run Philox::block's rounds on one block per 32-bit lane, words in separate
// registers (c0..c3), then transpose so that each block's four words land next to each other.
// mul_epu32 multiplies the even lanes only, so the odd lanes go through a 32-bit shift. The two
// variants spell the same rounds with their own intrinsics: GCC refuses to inline ISA-specific
// helpers into one shared template (target specific option mismatch), so they cannot share it.

[[gnu::target("avx512f"), gnu::always_inline]] inline void mulhilo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  __m512i even = _mm512_mul_epu32(a, m), high = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  // A masked swap of each 64-bit product's halves both moves and merges (one op where AVX2 needs a
  // shift and a blend).
  lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, high, _MM_PERM_CDAB);
  hi = _mm512_mask_shuffle_epi32(high, 0x5555, even, _MM_PERM_CDAB);
}

/// Blocks counter .. counter + 16 * Groups - 1 into out, the rounds of the groups interleaved: each
/// round's multiplies have a latency that one group alone cannot hide (BENCHMARKS.md has the timings).
template <int Groups>
[[gnu::target("avx512f"), gnu::always_inline]] inline void philox_groups_avx512(uint64_t key, uint64_t counter,
                                                                                 uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kMultiplier0)), m1 = _mm512_set1_epi32(static_cast<int>(kMultiplier1));
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i pick_low = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i pick_high = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  __m512i c0[Groups], c1[Groups], c2[Groups], c3[Groups];
  for (int g = 0; g < Groups; ++g) {
    // 64-bit counters of the group's blocks 0..7 and 8..15, split into low (c0) and high (c1) words.
    __m512i base = _mm512_set1_epi64(static_cast<int64_t>(counter + static_cast<uint64_t>(16 * g)));
    __m512i first = _mm512_add_epi64(base, lane), second = _mm512_add_epi64(first, _mm512_set1_epi64(8));
    c0[g] = _mm512_permutex2var_epi32(first, pick_low, second);
    c1[g] = _mm512_permutex2var_epi32(first, pick_high, second);
    c2[g] = c3[g] = _mm512_setzero_si512();
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < Groups; ++g) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo(c0[g], m0, hi0, lo0);
      mulhilo(c2[g], m1, hi1, lo1);
      c0[g] = _mm512_ternarylogic_epi32(hi1, c1[g], key0, 0x96);  // 0x96: a ^ b ^ c
      c2[g] = _mm512_ternarylogic_epi32(hi0, c3[g], key1, 0x96);
      c1[g] = lo1;
      c3[g] = lo0;
    }
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  for (int g = 0; g < Groups; ++g) {
    // 4 x 16 transpose: u_j holds block 4k + j in 128-bit lane k; then gather lane k of each u_j.
    __m512i t0 = _mm512_unpacklo_epi32(c0[g], c1[g]), t1 = _mm512_unpackhi_epi32(c0[g], c1[g]);
    __m512i t2 = _mm512_unpacklo_epi32(c2[g], c3[g]), t3 = _mm512_unpackhi_epi32(c2[g], c3[g]);
    __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    uint32_t* dst = out + 64 * g;
    _mm512_storeu_si512(dst, _mm512_shuffle_i32x4(v0, v1, 0x88));
    _mm512_storeu_si512(dst + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
    _mm512_storeu_si512(dst + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
    _mm512_storeu_si512(dst + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
  }
}

[[gnu::target("avx512f")]] void philox_fill_avx512(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out) {
  constexpr int kGroups = 4;  // 64 blocks: apply_dropout's batch
  int64_t i = 0;
  for (; i + 16 * kGroups <= blocks; i += 16 * kGroups)
    philox_groups_avx512<kGroups>(key, counter + static_cast<uint64_t>(i), out + 4 * i);
  for (; i + 16 <= blocks; i += 16) philox_groups_avx512<1>(key, counter + static_cast<uint64_t>(i), out + 4 * i);
  philox_fill_scalar(key, counter + static_cast<uint64_t>(i), blocks - i, out + 4 * i);
}

[[gnu::target("avx2"), gnu::always_inline]] inline void mulhilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  __m256i even = _mm256_mul_epu32(a, m), high = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(high, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), high, 0xAA);
}

/// Blocks counter .. counter + 8 * Groups - 1 into out, the rounds of the groups interleaved, as
/// philox_groups_avx512's.
template <int Groups>
[[gnu::target("avx2"), gnu::always_inline]] inline void philox_groups_avx2(uint64_t key, uint64_t counter,
                                                                             uint32_t* out) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kMultiplier0)), m1 = _mm256_set1_epi32(static_cast<int>(kMultiplier1));
  __m256i c0[Groups], c1[Groups], c2[Groups], c3[Groups];
  for (int g = 0; g < Groups; ++g) {
    alignas(32) uint32_t low[8], high[8];
    for (int l = 0; l < 8; ++l) {
      uint64_t c = counter + static_cast<uint64_t>(8 * g + l);
      low[l] = static_cast<uint32_t>(c);
      high[l] = static_cast<uint32_t>(c >> 32);
    }
    c0[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
    c1[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
    c2[g] = c3[g] = _mm256_setzero_si256();
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < Groups; ++g) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo(c0[g], m0, hi0, lo0);
      mulhilo(c2[g], m1, hi1, lo1);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[g]), key0);
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[g]), key1);
      c1[g] = lo1;
      c3[g] = lo0;
    }
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  for (int g = 0; g < Groups; ++g) {
    // 4 x 8 transpose: u_j holds block 4k + j in 128-bit lane k.
    __m256i t0 = _mm256_unpacklo_epi32(c0[g], c1[g]), t1 = _mm256_unpackhi_epi32(c0[g], c1[g]);
    __m256i t2 = _mm256_unpacklo_epi32(c2[g], c3[g]), t3 = _mm256_unpackhi_epi32(c2[g], c3[g]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    auto* dst = reinterpret_cast<__m256i*>(out + 32 * g);
    _mm256_storeu_si256(dst, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
}

[[gnu::target("avx2")]] void philox_fill_avx2(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out) {
  constexpr int kGroups = 4;  // 32 blocks: apply_dropout's batch in two
  int64_t i = 0;
  for (; i + 8 * kGroups <= blocks; i += 8 * kGroups)
    philox_groups_avx2<kGroups>(key, counter + static_cast<uint64_t>(i), out + 4 * i);
  for (; i + 8 <= blocks; i += 8) philox_groups_avx2<1>(key, counter + static_cast<uint64_t>(i), out + 4 * i);
  philox_fill_scalar(key, counter + static_cast<uint64_t>(i), blocks - i, out + 4 * i);
}

}  // namespace

std::vector<detail::PhiloxFillVariant> detail::philox_fill_variants() {
  std::vector<PhiloxFillVariant> variants;
  if (kernel_isa() >= Isa::avx512) variants.push_back({"avx512", philox_fill_avx512});
  if (kernel_isa() >= Isa::avx2) variants.push_back({"avx2", philox_fill_avx2});
  variants.push_back({"scalar", philox_fill_scalar});
  return variants;
}

void philox_fill(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out) {
  static const auto fill = detail::philox_fill_variants().front().fill;
  fill(key, counter, blocks, out);
}

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace mf
