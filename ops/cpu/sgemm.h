// miniflow's own float GEMM for AVX-512 and AVX2 CPUs. OpenBLAS packs both operands on every call,
// and on the products of a training step (k of 256 to 1024, operands fresh from other kernels) that
// packing and its cache misses cost more than the product; this kernel reads A where it lies and
// packs only B (ops/cpu/sgemm_kernel.inc says how; BENCHMARKS.md has the figures).
#pragma once

#include "core/isa.h"

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace mf::cpu {

/// The values of k over which sgemm sums each element of c as one chain of FMAs before adding the
/// chain to c (the next block's chain is added to what the previous ones left).
inline constexpr int64_t kGemmBlockK = 512;

/// What a GEMM does beyond the product: c = alpha op(a) op(b) + beta c (+ bias[j] in column j, where
/// bias is given), then with `relu` max(c, 0) as math::Relu (NaN kept). The defaults give c = a b.
template <typename T>
struct GemmEpilogue {
  T alpha = 1;
  T beta = 0;
  const T* bias = nullptr;  // one value per column of c
  bool relu = false;
};

/// c = op(a) op(b) through `epilogue`, row-major, op(x) = x or x^T; op(a) is rows x depth, op(b)
/// depth x cols, c rows x cols with rows ldc apart (BLAS's m, n, k). With beta == 0, c is
/// written without being read (NaN there stays out); a and b are read whatever alpha is (unlike
/// BLAS with alpha == 0, which no caller passes). Single-threaded: callers split the work. Each
/// element of c comes out the same whatever rows or columns the caller splits off, and the same on
/// the AVX-512 and AVX2 paths. Returns false, computing nothing, when kernel_isa() is narrower than
/// AVX2; the caller then uses BLAS.
bool sgemm(bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});

/// A weight w [cols x depth] (nn::Linear's layout: one row per output) packed once in sgemm's own
/// layout for one path, for products c = a w^T that would otherwise pack it on every call (a decoder
/// multiplies the same weights at every step). On a path narrower than AVX2 nothing is packed:
/// `usable()` is false and sgemm_packed refuses it.
class PackedSgemmWeight {
 public:
  PackedSgemmWeight(int64_t cols, int64_t depth, const float* w, int64_t ldw, Isa isa = kernel_isa());

  bool usable() const { return isa_ >= Isa::avx2; }
  int64_t cols() const { return cols_; }
  int64_t depth() const { return depth_; }
  /// Columns a thread's share of the product must start on a multiple of.
  int64_t panel_columns() const;
  Isa isa() const { return isa_; }
  const float* data() const { return packed_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  int64_t cols_, depth_;
  Isa isa_;
  std::unique_ptr<float[], Free> packed_;  // 64-byte aligned: the kernels load panels aligned
};

/// c[0:rows, first:last] = a w^T through `epilogue` (its bias indexed by column of c, from 0), a
/// rows x depth (rows lda apart); `first` a multiple of w.panel_columns() (unless first == last: none).
/// The same bits as sgemm(false, true, ...) on the unpacked weight. Single-threaded: callers split the
/// columns (or rows).
void sgemm_packed(int64_t rows, int64_t first, int64_t last, const float* a, int64_t lda, const PackedSgemmWeight& w,
                  float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});

namespace detail {
/// sgemm on a given path (`isa` no wider than the CPU runs), for tests that compare the paths.
bool sgemm_on(Isa isa, bool trans_a, bool trans_b, int64_t rows, int64_t cols, int64_t depth, const float* a,
              int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue = {});
}  // namespace detail

}  // namespace mf::cpu
