// Matrix multiplication: one GEMM per batch element (cpu::gemm: miniflow's own kernel for float32 on
// AVX-512 and AVX2 CPUs, OpenBLAS otherwise), transposed views passed as transpose flags (no copies), and a
// batch folded into one GEMM when the right operand is shared. Each GEMM call is single-threaded
// inside miniflow's one pool: batches split by element, single products by blocks of rows or columns.
#include "ops/cpu/blas.h"
#include "ops/families.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/cpu/reduce_util.h"
#include "ops/reference.h"
#include "ops/cpu/skinny_gemm.h"
#include "ops/packed_weights.h"

#include "core/graph.h"
#include "core/parallel.h"

#include <atomic>

namespace mf {
namespace {

/// The dtype of a product of operands of these dtypes: their one computing float dtype (float32 or
/// float64), or float32 where the operands are bfloat16, alone or beside float32 ones (the dispatcher
/// lets bfloat16 through only to a kernel that reads it in a call autocast lowers: cuBLAS's);
/// nothing for any other mix.
std::optional<DType> product_dtype(std::initializer_list<DType> dtypes) {
  const DType first = *dtypes.begin();
  auto computed = [&](DType d) { return d == first && is_floating(d) && !is_storage_only(d); };
  if (std::all_of(dtypes.begin(), dtypes.end(), computed)) return first;
  if (std::all_of(dtypes.begin(), dtypes.end(), [](DType d) { return d == DType::Float32 || d == DType::BFloat16; }))
    return DType::Float32;
  return std::nullopt;
}

// a [..., N, K] @ b [..., K, M] -> [..., N, M], batch dims broadcast.
std::vector<OutputSpec> infer_matmul(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  MF_CHECK(a.dim() >= 2 && b.dim() >= 2, "expects operands with at least 2 dims, got {} and {}", shape_str(a.shape()),
           shape_str(b.shape()));
  std::optional<DType> dtype = product_dtype({a.dtype(), b.dtype()});
  MF_CHECK(dtype, "expects two float32 or two float64 operands, got {} and {}", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  MF_CHECK(a.size(-1) == b.size(-2), "cannot multiply {} by {} ({} != {})", shape_str(a.shape()), shape_str(b.shape()),
           a.size(-1), b.size(-2));
  Shape batch = broadcast_shapes(std::span(a.shape()).first(a.shape().size() - 2),
                                 std::span(b.shape()).first(b.shape().size() - 2));
  batch.push_back(a.size(-2));
  batch.push_back(b.size(-1));
  return {{batch, *dtype}};
}

/// How one operand's matrices are laid out for BLAS: row-major with a leading dimension, or a
/// transposed view of one.
struct MatrixLayout {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

/// BLAS needs a leading dimension of at least the row length: an expanded operand (stride 0 along a
/// dim of size > 1) has none and must be copied first.
std::optional<MatrixLayout> blas_layout(const Tensor& t) {
  int64_t rows = t.size(-2), cols = t.size(-1), row_stride = t.stride(-2), col_stride = t.stride(-1);
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= std::max(cols, int64_t{1})))
    return MatrixLayout{CblasNoTrans, rows == 1 ? std::max(cols, int64_t{1}) : row_stride};
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= std::max(rows, int64_t{1})))
    return MatrixLayout{CblasTrans, cols == 1 ? std::max(rows, int64_t{1}) : col_stride};
  return std::nullopt;
}

using cpu::gemm;

// OpenBLAS runs single-threaded and miniflow's own pool splits the work: OpenBLAS's idle threads spin
// (sched_yield) between calls and would fight the pool's threads for the cores.
const bool kBlasSingleThreaded = (openblas_set_num_threads(1), true);

/// Below this many multiply-adds a product stays on one thread.
constexpr double kParallelGemmWork = 1 << 18;

