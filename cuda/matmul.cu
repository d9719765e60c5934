// matmul and linear on cuBLAS: a [..., N, K] @ b [..., K, M] -> out [..., N, M], batch dims broadcast, as one
// strided-batched GEMM. cuBLAS is column-major, so the row-major product is computed as
// out^T = b^T a^T (operands swapped); a transposed view is passed as a transpose flag, a broadcast
// batch as batch stride 0, and only layouts neither covers are copied first. Float32 products take
// the compute type the precision settings ask for (float32_compute below); bfloat16 operands, which
// reach these kernels in calls autocast lowers, are read as they are and summed in float32.
#include "core/parallel.h"
#include "cuda/kernels.h"
#include "cuda/runtime.h"
#include "ops/kernel_api.h"

#include <climits>
#include <optional>
#include <span>

namespace mf::cuda {
namespace {

/// One operand as cuBLAS reads it: a flag, a leading dimension and a stride between batch matrices.
struct Operand {
  Tensor t;  // keeps a copy alive when one was needed
  cublasOperation_t op;
  int64_t ld, batch_stride;
};

/// The stride that steps through t's batch dims as one flat dim (0 when they are all broadcast),
/// or nothing when no single stride does.
std::optional<int64_t> flat_batch_stride(const Tensor& t) {
  std::optional<int64_t> stride;
  int64_t expected = 0;  // the stride the next dim out must have
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (!stride) stride = t.stride(d);
    else if (t.stride(d) != expected) return std::nullopt;
    expected = t.stride(d) * t.size(d);
  }
  return stride.value_or(0);
}

/// t read as the matrices of a GEMM with the given batch shape (t already broadcast to it).
Operand operand(const Tensor& t) {
  int64_t rows = t.size(-2), cols = t.size(-1), row_stride = t.stride(-2), col_stride = t.stride(-1);
  if (std::optional<int64_t> batch = flat_batch_stride(t)) {
    // Row-major with leading dim ld is column-major transposed: no flag. A column-major view needs one.
    // The leading dim must be at least the row length: expanded matrices (stride 0) are copied.
    if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= std::max(cols, int64_t{1})))
      return {t, CUBLAS_OP_N, rows == 1 ? std::max(cols, int64_t{1}) : row_stride, *batch};
    if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= std::max(rows, int64_t{1})))
      return {t, CUBLAS_OP_T, cols == 1 ? std::max(rows, int64_t{1}) : col_stride, *batch};
  }
  Tensor dense = t.contiguous();
  return {dense, CUBLAS_OP_N, std::max<int64_t>(cols, 1), rows * cols};
}

int to_int(int64_t value, const char* what) {
  MF_CHECK(value <= INT_MAX, "cuBLAS takes 32-bit sizes, but {} is {}", what, value);
  return static_cast<int>(value);
}

/// How cuBLAS computes float32 products, as PyTorch's CUDA GEMMs do: from operands rounded to
/// bfloat16 in an op autocast lowers or under set_float32_matmul_precision("medium"), in TF32 under
/// "high", else in float32; the sums are float32 in every case.
cublasComputeType_t float32_compute() {
  if (kernel_settings().bfloat16_products) return CUBLAS_COMPUTE_32F_FAST_16BF;
  switch (detail::float32_matmul_precision()) {
    case detail::MatmulPrecision::Medium: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case detail::MatmulPrecision::High: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case detail::MatmulPrecision::Highest: break;
  }
  return CUBLAS_COMPUTE_32F;
}

/// The two operands in one dtype, as cuBLAS takes them: as they are, or, where a bfloat16 one meets a
/// float32 one, both bfloat16 (the float32 one rounded as autocast would have rounded it).
std::pair<Tensor, Tensor> in_one_dtype(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return {a, b};
  return {a.to(DType::BFloat16), b.to(DType::BFloat16)};
}

