// The functional API: thin functions that call the registry's ops (see ops/registry.h). Each takes a
// defaulted call site so that errors and autograd nodes point at the caller's line.
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

#include <optional>
#include <tuple>
#include <vector>

namespace mf {

// ---- factories ----------------------------------------------------------------------------------
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor empty_like(const Tensor& like);
/// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, DType dtype = DType::Float32, Device device = Device::cpu());
/// start, start + step, ... below end (like torch.arange).
Tensor arange(double start, double end, double step = 1, DType dtype = DType::Int64, Device device = Device::cpu());
Tensor arange(int64_t end, DType dtype = DType::Int64, Device device = Device::cpu());
/// Copies `values` into a new tensor of `shape` (1-D of all values when shape is empty and values has
/// more than one element): float32, float64, int64, bool, bfloat16 or int8, as T is.
template <ElementType T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape = {}, Device device = Device::cpu());
/// Integers of other types (int, unsigned, long long, ...) become int64, miniflow's integer dtype.
template <typename T>
  requires(std::is_integral_v<T> && !ElementType<T>)
Tensor from_vector(const std::vector<T>& values, const Shape& shape = {}, Device device = Device::cpu()) {
  return from_vector(std::vector<int64_t>(values.begin(), values.end()), shape, device);
}
/// 1-D tensor from a braced list: mf::tensor({1, 2, 3}).
Tensor tensor(std::initializer_list<double> values, DType dtype = DType::Float32, Device device = Device::cpu());
/// Uniform on [0, 1) (default generator when none is given).
Tensor rand(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu(),
            Generator* generator = nullptr);
/// Standard normal.
Tensor randn(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu(),
             Generator* generator = nullptr);
/// Uniform on [low, high).
Tensor uniform(const Shape& shape, double low, double high, DType dtype = DType::Float32,
               Device device = Device::cpu(), Generator* generator = nullptr);
/// 1 with probability p, else 0.
Tensor bernoulli(const Shape& shape, double p, DType dtype = DType::Float32, Device device = Device::cpu(),
                 Generator* generator = nullptr);
/// Integers uniform on [low, high), int64.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device = Device::cpu(),
               Generator* generator = nullptr);
/// A random permutation of 0 .. n-1, int64 (torch.randperm).
Tensor randperm(int64_t n, Device device = Device::cpu(), Generator* generator = nullptr, Site site = Site::current());
/// Indices drawn from each row of `weights` ([N] or [B, N], non-negative, finite, not all zero in a
/// row; they need not sum to 1): [num_samples] or [B, num_samples], int64 (torch.multinomial).
/// Without replacement a category is drawn at most once per row, so a row needs num_samples nonzero
/// weights.
Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement = false, Generator* generator = nullptr,
                   Site site = Site::current());
/// In-place fills from a generator (init helpers use these).
void uniform_(Tensor& t, double low, double high, Generator* generator = nullptr, Site site = Site::current());
void normal_(Tensor& t, double mean, double std, Generator* generator = nullptr, Site site = Site::current());

