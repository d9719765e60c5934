// The op registry: every op is declared once, with its checks, kernels per device, backward rule and
// test samples (PyTorch's native_functions.yaml + derivatives.yaml + OpInfo in one place).
//
// Adding an op: add its name to MF_OPS below, then define it in its family's file with
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
  X(add) X(sub) X(mul) X(div) X(pow) X(pow_scalar) X(neg) X(abs) X(exp) X(log) X(sqrt) X(rsqrt)   \
  X(relu) X(relu_backward) X(gelu) X(gelu_backward) X(tanh) X(sigmoid) X(clamp)                    \
  X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(logical_not) X(logical_and) X(logical_or)                   \
  X(where) X(masked_fill) X(cast) X(copy) X(to_device)                                             \
  /* in-place fills */                                                                             \
  X(fill) X(arange) X(uniform) X(normal) X(bernoulli)                                              \
  /* reductions */                                                                                 \
  X(sum) X(mean) X(var) X(amax) X(amin) X(max_dim) X(min_dim) X(argmax)                             \
  /* views */                                                                                      \
  X(view) X(permute) X(slice) X(select) X(expand)                                                  \
  /* indexing and joining */                                                                       \
  X(cat) X(index_select) X(gather) X(scatter_add) X(topk) X(one_hot) X(tril) X(triu)                \
  /* linear algebra and fused nn ops */                                                            \
  X(matmul) X(linear) X(softmax) X(log_softmax) X(layer_norm) X(layer_norm_backward)               \
  X(embedding) X(embedding_backward) X(dropout) X(cross_entropy) X(cross_entropy_backward)        \
  X(attention) X(attention_backward)
// clang-format on

enum class OpId : uint16_t {
#define MF_OP_ENUM(name) name,
  MF_OPS(MF_OP_ENUM)
#undef MF_OP_ENUM
};

inline constexpr std::string_view kOpNames[] = {
#define MF_OP_NAME(name) #name,
    MF_OPS(MF_OP_NAME)
#undef MF_OP_NAME
};
inline constexpr size_t kOpCount = std::size(kOpNames);

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
  /// Per input: the gradient summed for it so far, where the rule may add its own in place and
  /// return this tensor (undefined where it may not).
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
