// C = A W^T for few rows of A, compiled once per instruction set from ops/cpu/skinny_gemm_kernel.inc.
#include "ops/cpu/skinny_gemm.h"

#include "core/parallel.h"
#include "ops/math.h"
#include "ops/cpu/float_vectors.h"
#include "ops/cpu/sgemm.h"

#include <algorithm>
#include <vector>

namespace mf::cpu {
namespace {

#define MF_PER_ISA_KERNEL "ops/cpu/skinny_gemm_kernel.inc"
#include "ops/cpu/per_isa.inc"

/// The fewest rows worth the kernel: one vector of floats, a full slice of A^T.
int64_t skinny_min_rows(Isa isa) { return isa == Isa::avx512 ? Avx512Floats::kLanes : Avx2Floats::kLanes; }

}  // namespace

bool skinny_gemm_nt(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                    float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  Isa isa = kernel_isa();
  if (isa < Isa::avx2 || n < skinny_min_rows(isa) || n > kSkinnyMaxRows || m == 0 || k == 0) return false;
  if (epilogue.alpha != 1 || epilogue.beta != 0) return false;
  (isa == Isa::avx512 ? avx512::skinny_gemm_nt : avx2::skinny_gemm_nt)(n, m, k, a, lda, w, ldw, c, ldc, epilogue);
  return true;
}

}  // namespace mf::cpu