// ---- elementwise (NumPy broadcasting; mixed dtypes promote) --------------------------------------
Tensor add(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor sub(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor mul(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor div(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor pow(const Tensor& base, const Tensor& exponent, Site site = Site::current());
Tensor pow(const Tensor& base, double exponent, Site site = Site::current());
Tensor neg(const Tensor& x, Site site = Site::current());
Tensor abs(const Tensor& x, Site site = Site::current());
Tensor exp(const Tensor& x, Site site = Site::current());
Tensor log(const Tensor& x, Site site = Site::current());
Tensor sqrt(const Tensor& x, Site site = Site::current());
Tensor rsqrt(const Tensor& x, Site site = Site::current());
Tensor relu(const Tensor& x, Site site = Site::current());
/// Exact GELU, x * Phi(x) (PyTorch's default, approximate='none').
/// x Phi(x) (approximate "none"), or its tanh approximation (approximate "tanh"), as
/// torch.nn.functional.gelu.
Tensor gelu(const Tensor& x, std::string_view approximate = "none", Site site = Site::current());
Tensor tanh(const Tensor& x, Site site = Site::current());
Tensor sigmoid(const Tensor& x, Site site = Site::current());
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max, Site site = Site::current());
/// cond ? a : b, elementwise with broadcasting (cond is bool).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Site site = Site::current());
Tensor eq(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor ne(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor lt(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor le(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor gt(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor ge(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor logical_not(const Tensor& x, Site site = Site::current());
Tensor logical_and(const Tensor& a, const Tensor& b, Site site = Site::current());
Tensor logical_or(const Tensor& a, const Tensor& b, Site site = Site::current());

// ---- reductions ---------------------------------------------------------------------------------
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false, Site site = Site::current());
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false, Site site = Site::current());
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false,
           Site site = Site::current());
/// Largest / smallest value over `dims` (all when empty), without indices.
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false, Site site = Site::current());
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false, Site site = Site::current());
/// Sums `x` down to `shape` (the shape it was broadcast from): autograd's un-broadcast.
Tensor sum_to(const Tensor& x, const Shape& shape, Site site = Site::current());

// ---- joining and indexing -----------------------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0, Site site = Site::current());
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0, Site site = Site::current());
/// Views of `split_size` along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0, Site site = Site::current());
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0, Site site = Site::current());
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Site site = Site::current());
/// index_select written into `out` (PyTorch's `out=`), which must have the result's shape and may be a
/// strided view. out may be x's own memory: where it begins where x begins, with x's strides (fewer or
/// more positions along dim), the chosen slices move in place, copied once (how beam search compacts and
/// reorders its key/value caches without a second buffer); laid out otherwise, x is read from a copy.
Tensor& index_select_out(Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, Site site = Site::current());
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Site site = Site::current());
/// Copy of x with src added at index along dim (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   Site site = Site::current());
/// The k largest (or smallest) values along dim, sorted, and their int64 indices.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                Site site = Site::current());
/// topk(log_softmax(x, dim), k, dim, largest) without writing log_softmax(x): x's k best are ranked and
/// only they are normalised, to log_softmax's bits (a tie that log_softmax's rounding makes may rank
/// differently). Not differentiable. Beam search's next tokens: [N, V] logits -> [N, k].
std::tuple<Tensor, Tensor> log_softmax_topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                            Site site = Site::current());
/// x sorted along dim, stably (equal values keep their order; NaN counts as the largest value), and the
/// int64 positions the values came from (torch.sort with stable=true).
std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false, Site site = Site::current());
/// Running sums along dim (torch.cumsum); with reverse, from the end of dim. Integer and bool tensors
/// give int64.
Tensor cumsum(const Tensor& x, int64_t dim, bool reverse = false, Site site = Site::current());
/// The positions that sort x along dim (sort's second output).
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, Site site = Site::current());
Tensor one_hot(const Tensor& indices, int64_t num_classes, Site site = Site::current());
/// Keeps elements on and below the `diagonal`-th diagonal of the last two dims.
Tensor tril(const Tensor& x, int64_t diagonal = 0, Site site = Site::current());
Tensor triu(const Tensor& x, int64_t diagonal = 0, Site site = Site::current());

// ---- linear algebra and fused nn ops ------------------------------------------------------------
/// torch.matmul semantics: 1-D operands are promoted and squeezed back, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b, Site site = Site::current());
/// x @ weight^T + bias (torch::linear): x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Site site = Site::current());
/// relu(linear(x, weight, bias)) as one op: the ReLU is applied as the GEMM writes its result (no
/// pass of its own, no pre-activation tensor). The bias is required.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, Site site = Site::current());

// ---- int8 quantized inference (PyTorch's dynamic quantization) ----------------------------------
/// A weight [out, in] quantized symmetrically per output channel: w[j, k] ~ scales[j] * values[j, k],
/// values int8 in [-63, 63] (7 bits, as oneDNN's AVX2 int8 kernels scale theirs: ops/cpu/gemm_int8.h),
/// scales float32 [out].
struct QuantizedWeight {
  Tensor values;
  Tensor scales;
};
/// Quantizes a float32 CPU weight [out, in]: scales[j] = max_k |w[j, k]| / 63 and values the
/// weight times 63 / max rounded to nearest, ties to even (a row of zeros gets scale 1; a row holding
/// NaN or an infinity a NaN scale, so its outputs come out NaN).
QuantizedWeight quantize_per_channel(const Tensor& weight, Site site = Site::current());
/// values * scales[:, None] as float32 [out, in].
Tensor dequantize_per_channel(const QuantizedWeight& weight, Site site = Site::current());
/// x @ (the quantized weight)^T + bias for float32 x [..., in] on the CPU, as torch.ao.nn.quantized.
/// dynamic.Linear: each row of x is quantized to [-127, 127] on the fly, the products are summed
/// exactly in int32, and y = sum * (x_scale * w_scale) + bias in float32 (the same bits on every
/// instruction-set path). Inference only: no gradient flows through it.
Tensor linear_int8(const Tensor& x, const QuantizedWeight& weight, const Tensor& bias = {},
                   Site site = Site::current());
