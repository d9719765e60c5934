// miniflow's float GEMM, compiled once per instruction set from ops/cpu/sgemm_kernel.inc.
#include "ops/cpu/sgemm.h"

#include "ops/math.h"
#include "ops/cpu/float_vectors.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace mf::cpu {
namespace {

#define MF_PER_ISA_KERNEL "ops/cpu/sgemm_kernel.inc"
#include "ops/cpu/per_isa.inc"

}  // namespace

bool detail::sgemm_on(Isa isa, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                      const GemmEpilogue<float>& epilogue) {
  if (isa < Isa::avx2) return false;
  if (rows == 0 || cols == 0) return true;
  if (depth == 0) {  // no products: c = beta c (+ bias), with beta == 0 writing over whatever c held
    const auto [alpha, beta, bias, relu] = epilogue;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float value = (beta == 0 ? 0.0f : beta * c[i * ldc + j]) + (bias ? bias[j] : 0.0f);
        c[i * ldc + j] = relu ? math::Relu{}(value) : value;
      }
    return true;
  }
  (isa == Isa::avx512 ? avx512::sgemm_blocked : avx2::sgemm_blocked)(trans_a, trans_b, rows, cols, depth, a, lda, b,
                                                                     ldb, c, ldc, epilogue);
  return true;
}

bool sgemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  return detail::sgemm_on(kernel_isa(), trans_a, trans_b, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
}

}  // namespace mf::cpu
