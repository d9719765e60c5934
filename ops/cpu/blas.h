// The one typed entry to GEMM, shared by matmul, linear and the fused attention kernels: float
// products run miniflow's own kernel where the CPU has AVX-512 (ops/sgemm.h), the rest OpenBLAS.
#pragma once

#include "ops/math.h"
#include "ops/cpu/sgemm.h"

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace mf::cpu {

/// c = alpha a b + beta c (+ bias[j] in column j, where bias is given), then with `relu`
/// max(c, 0) as math::Relu, row-major, for float or double.
template <typename T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t n, int64_t m, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, T beta = 0, T alpha = 1, const T* bias = nullptr,
          bool relu = false) {
  if constexpr (std::is_same_v<T, float>)
    if (sgemm(ta != CblasNoTrans, tb != CblasNoTrans, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc, bias, relu))
      return;
  if (bias) {  // BLAS has no bias: c starts as beta c + bias and the product adds to it
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) c[i * ldc + j] = (beta == 0 ? T{0} : beta * c[i * ldc + j]) + bias[j];
    beta = 1;
  }
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (relu)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) c[i * ldc + j] = math::Relu{}(c[i * ldc + j]);
}

}  // namespace mf::cpu
