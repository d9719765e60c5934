// The op registry: every op is declared once, with its checks, kernels per device, backward rule and
// test samples (PyTorch's native_functions.yaml + derivatives.yaml + OpInfo in one place).
//
// Adding an op: add its name, input count and parameter struct to MF_OPS below (a new struct also to
// MF_OP_PARAMS), then define it in its family's file with `registry.define(OpId::name, {...})`. The
// registry refuses to start with an op left undefined, and the registry-driven test refuses an op
// without samples.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mf {

// ---- op parameters ------------------------------------------------------------------------------
// Each op takes one of these structs for its arguments that are not tensors (MF_OPS names which), so
// a field means one thing, in the words of the functional API. Ops share a struct only where its
// fields mean the same for all of them.

/// Ops whose arguments are all tensors.
struct NoParams {};

/// The Philox stream a random op draws from (see ops/fill.cpp for how elements map to blocks).
struct PhiloxStream {
  uint64_t seed = 0;     ///< the generator's seed; default 0
  uint64_t counter = 0;  ///< the first Philox block this draw may use; default 0
};

/// pow_scalar: pow(x, exponent).
struct PowParams {
  double exponent = 1;  ///< the power every element is raised to; default 1
};

/// clamp: at least one bound must be given.
struct ClampParams {
  std::optional<double> min;  ///< lower bound, none by default
  std::optional<double> max;  ///< upper bound, none by default
};

/// fill and masked_fill.
struct FillParams {
  double value = 0;  ///< the value written (where the mask is true, for masked_fill); default 0
};

/// cast.
struct CastParams {
  DType dtype = DType::Float32;  ///< the output's dtype; default float32
};

/// to_device.
struct ToDeviceParams {
  Device device;  ///< the device the copy lands on; default the CPU
};

/// arange: writes start + i * step into a 1-d tensor.
struct ArangeParams {
  double start = 0;  ///< the first value; default 0
  double step = 1;   ///< the difference between neighbours, nonzero; default 1
};

/// uniform: values on [low, high).
struct UniformParams {
  double low = 0;       ///< inclusive lower bound; default 0
  double high = 1;      ///< exclusive upper bound, >= low (> low for integer tensors); default 1
  PhiloxStream stream;  ///< where the random bits come from
};

/// normal: values from N(mean, std^2).
struct NormalParams {
  double mean = 0;      ///< default 0
  double std = 1;       ///< standard deviation, >= 0; default 1
  PhiloxStream stream;  ///< where the random bits come from
};

/// bernoulli: 1 with probability p, else 0.
struct BernoulliParams {
  double p = 0.5;       ///< probability of a 1, in [0, 1]; default 0.5
  PhiloxStream stream;  ///< where the random bits come from
};

/// multinomial: draws from each row of non-negative weights.
struct MultinomialParams {
  int64_t num_samples = 1;   ///< draws per row, >= 1 (without replacement, at most the row's nonzero weights); default 1
  bool replacement = false;  ///< whether a category can be drawn again; default false
  PhiloxStream stream;       ///< where the random bits come from
};

/// randperm: a random permutation of 0 .. n-1 written into a 1-D int64 tensor.
struct RandpermParams {
  PhiloxStream stream;  ///< where the random bits come from
};

/// dropout, and the dropout on attention's weights (attention, attention_backward).
struct DropoutParams {
  double p = 0;         ///< probability that an element is zeroed, in [0, 1]; default 0
  PhiloxStream stream;  ///< where the random bits come from (unused when p is 0)
};

/// sum, mean, amax, amin: reduce over several dims.
struct ReduceParams {
  Shape dims;            ///< the dims reduced, negative ones counted from the end; empty (default) for all
  bool keepdim = false;  ///< keep each reduced dim as size 1; default false
};

/// var: the reduction's dims and keepdim, and Bessel's correction.
struct VarParams : ReduceParams {
  int64_t correction = 1;  ///< divide by count - correction (clamped at 0), >= 0; default 1 (unbiased)
};

/// max_dim, min_dim, argmax: reduce over one dim.
struct ReduceDimParams {
  int64_t dim = 0;       ///< the dim reduced, negative counted from the end; default 0
  bool keepdim = false;  ///< keep it as size 1; default false
};

/// Ops that work along one dim: cat, index_select, gather, scatter_add, softmax, log_softmax.
struct DimParams {
  int64_t dim = 0;  ///< negative counted from the end; default 0
};

/// view and expand.
struct ShapeParams {
  Shape shape;  ///< the output's shape (view: one size may be -1, inferred; expand: -1 keeps a size)
};