/// One GEMM split over the pool, each thread running a single-threaded GEMM on its block of C. Every
/// thread packs all of the operand it shares (miniflow's kernel reads a plain A in place, but packs
/// B and A^T), so the split runs along the longer side of C: by rows (sharing B, k x m) when n >= m,
/// else by columns (sharing A, n x k).
template <typename T>
void parallel_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t n, int64_t m, int64_t k, const T* a, int64_t lda,
                   const T* b, int64_t ldb, T* c, int64_t ldc, const cpu::GemmEpilogue<T>& epilogue = {}) {
  int64_t threads = intra_op_threads();
  if (threads == 1 || static_cast<double>(n) * m * k < kParallelGemmWork) {
    gemm<T>(ta, tb, n, m, k, a, lda, b, ldb, c, ldc, epilogue);
    return;
  }
  if (n >= m) {
    parallel_for(0, n, (n + threads - 1) / threads, [&](int64_t lo, int64_t hi) {
      const T* rows = a + (ta == CblasNoTrans ? lo * lda : lo);  // row lo of op(A)
      gemm<T>(ta, tb, hi - lo, m, k, rows, lda, b, ldb, c + lo * ldc, ldc, epilogue);
    });
  } else {
    parallel_for(0, m, (m + threads - 1) / threads, [&](int64_t lo, int64_t hi) {
      const T* columns = b + (tb == CblasNoTrans ? lo : lo * ldb);  // column lo of op(B)
      cpu::GemmEpilogue<T> block = epilogue;
      if (block.bias) block.bias += lo;
      gemm<T>(ta, tb, n, hi - lo, k, a, lda, columns, ldb, c + lo, ldc, block);
    });
  }
}

/// The float weights products under NoGradGuard have packed (ops/packed_weights.h): a second copy of
/// each weight an inference run multiplies, the model's size again.
PackedWeightCache<cpu::PackedSgemmWeight, 1>& packed_float_weights() {
  static PackedWeightCache<cpu::PackedSgemmWeight, 1> cache;
  return cache;
}

/// c = x w^T through `epilogue` for x [rows, k] and w [m, k] (rows ldw apart; `weight` the tensor
/// viewing it, which keys the packing) from w packed once, split over the pool as parallel_gemm
/// splits a product. Only where nothing will differentiate the product (grad mode off: decoding
/// multiplies the same weights at every step, and sgemm would pack w at every call), products stay
/// in float32, and w has been multiplied before (a weight is packed at its second product, an
/// activation multiplied once never); returns false, computing nothing, otherwise. The same bits as
/// sgemm.
bool packed_product(int64_t rows, int64_t m, int64_t k, const float* x, const Tensor& weight, const float* w,
                    int64_t ldw, float* c, const cpu::GemmEpilogue<float>& epilogue) {
  if (grad_mode_enabled()) {  // training: let go of packings its optimizer has made stale (cheap when none)
    packed_float_weights().sweep();
    return false;
  }
  if (kernel_isa() < Isa::avx2 || cpu::products_in_bfloat16() || kernel_settings().bfloat16_products) return false;
  std::shared_ptr<const cpu::PackedSgemmWeight> packed =
      packed_float_weights().get_if_seen({&weight}, [&] { return cpu::PackedSgemmWeight(m, k, w, ldw); });
  if (!packed) return false;  // met for the first time: perhaps an activation, multiplied once
  int64_t threads = intra_op_threads();
  if (threads == 1 || static_cast<double>(rows) * m * k < kParallelGemmWork) {
    cpu::sgemm_packed(rows, 0, m, x, k, *packed, c, m, epilogue);
  } else if (rows >= m) {
    parallel_for(0, rows, (rows + threads - 1) / threads, [&](int64_t lo, int64_t hi) {
      cpu::sgemm_packed(hi - lo, 0, m, x + lo * k, k, *packed, c + lo * m, m, epilogue);
    });
  } else {
    const int64_t width = packed->panel_columns(), panels = (m + width - 1) / width;
    parallel_for(0, panels, (panels + threads - 1) / threads, [&](int64_t lo, int64_t hi) {
      cpu::sgemm_packed(rows, lo * width, std::min(m, hi * width), x, k, *packed, c, m, epilogue);
    });
  }
  return true;
}

