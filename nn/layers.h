// Basic layers with PyTorch's parameter names, layouts and default initialisations (Linear's weight is
// [out, in], as torch.nn.Linear's), so weights move between the two freely. Each builds its parameters
// in the constructor from an options struct; forward only computes. Initialisation draws from the
// default generator (mf::manual_seed makes it repeatable). Each layer is a module class (LinearImpl)
// and its holder (Linear), as in libtorch: see nn/module.h.
#pragma once

#include "core/tensor.h"
#include "nn/module.h"
#include "ops/functional.h"

#include <optional>
#include <string>

namespace mf::nn {

/// x @ weight^T + bias (torch.nn.functional.linear): x [..., in], weight [out, in], bias [out] or
/// undefined -> [..., out]. The transpose reaches the GEMM as a flag, and the bias goes into the GEMM.
using mf::linear;

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
};

/// y = x W^T + b. weight [out, in] ~ kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in));
/// bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)). Parameters "weight", "bias" (absent when options.bias is off).
class LinearImpl : public Module {
 public:
  using Options = LinearOptions;
  explicit LinearImpl(const LinearOptions& options);
  /// Linear(in_features, out_features[, bias]), as torch.nn.Linear.
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true)
      : LinearImpl(LinearOptions{.in_features = in_features, .out_features = out_features, .bias = bias}) {}
  /// x [..., in] -> [..., out].
  Tensor forward(const Tensor& x) override;
  /// Outputs [first, first + count) only, from those rows of the weight and bias (a fused
  /// projection's part: attention's query, or its key and value).
  Tensor forward_outputs(const Tensor& x, int64_t first, int64_t count);
  /// "in_features=4, out_features=2, bias=True" (", int8" once quantized).
  std::string extra_repr() const override;
  const LinearOptions& options() const { return options_; }

  /// Quantizes the weight to int8 per output channel, for inference (PyTorch's quantize_dynamic):
  /// "weight" becomes the int8 values (no gradient), a buffer "weight_scale" [out] holds the scales,
  /// and forward runs linear_int8 (inputs quantized per row at each call); the bias stays float32.
  /// A weight tied to another module is quantized here alone. Once quantized it stays so.
  void quantize_int8();
  bool is_quantized() const { return weight_scale.defined(); }

  Tensor weight;        // [out, in]: float, or int8 once quantized
  Tensor bias;          // [out], undefined without bias
  Tensor weight_scale;  // [out] float32, only once quantized

 private:
  LinearOptions options_;
};
MF_MODULE(Linear);

struct EmbeddingOptions {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  /// A row that stays zero and gets no gradient (negative counts from the end, as in PyTorch).
  std::optional<int64_t> padding_idx = std::nullopt;
};

/// A lookup table. weight [num_embeddings, embedding_dim] ~ N(0, 1) (torch.nn.Embedding's default), the
/// padding row zeroed. For another scale, draw it again: nn::init::normal_(embedding->weight, 0, 0.02)
/// (GPT-2's, usual when the table is tied to an output layer).
class EmbeddingImpl : public Module {
 public:
  using Options = EmbeddingOptions;
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  /// Embedding(num_embeddings, embedding_dim), as torch.nn.Embedding.
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(EmbeddingOptions{.num_embeddings = num_embeddings, .embedding_dim = embedding_dim, .padding_idx = {}}) {}
  /// int64 indices [...] -> [..., embedding_dim].
  Tensor forward(const Tensor& indices) override;
  /// "13, 16, padding_idx=0".
  std::string extra_repr() const override;
  /// The options, with a negative padding_idx resolved to its row.
  const EmbeddingOptions& options() const { return options_; }

  /// Quantizes the table to int8 per row, for inference: "weight" becomes the int8 values, a buffer
  /// "weight_scale" [num_embeddings] holds the scales, and forward returns the looked-up rows
  /// dequantized to float32. Once quantized it stays so.
  void quantize_int8();
  bool is_quantized() const { return weight_scale.defined(); }
  /// The table as a quantized weight (its rows are output channels when it is tied to an output
  /// projection); needs is_quantized().
  QuantizedWeight quantized_weight() const;

