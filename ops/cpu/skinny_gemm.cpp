// C = A W^T for few rows of A, compiled once per instruction set from ops/cpu/skinny_gemm_kernel.inc.
#include "ops/cpu/skinny_gemm.h"

#include "core/parallel.h"
#include "ops/cpu/float_vectors.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mf::cpu {
namespace {

namespace avx512 {
MF_BEGIN_TARGET("avx512f")
using Vector = Avx512Floats;
#include "ops/cpu/skinny_gemm_kernel.inc"
MF_END_TARGET
}  // namespace avx512

namespace avx2 {
MF_BEGIN_TARGET("avx2,fma")
using Vector = Avx2Floats;
#include "ops/cpu/skinny_gemm_kernel.inc"
MF_END_TARGET
}  // namespace avx2

}  // namespace

bool skinny_gemm_nt(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                    float* c, int64_t ldc) {
  Isa isa = kernel_isa();
  if (isa < Isa::avx2 || n > kSkinnyMaxRows || n == 0 || m == 0) return false;
  (isa == Isa::avx512 ? avx512::skinny_gemm_nt : avx2::skinny_gemm_nt)(n, m, k, a, lda, w, ldw, c, ldc);
  return true;
}

}  // namespace mf::cpu