/// permute.
struct PermuteParams {
  Shape dims;  ///< output dim i is input dim dims[i]; a permutation of the input's dims
};

/// slice: elements start, start + step, ... below end along dim (bounds clamped to the dim).
struct SliceParams {
  int64_t dim = 0;    ///< negative counted from the end; default 0
  int64_t start = 0;  ///< first index, negative counted from the end; default 0
  int64_t end = 0;    ///< one past the last index, negative counted from the end; default 0
  int64_t step = 1;   ///< positive; default 1
};

/// select: the slice at one index of dim, which the output drops.
struct SelectParams {
  int64_t dim = 0;    ///< negative counted from the end; default 0
  int64_t index = 0;  ///< negative counted from the end; default 0
};

/// topk and log_softmax_topk.
struct TopKParams {
  int64_t k = 0;         ///< how many values, at most dim's size; default 0
  int64_t dim = -1;      ///< negative counted from the end; default -1
  bool largest = true;   ///< the largest values, largest first (else the smallest, smallest first); default true
};

/// sort: a stable sort along dim, with the input positions it took.
struct SortParams {
  int64_t dim = -1;         ///< negative counted from the end; default -1
  bool descending = false;  ///< largest first (NaN first) instead of smallest first (NaN last); default false
};

/// cumsum: running sums along dim.
struct CumsumParams {
  int64_t dim = 0;       ///< negative counted from the end; default 0
  bool reverse = false;  ///< sum from the end of dim towards its start (cumsum's backward); default false
};

/// one_hot.
struct OneHotParams {
  int64_t num_classes = 0;  ///< the output's last dim, positive, above every index; default 0
};

/// tril, triu.
struct TriangleParams {
  int64_t diagonal = 0;  ///< which diagonal bounds the kept part: 0 the main one, > 0 above it; default 0
};

/// layer_norm and layer_norm_backward.
struct LayerNormParams {
  Shape normalized_shape;  ///< the trailing dims normalised over, non-empty
  double eps = 1e-5;       ///< added to the variance, >= 0; default 1e-5
};

/// embedding.
struct EmbeddingParams {
  int64_t padding_idx = -1;  ///< the row that gets no gradient, in [0, rows), or negative (default) for none
};

/// embedding_backward.
struct EmbeddingBackwardParams {
  int64_t num_embeddings = 0;  ///< rows of the weight (and of dweight), >= 0; default 0
  int64_t padding_idx = -1;    ///< the row that gets no gradient, or negative (default) for none
  bool accumulate = false;     ///< add to what dweight holds instead of overwriting it; default false
};

/// cross_entropy and cross_entropy_backward.
struct CrossEntropyParams {
  int64_t ignore_index = -100;  ///< rows whose target equals it are skipped; default -100
  double label_smoothing = 0;   ///< in [0, 1]; default 0
};

/// The parameter structs besides NoParams, one alternative of Attrs each.
#define MF_OP_PARAMS(X)                                                                                   \
  X(PowParams) X(ClampParams) X(FillParams) X(CastParams) X(ToDeviceParams) X(ArangeParams) X(UniformParams) \
  X(NormalParams) X(BernoulliParams) X(DropoutParams) X(ReduceParams) X(VarParams) X(ReduceDimParams)      \
  X(DimParams) X(ShapeParams) X(PermuteParams) X(SliceParams) X(SelectParams) X(TopKParams) X(OneHotParams) \
  X(TriangleParams) X(LayerNormParams) X(EmbeddingParams) X(EmbeddingBackwardParams) X(CrossEntropyParams) \
  X(MultinomialParams) X(RandpermParams) X(SortParams) X(CumsumParams)

#define MF_OP_PARAMS_TYPE(type) , type
/// An op's parameters: the struct its MF_OPS entry names. Default-constructed, NoParams.
using Attrs = std::variant<NoParams MF_OP_PARAMS(MF_OP_PARAMS_TYPE)>;
#undef MF_OP_PARAMS_TYPE

#define MF_OP_PARAMS_NAME(type) , #type
/// The struct names, by Attrs alternative (for errors).
inline constexpr std::string_view kParamsNames[] = {"NoParams" MF_OP_PARAMS(MF_OP_PARAMS_NAME)};
#undef MF_OP_PARAMS_NAME
static_assert(std::size(kParamsNames) == std::variant_size_v<Attrs>);

