// The op registry: every op is declared once, with its checks, kernels per device, backward rule and
// test samples (PyTorch's native_functions.yaml + derivatives.yaml + OpInfo in one place).
//
// Adding an op: add its name and input count to MF_OPS below, then define it in its family's file with
// `registry.define(OpId::name, {...})`. The registry refuses to start with an op left undefined, and
// the registry-driven test refuses an op without samples.
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
#include <vector>

namespace mf {

// clang-format off
#define MF_OPS(X)                                                                                  \
  /* elementwise, broadcasting */                                                                  \
  X(add, 2) X(sub, 2) X(mul, 2) X(div, 2) X(pow, 2) X(pow_scalar, 1) X(neg, 1) X(abs, 1)           \
  X(exp, 1) X(log, 1) X(sqrt, 1) X(rsqrt, 1)                                                       \
  X(relu, 1) X(relu_backward, 2) X(gelu, 1) X(gelu_backward, 2) X(tanh, 1) X(sigmoid, 1)           \
  X(clamp, 1)                                                                                      \
  X(eq, 2) X(ne, 2) X(lt, 2) X(le, 2) X(gt, 2) X(ge, 2) X(logical_not, 1) X(logical_and, 2)        \
  X(logical_or, 2)                                                                                 \
  X(where, 3) X(masked_fill, 2) X(cast, 1) X(copy, 1) X(to_device, 1)                              \
  /* in-place fills */                                                                             \
  X(fill, 1) X(arange, 1) X(uniform, 1) X(normal, 1) X(bernoulli, 1)                               \
  /* reductions */                                                                                 \
  X(sum, 1) X(mean, 1) X(var, 1) X(amax, 1) X(amin, 1) X(max_dim, 1) X(min_dim, 1) X(argmax, 1)    \
  /* views */                                                                                      \
  X(view, 1) X(permute, 1) X(slice, 1) X(select, 1) X(expand, 1)                                   \
  /* indexing and joining */                                                                       \
  X(cat, -1) X(index_select, 2) X(gather, 2) X(scatter_add, 3) X(topk, 1) X(one_hot, 1)            \
  X(tril, 1) X(triu, 1)                                                                            \
  /* linear algebra and fused nn ops */                                                            \
  X(matmul, 2) X(linear, 3) X(linear_relu, 3) X(softmax, 1) X(log_softmax, 1) X(layer_norm, 3)     \
  X(layer_norm_backward, 7)                                                                        \
  X(embedding, 2) X(embedding_backward, 2) X(dropout, 1) X(cross_entropy, 2)                       \
  X(cross_entropy_backward, 5)                                                                     \
  X(attention, 4) X(attention_backward, 6)
// clang-format on

enum class OpId : uint16_t {
#define MF_OP_ENUM(name, arity) name,
  MF_OPS(MF_OP_ENUM)
#undef MF_OP_ENUM
};

inline constexpr std::string_view kOpNames[] = {
#define MF_OP_NAME(name, arity) #name,
    MF_OPS(MF_OP_NAME)
#undef MF_OP_NAME
};
inline constexpr size_t kOpCount = std::size(kOpNames);

/// How many tensor inputs each op takes; -1 for any number from one up (cat).
inline constexpr int kOpArity[] = {
#define MF_OP_ARITY(name, arity) arity,
    MF_OPS(MF_OP_ARITY)
#undef MF_OP_ARITY
};

/// Op arguments that are not tensors. Each op reads the fields it documents and ignores the rest,
/// so call sites read like keyword arguments: Attrs{.dims = {1}, .keepdim = true}.
struct Attrs {
  Shape dims;                  // reduction dims (empty = all), permutation, target shape
  int64_t dim = 0;             // the one dim an op works along
  int64_t start = 0, end = 0, step = 1;  // slice; select uses start
  int64_t k = 0;               // topk's k, one_hot's class count, tril/triu diagonal
  bool keepdim = false;
  bool flag = false;           // op-specific switch, documented by the op (topk: largest, dropout: train)
  double value = 0;            // fill value, exponent, probability
  std::optional<double> min, max;  // clamp bounds
  double eps = 1e-5;           // layer_norm
  double label_smoothing = 0;  // cross_entropy
  int64_t ignore_index = -100; // cross_entropy
  int64_t correction = 1;      // var
  DType dtype = DType::Float32;  // cast target, factory dtype
  Device device;               // to_device target
  uint64_t seed = 0, counter = 0;  // Philox stream for random ops
};

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
  /// Test samples and the naive reference the suite holds the kernels against.
  SamplesFn samples = nullptr;
  ReferenceFn reference = nullptr;
};

class Registry {
 public:
  /// Defines an op; each op is defined exactly once.
  void define(OpId id, OpDef def);
  /// Adds or replaces one device's kernel (the CUDA layer registers its kernels this way).
  void set_kernel(OpId id, DeviceType device, KernelFn kernel);
  const OpDef& operator[](OpId id) const { return defs_[static_cast<size_t>(id)]; }
  bool is_defined(OpId id) const { return !defs_[static_cast<size_t>(id)].name.empty(); }

 private:
  std::array<OpDef, kOpCount> defs_{};
};

/// The registry, built on first use from every op family (and the CUDA kernels when built with CUDA).
const Registry& registry();

/// Runs an op: validates, allocates outputs on the inputs' device, runs the device's kernel, and
/// records an autograd node when grad mode is on and an input requires grad. Errors carry the op's
/// name and the call site.
std::vector<Tensor> call(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs = {},
                         Site site = Site::current());
/// call() for single-output ops.
Tensor call1(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs = {}, Site site = Site::current());
/// Runs an out-of-place op with `self` as its output (add_, mul_, copy_ ...): the result must have
/// self's shape; it is cast to self's dtype. Bumps self's storage version. Refused when autograd
/// would need to see the write.
void call_inplace(OpId id, Tensor& self, const std::vector<Tensor>& inputs, const Attrs& attrs = {},
                  Site site = Site::current());

}  // namespace mf