void cpu_matmul(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor a = in[0], b = in[1];
  Tensor& c = out[0];  // [..., N, M], contiguous
  int64_t n = a.size(-2), k = a.size(-1), m = b.size(-1);
  if (c.numel() == 0) return;
  if (k == 0) {
    c.zero_();
    return;
  }
  if (!blas_layout(a)) a = a.contiguous();
  if (!blas_layout(b)) b = b.contiguous();
  MatrixLayout la = *blas_layout(a), lb = *blas_layout(b);
  Shape batch(c.shape().begin(), c.shape().end() - 2);
  Shape a_batch = broadcast_strides(std::span(a.shape()).first(a.dim() - 2), std::span(a.strides()).first(a.dim() - 2), batch);
  Shape b_batch = broadcast_strides(std::span(b.shape()).first(b.dim() - 2), std::span(b.strides()).first(b.dim() - 2), batch);
  bool b_shared = std::all_of(b_batch.begin(), b_batch.end(), [](int64_t s) { return s == 0; });
  visit_floating(c.dtype(), [&]<typename T>() {
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* pc = c.data_ptr<T>();
    // The batch folds into the rows of one GEMM when a holds every batch's rows, one after another
    // (a broadcast over the batch holds one batch's rows only).
    bool a_full = std::equal(batch.begin(), batch.end(), a.shape().begin(), a.shape().end() - 2);
    if (b_shared && a_full && a.is_contiguous()) {
      int64_t rows = c.numel() / m;
      // A linear layer (x W^T): over a few rows W is not worth packing; under NoGradGuard it is packed
      // once and kept.
      if constexpr (std::is_same_v<T, float>)
        if (lb.trans == CblasTrans && (cpu::skinny_gemm_nt(rows, m, k, pa, k, pb, lb.ld, pc, m) ||
                                       packed_product(rows, m, k, pa, b, pb, lb.ld, pc, {})))
          return;
      parallel_gemm<T>(CblasNoTrans, lb.trans, rows, m, k, pa, k, pb, lb.ld, pc, m);
      return;
    }
    int64_t count = shape_numel(batch);
    auto product = [&](int64_t i, auto&& run) {
      int64_t offset_a = 0, offset_b = 0;
      for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rest = i; d >= 0; --d) {
        offset_a += rest % batch[d] * a_batch[d];
        offset_b += rest % batch[d] * b_batch[d];
        rest /= batch[d];
      }
      run(la.trans, lb.trans, n, m, k, pa + offset_a, la.ld, pb + offset_b, lb.ld, pc + i * n * m, m);
    };
    if (count < intra_op_threads()) {  // few products: split each one
      for (int64_t i = 0; i < count; ++i) product(i, [](auto... args) { parallel_gemm<T>(args...); });
      return;
    }
    parallel_for(0, count, 1, [&](int64_t lo, int64_t hi) {  // many products: one thread each
      for (int64_t i = lo; i < hi; ++i) product(i, [](auto... args) { gemm<T>(args...); });
    });
  });
}

/// t [..., k] as the rows of a matrix [N, k] (reshape({-1, k}) cannot say N when k is 0).
Tensor as_rows(const Tensor& t) {
  return t.reshape({shape_numel(std::span(t.shape()).first(t.shape().size() - 1)), t.size(-1)});
}

/// c = a @ b (or c += a @ b) for 2-D float operands on one thread, c's rows contiguous (a block of
/// columns of a contiguous matrix will do).
void gemm_2d(Tensor a, Tensor b, Tensor& c, bool accumulate = false) {
  if (!blas_layout(a)) a = a.contiguous();
  if (!blas_layout(b)) b = b.contiguous();
  MatrixLayout la = *blas_layout(a), lb = *blas_layout(b);
  visit_floating(c.dtype(), [&]<typename T>() {
    gemm<T>(la.trans, lb.trans, c.size(0), c.size(1), a.size(1), static_cast<const T*>(a.raw_data()), la.ld,
            static_cast<const T*>(b.raw_data()), lb.ld, c.data_ptr<T>(), c.stride(0), {.beta = T(accumulate)});
  });
}

/// Below this many multiply-adds per product, the two products of a linear layer's backward run
/// one after the other, each split over the pool.
constexpr double kConcurrentBackwardWork = 1 << 22;