/// The dims and keepdim of sum, mean, amax, amin, and of var, whose VarParams extends ReduceParams.
inline const ReduceParams& reduction_of(const Attrs& attrs) {
  if (const auto* var = std::get_if<VarParams>(&attrs)) return *var;
  return std::get<ReduceParams>(attrs);
}

/// The Attrs alternative that holds P.
template <typename P>
constexpr size_t params_index() {
  constexpr size_t index = []<size_t... I>(std::index_sequence<I...>) {
    size_t found = std::variant_size_v<Attrs>;
    (void)((std::is_same_v<P, std::variant_alternative_t<I, Attrs>> ? (found = I, true) : false) || ...);
    return found;
  }(std::make_index_sequence<std::variant_size_v<Attrs>>());
  static_assert(index < std::variant_size_v<Attrs>, "a parameter struct missing from MF_OP_PARAMS");
  return index;
}

// Each op: its name, how many tensor inputs it takes (-1 for any number from one up: cat), and the
// struct its parameters come in.
// clang-format off
#define MF_OPS(X)                                                                                  \
  /* elementwise, broadcasting */                                                                  \
  X(add, 2, NoParams) X(sub, 2, NoParams) X(mul, 2, NoParams) X(div, 2, NoParams)                  \
  X(pow, 2, NoParams) X(pow_scalar, 1, PowParams) X(neg, 1, NoParams) X(abs, 1, NoParams)          \
  X(exp, 1, NoParams) X(log, 1, NoParams) X(sqrt, 1, NoParams) X(rsqrt, 1, NoParams)              \
  X(relu, 1, NoParams) X(relu_backward, 2, NoParams) X(gelu, 1, NoParams)                          \
  X(gelu_backward, 2, NoParams) X(gelu_tanh, 1, NoParams) X(gelu_tanh_backward, 2, NoParams)       \
  X(tanh, 1, NoParams) X(sigmoid, 1, NoParams)                                                     \
  X(clamp, 1, ClampParams)                                                                         \
  X(eq, 2, NoParams) X(ne, 2, NoParams) X(lt, 2, NoParams) X(le, 2, NoParams) X(gt, 2, NoParams)   \
  X(ge, 2, NoParams) X(logical_not, 1, NoParams) X(logical_and, 2, NoParams)                       \
  X(logical_or, 2, NoParams)                                                                       \
  X(where, 3, NoParams) X(masked_fill, 2, FillParams) X(cast, 1, CastParams) X(copy, 1, NoParams)  \
  X(to_device, 1, ToDeviceParams)                                                                  \
  /* in-place fills */                                                                             \
  X(fill, 1, FillParams) X(arange, 1, ArangeParams) X(uniform, 1, UniformParams)                   \
  X(normal, 1, NormalParams) X(bernoulli, 1, BernoulliParams) X(randperm, 1, RandpermParams)        \
  X(multinomial, 1, MultinomialParams)                                                             \
  /* reductions */                                                                                 \
  X(sum, 1, ReduceParams) X(mean, 1, ReduceParams) X(var, 1, VarParams) X(amax, 1, ReduceParams)   \
  X(amin, 1, ReduceParams) X(max_dim, 1, ReduceDimParams) X(min_dim, 1, ReduceDimParams)           \
  X(argmax, 1, ReduceDimParams) X(cumsum, 1, CumsumParams)                                         \
  /* views */                                                                                      \
  X(view, 1, ShapeParams) X(permute, 1, PermuteParams) X(slice, 1, SliceParams)                    \
  X(select, 1, SelectParams) X(expand, 1, ShapeParams)                                             \
  /* indexing and joining */                                                                       \
  X(cat, -1, DimParams) X(index_select, 2, DimParams) X(gather, 2, DimParams)                      \
  X(scatter_add, 3, DimParams) X(topk, 1, TopKParams) X(one_hot, 1, OneHotParams)                  \
  X(sort, 1, SortParams)                                                                           \
  X(tril, 1, TriangleParams) X(triu, 1, TriangleParams)                                            \
  /* linear algebra and fused nn ops */                                                            \
  X(matmul, 2, NoParams) X(linear, 3, NoParams) X(linear_relu, 3, NoParams)                        \
  X(linear_int8, 4, NoParams)                                                                      \
  X(softmax, 1, DimParams) X(log_softmax, 1, DimParams) X(log_softmax_topk, 1, TopKParams)         \
  X(layer_norm, 3, LayerNormParams)                                                                \
  X(layer_norm_backward, 7, LayerNormParams)                                                       \
  X(embedding, 2, EmbeddingParams) X(embedding_backward, 2, EmbeddingBackwardParams)               \
  X(dropout, 1, DropoutParams) X(cross_entropy, 2, CrossEntropyParams)                             \
  X(cross_entropy_backward, 5, CrossEntropyParams)                                                 \
  X(attention, 4, DropoutParams) X(attention_backward, 6, DropoutParams)
