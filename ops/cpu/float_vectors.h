// Float vectors of one instruction set behind one interface, for kernels written once and compiled
// for each ISA (the GEMMs): the generic code sits in a file included once per ISA, between
// MF_BEGIN_TARGET and MF_END_TARGET, in a namespace that names its `Vector`, as ops/cpu/per_isa.inc
// does:
//
//   #define MF_PER_ISA_KERNEL "ops/cpu/sgemm_kernel.inc"
//   #include "ops/cpu/per_isa.inc"   // namespaces avx512 and avx2, each with its sgemm_blocked
//
// (An intrinsic can only be inlined into a function compiled for its ISA, so the generic code
// cannot be a template called from a target function, as the GCC-vector kernels of simd.h are.)
// Both vectors give the same bits for the same operation on each lane: fmadd rounds once, and every
// masked load reads zeros into the lanes it leaves out.
#pragma once

#include "ops/cpu/simd.h"

#include <immintrin.h>

#include <cstdint>

#define MF_PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define MF_BEGIN_TARGET(isa) MF_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define MF_END_TARGET MF_PRAGMA(clang attribute pop)
#else
#define MF_BEGIN_TARGET(isa) MF_PRAGMA(GCC push_options) MF_PRAGMA(GCC target(isa))
#define MF_END_TARGET MF_PRAGMA(GCC pop_options)
#endif

namespace mf::cpu {

// The full-mask forms of AVX-512's shuffles: GCC 12's plain intrinsics pass _mm512_undefined_ps
// through, which -Wmaybe-uninitialized flags once inlined (GCC bug 105593).
#define MF_AVX512 [[gnu::target("avx512f")]] MF_INLINE static

/// 16 floats (AVX-512F); a Mask has one bit per lane.
struct Avx512Floats {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kLanes = 16;

  MF_AVX512 V zero() { return _mm512_setzero_ps(); }
  MF_AVX512 V broadcast(float value) { return _mm512_set1_ps(value); }
  MF_AVX512 V load_aligned(const float* p) { return _mm512_load_ps(p); }
  MF_AVX512 void store_aligned(float* p, V v) { _mm512_store_ps(p, v); }
  MF_AVX512 V load(const float* p) { return _mm512_loadu_ps(p); }
  MF_AVX512 void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  /// The lanes below `count` (none for count <= 0, all for count >= kLanes).
  MF_AVX512 Mask first_lanes(int64_t count) {
    return static_cast<Mask>(count >= kLanes ? 0xFFFF : count > 0 ? (1u << count) - 1 : 0);
  }
  /// The lanes in `mask` read from p (nothing else is touched), the others zero.
  MF_AVX512 V load(Mask mask, const float* p) { return _mm512_maskz_loadu_ps(mask, p); }
  MF_AVX512 void store(float* p, Mask mask, V v) { _mm512_mask_storeu_ps(p, mask, v); }
  MF_AVX512 V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  MF_AVX512 V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  MF_AVX512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  /// Zero where v < 0, as math::Relu: NaN and -0 stay.
  MF_AVX512 V relu(V v) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLT_UQ), v); }

  /// 128-bit lanes 0 and 2 of a, then of b.
  MF_AVX512 V even(V a, V b) { return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, 0x88); }
  /// 128-bit lanes 1 and 3 of a, then of b.
  MF_AVX512 V odd(V a, V b) { return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, 0xDD); }

  /// Transposes 16 rows of 16 floats in registers: rows[i] lane j becomes rows[j] lane i.
  MF_AVX512 void transpose(V rows[kLanes]) {
    V pairs[kLanes];
    for (int i = 0; i < 8; ++i) {  // rows 2i and 2i+1 interleaved
      pairs[2 * i] = _mm512_mask_unpacklo_ps(rows[2 * i], 0xFFFF, rows[2 * i], rows[2 * i + 1]);
      pairs[2 * i + 1] = _mm512_mask_unpackhi_ps(rows[2 * i], 0xFFFF, rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i)  // rows[4i + c]: column c of each 128-bit lane, over rows 4i..4i+3
      for (int half = 0; half < 2; ++half) {
        __m512d x = _mm512_castps_pd(pairs[4 * i + half]), y = _mm512_castps_pd(pairs[4 * i + 2 + half]);
        rows[4 * i + 2 * half] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, 0xFF, x, y));
        rows[4 * i + 2 * half + 1] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, 0xFF, x, y));
      }
    for (int i = 0; i < 2; ++i)  // gather the 128-bit lanes: two row groups at a time, then all four
      for (int c = 0; c < 4; ++c) {
        pairs[8 * i + c] = even(rows[8 * i + c], rows[8 * i + 4 + c]);
        pairs[8 * i + 4 + c] = odd(rows[8 * i + c], rows[8 * i + 4 + c]);
      }
    for (int c = 0; c < 8; ++c) {
      rows[c] = even(pairs[c], pairs[8 + c]);
      rows[8 + c] = odd(pairs[c], pairs[8 + c]);
    }
  }
};
#undef MF_AVX512

#define MF_AVX2 [[gnu::target("avx2,fma")]] MF_INLINE static

/// 8 floats (AVX2 + FMA); a Mask has all 32 bits of a lane set where the lane counts.
struct Avx2Floats {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int64_t kLanes = 8;

  MF_AVX2 V zero() { return _mm256_setzero_ps(); }
  MF_AVX2 V broadcast(float value) { return _mm256_set1_ps(value); }
  MF_AVX2 V load_aligned(const float* p) { return _mm256_load_ps(p); }
  MF_AVX2 void store_aligned(float* p, V v) { _mm256_store_ps(p, v); }
  MF_AVX2 V load(const float* p) { return _mm256_loadu_ps(p); }
  MF_AVX2 void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  MF_AVX2 Mask first_lanes(int64_t count) {
    int32_t clamped = static_cast<int32_t>(count < 0 ? 0 : count > kLanes ? kLanes : count);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  MF_AVX2 V load(Mask mask, const float* p) { return _mm256_maskload_ps(p, mask); }
  MF_AVX2 void store(float* p, Mask mask, V v) { _mm256_maskstore_ps(p, mask, v); }
  MF_AVX2 V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  MF_AVX2 V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  MF_AVX2 V add(V a, V b) { return _mm256_add_ps(a, b); }
  MF_AVX2 V relu(V v) { return _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLT_UQ)); }

  MF_AVX2 void transpose(V rows[kLanes]) {
    V pairs[kLanes], quads[kLanes];
    for (int i = 0; i < 4; ++i) {  // rows 2i and 2i+1 interleaved, per 128-bit lane
      pairs[2 * i] = _mm256_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
      pairs[2 * i + 1] = _mm256_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)  // quads[4i + c]: column c of each 128-bit lane, over rows 4i..4i+3
      for (int half = 0; half < 2; ++half) {
        quads[4 * i + 2 * half] = _mm256_shuffle_ps(pairs[4 * i + half], pairs[4 * i + 2 + half], 0x44);
        quads[4 * i + 2 * half + 1] = _mm256_shuffle_ps(pairs[4 * i + half], pairs[4 * i + 2 + half], 0xEE);
      }
    for (int c = 0; c < 4; ++c) {  // the low 128-bit lanes give columns 0-3, the high ones 4-7
      rows[c] = _mm256_permute2f128_ps(quads[c], quads[4 + c], 0x20);
      rows[4 + c] = _mm256_permute2f128_ps(quads[c], quads[4 + c], 0x31);
    }
  }
};
#undef MF_AVX2

}  // namespace mf::cpu