/// c = a b, or c += a b for beta = 1; T is c's type, and a and b share a dtype (float32 or
/// bfloat16 for a float32 c).
template <typename T>
void gemm(cublasHandle_t handle, const Operand& a, const Operand& b, T* c, int64_t n, int64_t m, int64_t k,
          int64_t batch, T beta = 0) {
  const T one = 1;
  // Column-major: C^T [M, N] = op(B^T) [M, K] * op(A^T) [K, N].
  int im = to_int(m, "M"), in = to_int(n, "N"), ik = to_int(k, "K"), ib = to_int(batch, "the batch");
  int lda = to_int(a.ld, "lda"), ldb = to_int(b.ld, "ldb");
  if constexpr (std::is_same_v<T, float>) {
    const bool bfloat16 = a.t.dtype() == DType::BFloat16;
    const cudaDataType_t type = bfloat16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = bfloat16 ? CUBLAS_COMPUTE_32F : float32_compute();
    MF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, b.op, a.op, im, in, ik, &one, b.t.raw_data(), type, ldb,
                                               b.batch_stride, a.t.raw_data(), type, lda, a.batch_stride, &beta, c,
                                               CUDA_R_32F, im, m * n, ib, compute, CUBLAS_GEMM_DEFAULT));
  } else {
    MF_CUBLAS_CHECK(cublasDgemmStridedBatched(handle, b.op, a.op, im, in, ik, &one, b.t.data_ptr<T>(), ldb,
                                              b.batch_stride, a.t.data_ptr<T>(), lda, a.batch_stride, &beta, c, im,
                                              m * n, ib));
  }
}

void matmul(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor& c = out[0];  // [..., N, M], contiguous
  int64_t n = c.size(-2), m = c.size(-1), k = in[0].size(-1);
  int device = c.device().index;
  if (k == 0) {  // an empty sum: zeros (cuBLAS is not asked to multiply nothing)
    MF_CUDA_CHECK(cudaMemsetAsync(c.raw_data(), 0, static_cast<size_t>(c.numel()) * c.element_size(), stream(device)));
    return;
  }
  Shape batch(c.shape().begin(), c.shape().end() - 2);
  auto expanded = [&](const Tensor& t, int64_t rows, int64_t cols) {
    Shape shape = batch;
    shape.push_back(rows);
    shape.push_back(cols);
    return t.expand(shape);
  };
  auto [a_in, b_in] = in_one_dtype(in[0], in[1]);
  Operand a = operand(expanded(a_in, n, k)), b = operand(expanded(b_in, k, m));
  cublasHandle_t handle = cublas(device);
  visit_floating(c.dtype(), [&]<typename T>() { gemm<T>(handle, a, b, c.data_ptr<T>(), n, m, k, shape_numel(batch)); });
}

/// x [..., K] @ weight [M, K]^T + bias [M]: C starts as the bias in every row, and the GEMM adds to it.
void linear(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor& c = out[0];  // [..., M], contiguous
  if (c.numel() == 0) return;
  int64_t m = c.size(-1), n = c.numel() / m, k = in[1].size(1);
  c.copy_(in[2].expand(c.shape()));
  if (k == 0) return;
  auto [x, weight] = in_one_dtype(in[0], in[1]);
  Operand a = operand(x.reshape({n, k})), b = operand(weight.t());
  cublasHandle_t handle = cublas(c.device().index);
  visit_floating(c.dtype(), [&]<typename T>() { gemm<T>(handle, a, b, c.data_ptr<T>(), n, m, k, 1, T{1}); });
}

/// relu(x @ weight^T + bias): linear's GEMM, then the ReLU in place over its result.
void linear_relu(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  linear(in, out, attrs);
  call_inplace<OpId::relu>(out[0], {out[0]});
}

}  // namespace

void register_matmul(Registry& r) {
  constexpr bool reads_bfloat16_when_lowered = true;
  r.set_kernel(OpId::matmul, DeviceType::CUDA, matmul, reads_bfloat16_when_lowered);
  r.set_kernel(OpId::linear, DeviceType::CUDA, linear, reads_bfloat16_when_lowered);
  r.set_kernel(OpId::linear_relu, DeviceType::CUDA, linear_relu, reads_bfloat16_when_lowered);
}

}  // namespace mf::cuda