/// The kernel linear_int8 runs here, as kernel_isa() allows: "AVX512-VNNI", "AVX2" or "baseline".
std::string_view linear_int8_kernel();
Tensor softmax(const Tensor& x, int64_t dim, Site site = Site::current());
Tensor log_softmax(const Tensor& x, int64_t dim, Site site = Site::current());
/// Normalises over the last normalized_shape.size() dims, then scales by weight and adds bias
/// (both of normalized_shape, or undefined for none).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5, Site site = Site::current());
/// Rows of weight [V, C] picked by int64 indices [...] -> [..., C]. Rows at padding_idx get no
/// gradient.
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt,
                 Site site = Site::current());
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training; identity otherwise.
Tensor dropout(const Tensor& x, double p, bool training, Generator* generator = nullptr,
               Site site = Site::current());

/// Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention, with the default
/// scale 1/sqrt(D)): softmax(q k^T / sqrt(D) + attn_mask) @ v, dropout p on the weights, for
/// q [B, H, T, D] and k, v [B, H, S, D]. attn_mask is additive (0 keeps, a large negative value drops)
/// and broadcasts to [B, H, T, S], or is undefined for none. On CPU it is one fused op whose output
/// is a view of [B, T, H, D] memory, so merging the heads (transpose(1, 2), reshape to [B, T, H * D])
/// copies nothing; on other devices, and for a mask that needs a gradient, it is the composition of
/// matmul, softmax and dropout. Second derivatives through the fused op are not supported.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    double dropout_p = 0.0, Generator* generator = nullptr,
                                    Site site = Site::current());
struct AttentionResult {
  Tensor output;   // [B, H, T, D]
  Tensor weights;  // [B, H, T, S], before dropout
};
/// scaled_dot_product_attention, with the attention weights as well (they cost nothing extra: the
/// fused op keeps them for backward).
AttentionResult scaled_dot_product_attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                                          Generator* generator = nullptr,
                                                          Site site = Site::current());

enum class Reduction { None, Mean, Sum };
/// Cross-entropy of logits [N, C] (or [N, C] after flattening leading dims) against int64 targets [N]:
/// fused log_softmax + NLL, targets equal to ignore_index skipped, label smoothing as PyTorch defines
/// it ((1-e) * NLL + e * mean over classes of -log p). Mean divides by the non-ignored count.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean,
                     Site site = Site::current());

// ---- threads ------------------------------------------------------------------------------------
/// Sets the intra-op pool to n threads, miniflow's one thread setting (torch.set_num_threads); GEMMs
/// split across it too (OpenBLAS itself stays single-threaded, so the cores are never oversubscribed).
void set_num_threads(int n);
int get_num_threads();

/// How float32 matrix products may compute (torch.set_float32_matmul_precision): "highest" (the
/// default) in float32; "high" in float32 on the CPU and TF32 on CUDA (CUBLAS_COMPUTE_32F_FAST_TF32);
/// "medium" with the operands rounded to bfloat16 and the products summed in float32, on CUDA
/// (CUBLAS_COMPUTE_32F_FAST_16BF) and on CPUs whose AVX512-BF16 dot products make that faster (AMD Zen
/// 4 and Zen 5: cpu_has_fast_avx512_bf16; elsewhere, or with MINIFLOW_ISA narrower than avx512, it
/// stays float32).
/// On the CPU it covers the float32 GEMMs (matmul, linear, attention's products, and their
/// gradients) except linear layers over 32 rows or fewer, whose float32 kernel is the faster. Any
/// other value throws mf::Error.
void set_float32_matmul_precision(const std::string& precision);
std::string get_float32_matmul_precision();

/// Mixed precision (torch.autocast(device_type, dtype=torch.bfloat16)): while the guard lives, on
/// this thread, `device`'s GEMM-heavy ops (matmul, linear, attention) round their float32 operands
/// to bfloat16 and sum the products in float32, and so do their gradients, whenever backward runs
/// them; every other op (softmax, layer norm, log-softmax and cross-entropy, reductions, the
/// optimizer) computes in float32 as outside. Each op's rule lives with it in the registry
/// (OpDef::autocast). Unlike PyTorch's autocast, the lowered ops' results stay float32: their sums
/// are float32 already, and rounding them would lose precision for memory alone. Parameters and
/// their gradients stay float32 (master weights), and bfloat16 keeps float32's exponent range, so
/// no loss scaling is needed. bfloat16 tensors given to a CPU op that computes are cast to float32
/// first. On the CPU, products of 32 rows or fewer by a weight keep their faster float32 kernel,
/// and without AVX512-BF16 the rounded operands go through the float32 GEMM (same results,
/// slower); on CUDA, cuBLAS computes with CUBLAS_COMPUTE_32F_FAST_16BF. Guards nest; `enabled =
/// false` turns autocast off for a scope. A dtype other than bfloat16 throws mf::Error.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device = DeviceType::CPU, DType dtype = DType::BFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool previous_;
};

/// Whether autocast is on for `device`'s ops on this thread.
bool is_autocast_enabled(DeviceType device = DeviceType::CPU);

}  // namespace mf