/// The most blocks a linear layer's dB is cut into on two threads (linear_backward_concurrently).
constexpr int64_t kMaxGradientBlocks = 8;

/// Whether b is the transposed view of a contiguous matrix (the W^T of linear's x @ W^T).
bool is_transposed_matrix(const Tensor& b) { return !b.is_contiguous() && b.t().is_contiguous(); }

/// A linear layer's backward on two threads: dA = dC @ B^T and dB = A^T @ dC (over a's rows) are
/// independent and equally big, so one thread runs dA whole while the other runs dB, packing each
/// operand once, where splitting both products packs their shared operands on both threads. dB
/// packs a transposed operand and can run a third slower (the output projection's in bfloat16), so
/// where dB is several times taller than wide (or wider than tall) it is cut into blocks of rows
/// (of columns), each packing the operand the blocks share again, and whichever thread is free
/// takes the next: the thread done with dA takes dB's last blocks instead of waiting. Only for two
/// threads (the pool does not split into teams). `a_sum` is A's gradient summed so far
/// (GradContext::sums), or undefined: where it fits, dA is added into it (beta = 1) and da is that
/// very tensor. With `dbias`, the column sums of dC (a bias's gradient) go there too, computed
/// after dA: dB packs A^T and takes the longer of the two. Returns false, computing nothing, where
/// the pair does not run.
bool linear_backward_concurrently(const Tensor& a, const Tensor& b, const Tensor& dout, const Tensor& a_sum,
                                  Tensor& da, Tensor& db, Tensor* dbias = nullptr) {
  int64_t k = b.size(0), m = b.size(1);
  if (intra_op_threads() != 2 || !a.device().is_cpu() || !b.device().is_cpu() ||
      !dout.device().is_cpu() || static_cast<double>(a.numel()) * m < kConcurrentBackwardWork)
    return false;
  Tensor rows = as_rows(a), drows = as_rows(dout);  // [N, k], [N, m]
  int64_t n = rows.size(0);
  bool transposed_matrix = is_transposed_matrix(b);
  bool into_sum = a_sum.defined();  // contiguous, a's shape, dtype and device (GradContext::sums)
  Tensor da_rows = into_sum ? a_sum.reshape({n, k}) : Tensor::empty({n, k}, rows.dtype());  // a view of a_sum
  db = Tensor::empty(transposed_matrix ? Shape{m, k} : Shape{k, m}, rows.dtype());
  Tensor dsum_rows = dbias ? drows.contiguous() : Tensor();
  if (dbias) *dbias = Tensor::empty({m}, rows.dtype());
  // dB = transposed operand @ shared operand: dW = dC^T @ x for the x @ W^T of a linear layer.
  const Tensor transposed = transposed_matrix ? drows.t() : rows.t(), shared = transposed_matrix ? rows : drows;
  const int64_t db_rows = db.size(0), db_cols = db.size(1);
  const bool by_rows = db_rows >= db_cols;
  // Blocks only where they keep dB's bits (elsewhere dB stays whole).
  const bool blocks_keep_bits =
      visit_floating(rows.dtype(), []<typename T>() { return cpu::gemm_bits_independent_of_blocks<T>(); });
  const int64_t blocks = blocks_keep_bits ? std::clamp<int64_t>(by_rows ? db_rows / db_cols : db_cols / db_rows, 1,
                                                                kMaxGradientBlocks)
                                          : 1;
  std::atomic<int64_t> next_task{0};  // 0: dA; 1 to blocks: dB's blocks
  parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    for (int64_t task; (task = next_task.fetch_add(1)) <= blocks;) {
      if (task == 0) {
        gemm_2d(drows, b.t(), da_rows, into_sum);
        if (dbias)
          visit_floating(rows.dtype(), [&]<typename T>() {
            sum_rows_here(static_cast<const T*>(dsum_rows.raw_data()), n, m, dbias->data_ptr<T>());
          });
        continue;
      }
      const int64_t extent = by_rows ? db_rows : db_cols;
      const int64_t first = (task - 1) * extent / blocks, end = task * extent / blocks;
      Tensor db_block = db.narrow(by_rows ? 0 : 1, first, end - first);
      if (by_rows) gemm_2d(transposed.narrow(0, first, end - first), shared, db_block);
      else gemm_2d(transposed, shared.narrow(1, first, end - first), db_block);
    }
  });
  da = into_sum ? a_sum : da_rows.reshape(a.shape());
  if (transposed_matrix) db = db.t();
  return true;
}