// clang-format on

enum class OpId : uint16_t {
#define MF_OP_ENUM(name, arity, params) name,
  MF_OPS(MF_OP_ENUM)
#undef MF_OP_ENUM
};

inline constexpr std::string_view kOpNames[] = {
#define MF_OP_NAME(name, arity, params) #name,
    MF_OPS(MF_OP_NAME)
#undef MF_OP_NAME
};
inline constexpr size_t kOpCount = std::size(kOpNames);

/// How many tensor inputs each op takes; -1 for any number from one up (cat).
inline constexpr int kOpArity[] = {
#define MF_OP_ARITY(name, arity, params) arity,
    MF_OPS(MF_OP_ARITY)
#undef MF_OP_ARITY
};

/// Which Attrs alternative each op takes.
inline constexpr size_t kOpParamsIndex[] = {
#define MF_OP_PARAMS_INDEX(name, arity, params) params_index<params>(),
    MF_OPS(MF_OP_PARAMS_INDEX)
#undef MF_OP_PARAMS_INDEX
};

/// The parameter struct of op Id, for calls the compiler checks: call<OpId::topk>(inputs, TopKParams{...}).
template <OpId Id>
struct OpParams;
#define MF_OP_PARAMS_TRAIT(name, arity, params) \
  template <>                                   \
  struct OpParams<OpId::name> {                 \
    using type = params;                        \
  };
MF_OPS(MF_OP_PARAMS_TRAIT)
#undef MF_OP_PARAMS_TRAIT
template <OpId Id>
using ParamsOf = typename OpParams<Id>::type;

/// Shape and dtype of one output, as an op's infer function computes them.
struct OutputSpec {
  Shape shape;
  DType dtype;
};

/// Everything a backward rule sees. Rules run with grad mode off and return one gradient per input
/// (undefined where none is needed or none flows); the engine sums each back to its input's shape.
struct GradContext {
  const std::vector<Tensor>& grads;    // one per output; zeros where no gradient arrived
  const std::vector<Tensor>& inputs;   // as saved (undefined unless the op saves inputs)
  const std::vector<Tensor>& outputs;  // as saved (undefined unless the op saves outputs)
  const Attrs& attrs;
  const std::vector<bool>& needs_grad;  // per input
  Site site;
  /// Per input: the gradient summed for it so far (a leaf's .grad included), where the rule may add
  /// its own in place and return this tensor (undefined where it may not). A defined sum is
  /// contiguous, of the input's shape, dtype and device, and seen by nothing else.
  const std::vector<Tensor>& sums;
};

/// One test case for the registry-driven suite. Float inputs are float64; the suite also runs them
/// in float32 and on non-contiguous copies.
struct Sample {
  std::string name;
  std::vector<Tensor> inputs;
  Attrs attrs;
  std::vector<bool> no_grad_inputs = {};  // float inputs the op does not differentiate (mask, target)
  bool gradcheck = true;                  // false where finite differences cannot work (casts to float32)
};

using InferFn = std::vector<OutputSpec> (*)(const std::vector<Tensor>& inputs, const Attrs& attrs);
using ViewFn = Tensor (*)(const Tensor& input, const Attrs& attrs);
using KernelFn = void (*)(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, const Attrs& attrs);
using BackwardFn = std::vector<Tensor> (*)(const GradContext& ctx);
using SamplesFn = std::vector<Sample> (*)();
using ReferenceFn = std::vector<Tensor> (*)(const std::vector<Tensor>& inputs, const Attrs& attrs);

/// What autocast (AutocastGuard, ops/functional.h) does with an op on its device. A CPU op first gets
/// its bfloat16 inputs cast to float32; then a LowerPrecision op (the GEMMs) rounds its float32
/// operands to bfloat16 and sums the products in float32, in its backward too, while a Float32 op
/// (everything else: softmax, norms, losses, reductions, element-wise ops) computes in float32 as it
/// would outside.
enum class AutocastRule { Float32, LowerPrecision };

