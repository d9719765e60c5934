// miniflow's float GEMM, compiled once per instruction set from ops/cpu/sgemm_kernel.inc.
#include "ops/cpu/sgemm.h"

#include "core/error.h"
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

PackedSgemmWeight::PackedSgemmWeight(int64_t cols, int64_t depth, const float* w, int64_t ldw, Isa isa)
    : cols_(cols), depth_(depth), isa_(isa) {
  if (!usable() || cols == 0 || depth == 0) return;
  const bool wide = isa == Isa::avx512;
  const int64_t floats = wide ? avx512::packed_weight_floats(cols, depth) : avx2::packed_weight_floats(cols, depth);
  const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
  packed_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  MF_CHECK(packed_ != nullptr, "out of memory: cannot allocate {} bytes for a packed weight [{}, {}]", bytes, cols,
           depth);
  (wide ? avx512::pack_weight : avx2::pack_weight)(cols, depth, w, ldw, packed_.get());
}

int64_t PackedSgemmWeight::panel_columns() const {
  return isa_ == Isa::avx512 ? avx512::kPanelColumns : avx2::kPanelColumns;
}

void sgemm_packed(int64_t rows, int64_t first, int64_t last, const float* a, int64_t lda, const PackedSgemmWeight& w,
                  float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  MF_CHECK(w.usable() && (first % w.panel_columns() == 0 || first == last) && first <= last && last <= w.cols(),
           "sgemm_packed: columns [{}, {}) of a weight of {} packed for {}", first, last, w.cols(), isa_name(w.isa()));
  if (rows == 0 || first == last) return;
  if (w.depth() == 0) return void(sgemm(false, true, rows, last - first, 0, a, lda, nullptr, 0, c + first, ldc,
                                        {.alpha = epilogue.alpha, .beta = epilogue.beta,
                                         .bias = epilogue.bias ? epilogue.bias + first : nullptr,
                                         .relu = epilogue.relu}));
  (w.isa() == Isa::avx512 ? avx512::sgemm_packed : avx2::sgemm_packed)(rows, first, last, w.cols(), w.depth(), a, lda,
                                                                       w.data(), c, ldc, epilogue);
}

bool sgemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  return detail::sgemm_on(kernel_isa(), trans_a, trans_b, rows, cols, depth, a, lda, b, ldb, c, ldc, epilogue);
}

}  // namespace mf::cpu