// dA = dC @ B^T, dB = A^T @ dC. When B is one matrix shared by a batch of A, dB is one GEMM over
// the flattened batch instead of a batch of products summed afterwards. When that matrix is the
// transposed view of a contiguous W (linear's x @ W^T), dB comes out as the transposed view of a
// contiguous dW = dC^T @ A, so W's gradient reaches it contiguous, with no copy.
std::vector<Tensor> matmul_backward(const GradContext& ctx) {
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1], &dout = ctx.grads[0];
  Tensor da, db;
  if (b.dim() == 2 && ctx.needs_grad[0] && ctx.needs_grad[1] &&
      linear_backward_concurrently(a, b, dout, ctx.sums[0], da, db))
    return {da, db};
  if (ctx.needs_grad[0]) da = matmul(dout, b.transpose(-1, -2));
  if (ctx.needs_grad[1]) {
    if (b.dim() == 2) {
      Tensor rows = as_rows(a), drows = as_rows(dout);  // [N, k], [N, m]
      db = is_transposed_matrix(b) ? matmul(drows.t(), rows).t() : matmul(rows.t(), drows);  // [k, m]
    } else {
      db = matmul(a.transpose(-1, -2), dout);
    }
  }
  return {da, db};
}

std::vector<Tensor> reference_matmul(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &a = in[0], &b = in[1];
  Shape shape = infer_matmul(in, attrs)[0].shape;
  int64_t k = a.size(-1);
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape ia(index.end() - a.dim(), index.end()), ib(index.end() - b.dim(), index.end());
    for (int64_t d = 0; d < a.dim() - 2; ++d) ia[d] = a.shape()[d] == 1 ? 0 : ia[d];
    for (int64_t d = 0; d < b.dim() - 2; ++d) ib[d] = b.shape()[d] == 1 ? 0 : ib[d];
    double total = 0;
    for (int64_t j = 0; j < k; ++j) {
      ia[a.dim() - 1] = j;
      ib[b.dim() - 2] = j;
      total += a.at<double>(ia) * b.at<double>(ib);
    }
    values.push_back(total);
  });
  return {reference::make(shape, a.dtype(), values)};
}


// ---- linear ---------------------------------------------------------------------------------------
// x [..., K] @ weight [M, K]^T + bias [M] -> [..., M]: torch.nn.functional.linear with a bias, as one
// op so that the bias goes into the GEMM rather than a pass of its own.

std::vector<OutputSpec> infer_linear(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  MF_CHECK(x.dim() >= 1 && weight.dim() == 2 && bias.dim() == 1,
           "expects input [..., in], weight [out, in] and bias [out], got {}, {} and {}", shape_str(x.shape()),
           shape_str(weight.shape()), shape_str(bias.shape()));
  std::optional<DType> dtype = product_dtype({x.dtype(), weight.dtype(), bias.dtype()});
  MF_CHECK(dtype, "expects float32 or float64 operands of one dtype, got {}, {} and {}", dtype_name(x.dtype()),
           dtype_name(weight.dtype()), dtype_name(bias.dtype()));
  MF_CHECK(x.size(-1) == weight.size(1) && bias.size(0) == weight.size(0),
           "input {}, weight {} and bias {} do not fit: weight must be [{}, {}] and bias [{}]", shape_str(x.shape()),
           shape_str(weight.shape()), shape_str(bias.shape()), bias.size(0), x.size(-1), weight.size(0));
  Shape shape = x.shape();
  shape.back() = weight.size(0);
  return {{shape, *dtype}};
}