struct OpDef {
  std::string_view name;
  /// Validates inputs (throwing mf::Error without op name or location: the dispatcher adds both) and
  /// gives the outputs' shapes and dtypes. Unused by view ops.
  InferFn infer = nullptr;
  /// For view ops: builds the output over the input's storage. Views need no kernels.
  ViewFn view = nullptr;
  std::array<KernelFn, kDeviceTypeCount> kernels{};
  /// Null for ops that are not differentiable (comparisons, argmax, ...).
  BackwardFn backward = nullptr;
  bool saves_inputs = true;
  bool saves_outputs = false;
  /// With saves_outputs: outputs before this one are not kept and reach backward undefined
  /// (cross_entropy keeps its row log-sum-exps, not the loss its caller may modify in place).
  size_t first_saved_output = 0;
  /// The backward rule takes an undefined gradient for an output that got none, and skips its term,
  /// where the engine would otherwise make a tensor of zeros for it (attention's weights).
  bool takes_undefined_grads = false;
  /// Input 0 is written in place and is the op's only output (fill, uniform, ...).
  bool writes_input = false;
  /// Inputs may live on different devices (to_device).
  bool mixes_devices = false;
  /// Takes and gives bfloat16 and int8 tensors: the ops that move or convert elements. Every other op
  /// gets bfloat16 inputs as float32 ones (its float32 results rounded back) and refuses int8 (views
  /// take any dtype).
  bool takes_storage_dtypes = false;
  AutocastRule autocast = AutocastRule::Float32;
  /// Devices whose kernel, in a call autocast lowers, reads bfloat16 inputs as they are (cuBLAS takes
  /// bfloat16 operands) where the dispatcher would otherwise cast them to float32 first: the inputs
  /// may then mix bfloat16 with float32, and the op's infer gives float32 results. Set by set_kernel.
  std::array<bool, kDeviceTypeCount> lowered_kernel_reads_bfloat16{};
  /// Test samples and the naive reference the suite holds the kernels against.
  SamplesFn samples = nullptr;
  ReferenceFn reference = nullptr;

  /// Whether the op runs on `device`: a view anywhere, any other op where it has a kernel.
  bool runs_on(DeviceType device) const { return view != nullptr || kernels[static_cast<size_t>(device)] != nullptr; }
};

class Registry {
 public:
  /// Defines an op; each op is defined exactly once.
  void define(OpId id, OpDef def);
  /// Adds or replaces one device's kernel (the CUDA layer registers its kernels this way);
  /// `reads_bfloat16_when_lowered`: see OpDef::lowered_kernel_reads_bfloat16.
  void set_kernel(OpId id, DeviceType device, KernelFn kernel, bool reads_bfloat16_when_lowered = false);
  const OpDef& operator[](OpId id) const { return defs_[static_cast<size_t>(id)]; }
  bool is_defined(OpId id) const { return !defs_[static_cast<size_t>(id)].name.empty(); }

 private:
  std::array<OpDef, kOpCount> defs_{};
};

/// The registry, built on first use from every op family; the CUDA backend adds its kernels when it is
/// loaded (cuda/loader.cpp).
const Registry& registry();

/// Runs an op: validates, allocates outputs on the inputs' device, runs the device's kernel, and
/// records an autograd node when grad mode is on and an input requires grad. Errors carry the op's
/// name and the call site; attrs must hold the op's parameter struct (see MF_OPS). Prefer the typed
/// form below, which checks the struct at compile time; this one serves code generic over ops.
std::vector<Tensor> call(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs, Site site = Site::current());
/// call() for single-output ops.
Tensor call1(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs, Site site = Site::current());
/// Runs an out-of-place op with `self` as its output (add_, mul_, copy_ ...): the result must have
/// self's shape; it is cast to self's dtype. Bumps self's storage version. Refused when autograd
/// would need to see the write.
void call_inplace(OpId id, Tensor& self, const std::vector<Tensor>& inputs, const Attrs& attrs,
                  Site site = Site::current());

/// The typed forms: op Id with the parameter struct MF_OPS gives it.
template <OpId Id>
std::vector<Tensor> call(const std::vector<Tensor>& inputs, ParamsOf<Id> params = {}, Site site = Site::current()) {
  return call(Id, inputs, Attrs(std::move(params)), site);
}
template <OpId Id>
Tensor call1(const std::vector<Tensor>& inputs, ParamsOf<Id> params = {}, Site site = Site::current()) {
  return call1(Id, inputs, Attrs(std::move(params)), site);
}
template <OpId Id>
void call_inplace(Tensor& self, const std::vector<Tensor>& inputs, ParamsOf<Id> params = {},
                  Site site = Site::current()) {
  call_inplace(Id, self, inputs, Attrs(std::move(params)), site);
}

}  // namespace mf
