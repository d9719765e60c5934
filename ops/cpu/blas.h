// The one typed entry to GEMM, shared by matmul, linear and the fused attention kernels: float
// products run miniflow's own kernel where the CPU has AVX-512 or AVX2 (ops/cpu/sgemm.h), or its
// bfloat16 one under set_float32_matmul_precision("medium") and in ops that autocast lowers
// (ops/cpu/gemm_bf16.h), the rest OpenBLAS.
#pragma once

#include "core/parallel.h"
#include "ops/math.h"
#include "ops/cpu/gemm_bf16.h"
#include "ops/cpu/sgemm.h"

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace mf::cpu {

/// Whether float32 products take the bfloat16 GEMM: set_float32_matmul_precision("medium") on a CPU
/// where it runs on AVX512-BF16 (ops/precision.cpp).
bool products_in_bfloat16();

/// gemm below, always in the operands' own precision.
template <typename T>
void gemm_full_precision(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t rows, int64_t cols, int64_t depth,
                         const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
                         const GemmEpilogue<T>& epilogue = {}) {
  if constexpr (std::is_same_v<T, float>)
    if (sgemm(ta != CblasNoTrans, tb != CblasNoTrans, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue)) return;
  T beta = epilogue.beta;
  if (epilogue.bias) {  // BLAS has no bias: c starts as beta c + bias and the product adds to it
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        c[i * ldc + j] = (beta == 0 ? T{0} : beta * c[i * ldc + j]) + epilogue.bias[j];
    beta = 1;
  }
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, rows, cols, depth, epilogue.alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, rows, cols, depth, epilogue.alpha, a, lda, b, ldb, beta, c, ldc);
  if (epilogue.relu)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = math::Relu{}(c[i * ldc + j]);
}

/// Whether gemm<T> gives each element of c the same bits whichever block of c a call computes it in:
/// miniflow's own kernels (float32, and autocast's bfloat16 products, where the CPU has AVX2 or
/// AVX-512) sum each element in one order; OpenBLAS need not.
template <typename T>
bool gemm_bits_independent_of_blocks() {
  return std::is_same_v<T, float> && kernel_isa() >= Isa::avx2;
}

/// c = op(a) op(b) through `epilogue` (sgemm.h: alpha, beta, bias, relu), row-major, op(a) rows x
/// depth, op(b) depth x cols, for float or double.
template <typename T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t rows, int64_t cols, int64_t depth, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, const GemmEpilogue<T>& epilogue = {}) {
  if constexpr (std::is_same_v<T, float>)
    if (products_in_bfloat16() || kernel_settings().bfloat16_products)
      return gemm_bf16(ta != CblasNoTrans, tb != CblasNoTrans, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
  gemm_full_precision(ta, tb, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
}

}  // namespace mf::cpu