/// linear's kernel, and with `relu` linear_relu's: the ReLU goes where the bias does.
void linear_forward(const std::vector<Tensor>& in, std::vector<Tensor>& out, bool relu) {
  Tensor x = in[0].contiguous(), weight_t = in[1].t(), bias = in[2].contiguous();  // weight_t: [K, M]
  Tensor& c = out[0];  // [..., M], contiguous and not empty (the dispatcher skips empty outputs)
  int64_t k = weight_t.size(0), m = weight_t.size(1), rows = c.numel() / m;
  if (!blas_layout(weight_t)) weight_t = weight_t.contiguous();
  MatrixLayout lw = *blas_layout(weight_t);
  visit_floating(c.dtype(), [&]<typename T>() {
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pw = static_cast<const T*>(weight_t.raw_data());
    const T* pb = static_cast<const T*>(bias.raw_data());
    T* pc = c.data_ptr<T>();
    // The GEMM adds the bias (and clamps) as it writes C: no pass over C before or after.
    const cpu::GemmEpilogue<T> epilogue{.bias = pb, .relu = relu};
    if constexpr (std::is_same_v<T, float>)  // a few rows, or a weight packed once (see matmul)
      if (lw.trans == CblasTrans && (cpu::skinny_gemm_nt(rows, m, k, px, k, pw, lw.ld, pc, m, epilogue) ||
                                     packed_product(rows, m, k, px, weight_t, pw, lw.ld, pc, epilogue)))
        return;
    parallel_gemm<T>(CblasNoTrans, lw.trans, rows, m, k, px, k, pw, lw.ld, pc, m, epilogue);
  });
}

void cpu_linear(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  linear_forward(in, out, false);
}

void cpu_linear_relu(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  linear_forward(in, out, true);
}

// dx = dout @ W, dW = dout^T @ x over the flattened rows, dbias = dout summed over the rows.
std::vector<Tensor> linear_backward(const GradContext& ctx) {
  const Tensor &x = ctx.inputs[0], &weight = ctx.inputs[1], &dout = ctx.grads[0];
  Tensor drows = as_rows(dout);  // [N, M]
  Tensor dx, dweight, dbias;
  if (ctx.needs_grad[0] && ctx.needs_grad[1] &&
      linear_backward_concurrently(x, weight.t(), dout, ctx.sums[0], dx, dweight,
                                   ctx.needs_grad[2] ? &dbias : nullptr)) {
    dweight = dweight.t();
    return {dx, dweight, dbias};
  }
  if (ctx.needs_grad[0]) dx = matmul(dout, weight);
  if (ctx.needs_grad[1]) dweight = matmul(drows.t(), as_rows(x));
  if (ctx.needs_grad[2]) dbias = drows.sum({0});
  return {dx, dweight, dbias};
}

// relu(z) for z = x @ W^T + b: dz = dout where the saved output is > 0 (relu_backward's rule), then
// linear's backward.
std::vector<Tensor> linear_relu_backward(const GradContext& ctx) {
  std::vector<Tensor> dz{call1<OpId::relu_backward>({ctx.grads[0], ctx.outputs[0]}, {}, ctx.site)};
  return linear_backward({dz, ctx.inputs, ctx.outputs, ctx.attrs, ctx.needs_grad, ctx.site, ctx.sums});
}

std::vector<Tensor> reference_linear(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &weight = in[1], &bias = in[2];
  Shape shape = infer_linear(in, attrs)[0].shape;
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape at_x = index;
    int64_t j = index.back();
    double total = bias.at<double>({j});
    for (int64_t p = 0; p < weight.size(1); ++p) {
      at_x.back() = p;
      total += x.at<double>(at_x) * weight.at<double>({j, p});
    }
    values.push_back(total);
  });
  return {reference::make(shape, x.dtype(), values)};
}

}  // namespace