  Tensor weight;        // [num_embeddings, embedding_dim]: float, or int8 once quantized
  Tensor weight_scale;  // [num_embeddings] float32, only once quantized

 private:
  EmbeddingOptions options_;
};
MF_MODULE(Embedding);

/// Ties an output projection to an embedding (GPT-2's head, the original Transformer's softmax
/// weights): `output`'s weight becomes the embedding's weight tensor itself, [V, C] in both, so one
/// parameter trains through both uses. parameters() then lists it once and state_dict() under both
/// names. (Assigning `output->weight = embedding->weight` would change only the layer's handle and
/// leave the old weight registered.) Throws when the shapes, dtypes or devices differ.
void tie_weights(LinearImpl& output, const EmbeddingImpl& embedding);

/// Quantizes every Linear and Embedding in `model` (itself included) to int8 for inference, as
/// torch.ao.quantization.quantize_dynamic does for Linear layers, and CTranslate2 for embeddings too;
/// other layers stay float32. Gives the number of layers quantized. The model is then inference-only
/// and its state_dict() holds the int8 values and their scales.
int64_t quantize_int8(Module& model);
/// Whether any Linear or Embedding in `model` holds int8 weights.
bool is_quantized_int8(Module& model);

struct LayerNormOptions {
  /// The trailing dims to normalise over.
  Shape normalized_shape;
  double eps = 1e-5;
  /// Learnable per-element weight (ones) and bias (zeros) of normalized_shape.
  bool elementwise_affine = true;
};

/// (x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape dims (biased var).
class LayerNormImpl : public Module {
 public:
  using Options = LayerNormOptions;
  explicit LayerNormImpl(const LayerNormOptions& options);
  /// LayerNorm(size[, eps]) over the last dim, as torch.nn.LayerNorm(size).
  explicit LayerNormImpl(int64_t normalized_size, double eps = 1e-5)
      : LayerNormImpl(LayerNormOptions{.normalized_shape = {normalized_size}, .eps = eps}) {}
  Tensor forward(const Tensor& x) override;
  /// "(16,), eps=1e-05, elementwise_affine=True".
  std::string extra_repr() const override;
  const LayerNormOptions& options() const { return options_; }

  Tensor weight;  // normalized_shape, undefined without elementwise_affine
  Tensor bias;

 private:
  LayerNormOptions options_;
};
MF_MODULE(LayerNorm);

struct DropoutOptions {
  double p = 0.5;  // probability of zeroing an element
};

/// Zeroes elements with probability p and scales the rest by 1 / (1 - p) in training mode (drawing
/// from the default generator); the identity in eval mode.
class DropoutImpl : public Module {
 public:
  using Options = DropoutOptions;
  explicit DropoutImpl(const DropoutOptions& options);
  /// Dropout(p), as torch.nn.Dropout.
  explicit DropoutImpl(double p = 0.5) : DropoutImpl(DropoutOptions{.p = p}) {}
  Tensor forward(const Tensor& x) override;
  /// "p=0.5".
  std::string extra_repr() const override;
  const DropoutOptions& options() const { return options_; }

 private:
  DropoutOptions options_;
};
MF_MODULE(Dropout);

/// max(x, 0).
class ReLUImpl : public Module {
 public:
  ReLUImpl() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};
MF_MODULE(ReLU);

/// Exact GELU, x * Phi(x) (PyTorch's approximate='none').
struct GELUOptions {
  /// "none": x Phi(x); "tanh": its tanh approximation (GPT-2's), as torch.nn.GELU's approximate.
  std::string approximate = "none";
};

class GELUImpl : public Module {
 public:
  using Options = GELUOptions;
  explicit GELUImpl(GELUOptions options = {});
  Tensor forward(const Tensor& x) override;
  /// "approximate='none'".
  std::string extra_repr() const override { return "approximate='" + options_.approximate + "'"; }
  const GELUOptions& options() const { return options_; }

 private:
  GELUOptions options_;
};
MF_MODULE(GELU);

}  // namespace mf::nn
