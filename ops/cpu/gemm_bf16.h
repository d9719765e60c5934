// The bfloat16 GEMM: float32 operands rounded to bfloat16 as they are packed, their products summed
// in float32, as autocast's products are. Where vdpbf16ps outpaces the float32 FMA (AMD Zen 4 and
// Zen 5: it multiplies two pairs per float32 lane at twice the FMA's rate; core/isa.h) the GEMM runs
// on it; elsewhere (no AVX512-BF16, or Intel's, at half the FMA's rate) the rounded operands go
// through the float32 GEMM. Both sum the same exact products (a bfloat16 times a bfloat16 fits a
// float32), in orders that differ, so the results agree to float32 rounding of the sums, not bit for
// bit.
#pragma once

#include "core/isa.h"
#include "ops/cpu/sgemm.h"

#include <cstdint>

namespace mf::cpu {

/// c = bf16(op(a)) bf16(op(b)) through `epilogue` (sgemm.h: alpha, beta, bias, relu), row-major,
/// op(x) = x or x^T, op(a) rows x depth, op(b) depth x cols, c rows x cols with rows ldc apart;
/// bf16(x) rounds each element to bfloat16 (to nearest, ties to even; the AVX512-BF16 path, as its
/// conversion instruction does, reads subnormal inputs as zero). Single-threaded: callers split the
/// work.
void gemm_bf16(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
               const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});

/// Whether gemm_bf16 runs on vdpbf16ps here: kernel_isa() is avx512 and the CPU runs vdpbf16ps faster
/// than the float32 FMA (why_no_bfloat16_dot_products() is empty).
bool gemm_bf16_uses_dot_products();

namespace detail {
/// Whether the AVX512-BF16 kernel can run here, chosen or not: kernel_isa() is avx512 and the CPU has
/// AVX512-BF16.
bool gemm_bf16_can_use_dot_products();

/// gemm_bf16 on a chosen path, for tests and benchmarks that compare them: `dot_products` runs the
/// AVX512-BF16 kernel (only where gemm_bf16_can_use_dot_products()), otherwise the rounded operands
/// go through the float32 GEMM of kernel_isa().
void gemm_bf16_on(bool dot_products, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                  const GemmEpilogue<float>& epilogue = {});
}  // namespace detail

}  // namespace mf::cpu