void register_linalg_ops(Registry& r) {
  r.define(OpId::matmul, {.name = "matmul", .infer = infer_matmul, .kernels = {cpu_matmul},
                          .backward = matmul_backward, .autocast = AutocastRule::LowerPrecision, .samples = [] {
    return std::vector<Sample>{
        {"2-d", {reference::randn({3, 4}, 71), reference::randn({4, 5}, 72)}},
        {"batched", {reference::randn({2, 3, 4}, 73), reference::randn({2, 4, 2}, 74)}},
        {"shared right operand", {reference::randn({2, 3, 4}, 75), reference::randn({4, 5}, 76)}},
        {"broadcast batch", {reference::randn({2, 1, 3, 4}, 77), reference::randn({3, 4, 2}, 78)}},
        {"transposed view", {reference::randn({4, 3}, 79).t(), reference::randn({5, 4}, 80).t()}},
    };
  }, .reference = reference_matmul});
  r.define(OpId::linear, {.name = "linear", .infer = infer_linear, .kernels = {cpu_linear},
                          .backward = linear_backward, .autocast = AutocastRule::LowerPrecision, .samples = [] {
    return std::vector<Sample>{
        {"2-d", {reference::randn({3, 4}, 81), reference::randn({5, 4}, 82), reference::randn({5}, 83)}},
        {"batched", {reference::randn({2, 3, 4}, 84), reference::randn({2, 4}, 85), reference::randn({2}, 86)}},
        {"1-d input", {reference::randn({4}, 87), reference::randn({3, 4}, 88), reference::randn({3}, 89)}},
        {"transposed weight view", {reference::randn({3, 4}, 90), reference::randn({4, 5}, 91).t(),
                                    reference::randn({5}, 92)}},
    };
  }, .reference = reference_linear});
  r.define(OpId::linear_relu, {.name = "linear_relu", .infer = infer_linear, .kernels = {cpu_linear_relu},
                               .backward = linear_relu_backward, .saves_outputs = true,
                               .autocast = AutocastRule::LowerPrecision, .samples = [] {
    return std::vector<Sample>{
        {"2-d", {reference::randn({3, 4}, 93), reference::randn({5, 4}, 94), reference::randn({5}, 95)}},
        {"batched", {reference::randn({2, 3, 4}, 96), reference::randn({6, 4}, 97), reference::randn({6}, 98)}},
        {"transposed weight view", {reference::randn({3, 4}, 99), reference::randn({4, 5}, 100).t(),
                                    reference::randn({5}, 101)}},
    };
  }, .reference = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    Tensor z = reference_linear(in, attrs)[0];
    std::vector<double> values = z.to_vector<double>();
    for (double& v : values) v = std::max(v, 0.0);
    return std::vector<Tensor>{reference::make(z.shape(), z.dtype(), values)};
  }});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b, Site site) {
  MF_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: cannot multiply 0-dim tensors ({} by {}) at {}",
           shape_str(a.shape()), shape_str(b.shape()), format_location(site));
  Tensor lhs = a.dim() == 1 ? a.unsqueeze(0, site) : a;
  Tensor rhs = b.dim() == 1 ? b.unsqueeze(-1, site) : b;
  Tensor out = call1<OpId::matmul>({lhs, rhs}, {}, site);
  if (b.dim() == 1) out = out.squeeze(-1, site);
  if (a.dim() == 1) out = out.squeeze(a.dim() == 1 && b.dim() == 1 ? 0 : -2, site);
  return out;
}

Tensor Tensor::matmul(const Tensor& other, Site site) const { return mf::matmul(*this, other, site); }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Site site) {
  MF_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got {} at {}", shape_str(weight.shape()),
           format_location(site));
  MF_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1),
           "linear: input {} has {} features in its last dim, but weight {} expects {} at {}", shape_str(x.shape()),
           x.dim() >= 1 ? x.size(-1) : 0, shape_str(weight.shape()), weight.size(1), format_location(site));
  if (!bias.defined()) return matmul(x, weight.t(site), site);  // [..., out]
  return call1<OpId::linear>({x, weight, bias}, {}, site);
}

Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, Site site) {
  MF_CHECK(weight.dim() == 2 && bias.defined(), "linear_relu: expects weight [out, in] and a bias, got {} and {} at {}",
           shape_str(weight.shape()), bias.defined() ? shape_str(bias.shape()) : "none", format_location(site));
  return call1<OpId::linear_relu>({x, weight, bias}, {}, site);
}

}  // namespace mf
