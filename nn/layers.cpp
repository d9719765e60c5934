#include "nn/layers.h"

#include "nn/init.h"
#include "ops/functional.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace mf::nn {

namespace {
const char* py_bool(bool value) { return value ? "True" : "False"; }
}  // namespace

// ---- Linear -------------------------------------------------------------------------------------

LinearImpl::LinearImpl(const LinearOptions& options) : Module("Linear"), options_(options) {
  MF_CHECK(options.in_features >= 0 && options.out_features >= 0,
           "Linear: in_features and out_features must be >= 0, got {} and {}", options.in_features,
           options.out_features);
  weight = register_parameter("weight", Tensor::empty({options.out_features, options.in_features}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (options.bias) {
    bias = register_parameter("bias", Tensor::empty({options.out_features}));
    double bound = options.in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(options.in_features)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor LinearImpl::forward(const Tensor& x) {
  if (is_quantized()) return linear_int8(x, {weight, weight_scale}, bias);
  return linear(x, weight, bias);
}

Tensor LinearImpl::forward_outputs(const Tensor& x, int64_t first, int64_t count) {
  Tensor rows = weight.narrow(0, first, count);
  Tensor part_bias = bias.defined() ? bias.narrow(0, first, count) : Tensor();
  if (is_quantized()) return linear_int8(x, {rows, weight_scale.narrow(0, first, count)}, part_bias);
  return linear(x, rows, part_bias);
}

std::string LinearImpl::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}{}", options_.in_features, options_.out_features,
                     py_bool(options_.bias), is_quantized() ? ", int8" : "");
}

void LinearImpl::quantize_int8() {
  if (is_quantized()) return;
  QuantizedWeight q = quantize_per_channel(weight.detach().to(DType::Float32));
  weight = replace_parameter("weight", q.values);
  weight_scale = register_buffer("weight_scale", q.scales);
}

// ---- Embedding ----------------------------------------------------------------------------------

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& options) : Module("Embedding"), options_(options) {
  MF_CHECK(options.num_embeddings >= 0 && options.embedding_dim >= 0,
           "Embedding: num_embeddings and embedding_dim must be >= 0, got {} and {}", options.num_embeddings,
           options.embedding_dim);
  if (std::optional<int64_t>& pad = options_.padding_idx) {
    MF_CHECK(*pad >= -options.num_embeddings && *pad < options.num_embeddings,
             "Embedding: padding_idx {} is out of range for {} embeddings", *pad, options.num_embeddings);
    if (*pad < 0) *pad += options.num_embeddings;
  }
  weight = register_parameter("weight", Tensor::empty({options.num_embeddings, options.embedding_dim}));
  init::normal_(weight);
  if (options_.padding_idx) {
    Tensor row = weight.select(0, *options_.padding_idx);
    init::zeros_(row);
  }
}

Tensor EmbeddingImpl::forward(const Tensor& indices) {
  if (!is_quantized()) return embedding(weight, indices, options_.padding_idx);
  MF_CHECK(indices.dtype() == DType::Int64, "Embedding: expects int64 indices, got {} {}", dtype_name(indices.dtype()),
           shape_str(indices.shape()));
  Tensor flat = indices.reshape({-1});
  Tensor rows = index_select(weight, 0, flat).to(DType::Float32).mul(index_select(weight_scale, 0, flat).unsqueeze(-1));
  Shape shape = indices.shape();
  shape.push_back(options_.embedding_dim);
  return rows.view(shape);  // [..., embedding_dim]
}

void EmbeddingImpl::quantize_int8() {
  if (is_quantized()) return;
  QuantizedWeight q = quantize_per_channel(weight.detach().to(DType::Float32));
  weight = replace_parameter("weight", q.values);
  weight_scale = register_buffer("weight_scale", q.scales);
}

QuantizedWeight EmbeddingImpl::quantized_weight() const {
  MF_CHECK(is_quantized(), "Embedding: quantized_weight() needs quantize_int8() first");
  return {weight, weight_scale};
}

std::string EmbeddingImpl::extra_repr() const {
  std::string text = fmt::format("{}, {}", options_.num_embeddings, options_.embedding_dim);
  if (options_.padding_idx) text += fmt::format(", padding_idx={}", *options_.padding_idx);
  return text;
}

void tie_weights(LinearImpl& output, const EmbeddingImpl& embedding) {
  const Tensor& shared = embedding.weight;
  MF_CHECK(output.weight.shape() == shared.shape() && output.weight.dtype() == shared.dtype() &&
               output.weight.device() == shared.device(),
           "tie_weights: the Linear's weight is {} {} on {}, the Embedding's is {} {} on {}; they must match "
           "(Linear(C, V) and Embedding(V, C))",
           shape_str(output.weight.shape()), dtype_name(output.weight.dtype()), output.weight.device().str(),
           shape_str(shared.shape()), dtype_name(shared.dtype()), shared.device().str());
  output.weight = output.replace_parameter("weight", shared);
}

namespace {

/// Calls fn(layer) for every Linear and Embedding in `model`, itself included: the layers
/// quantize_int8 converts.
template <typename Fn>
void for_each_quantizable(Module& model, Fn&& fn) {
  for (auto& [name, module] : model.named_modules()) {
    if (auto* projection = dynamic_cast<LinearImpl*>(module))
      fn(*projection);
    else if (auto* table = dynamic_cast<EmbeddingImpl*>(module))
      fn(*table);
  }
}

}  // namespace

int64_t quantize_int8(Module& model) {
  int64_t quantized = 0;
  for_each_quantizable(model, [&](auto& layer) {
    if (layer.is_quantized()) return;
    layer.quantize_int8();
    ++quantized;
  });
  return quantized;
}

bool is_quantized_int8(Module& model) {
  bool quantized = false;
  for_each_quantizable(model, [&](const auto& layer) { quantized = quantized || layer.is_quantized(); });
  return quantized;
}

// ---- LayerNorm ----------------------------------------------------------------------------------

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options) : Module("LayerNorm"), options_(options) {
  MF_CHECK(!options.normalized_shape.empty(), "LayerNorm: normalized_shape must name at least one dim");
  for (int64_t size : options.normalized_shape)
    MF_CHECK(size > 0, "LayerNorm: normalized_shape {} has a dim that is not positive",
             shape_str(options.normalized_shape));
  MF_CHECK(options.eps >= 0, "LayerNorm: eps must be >= 0, got {}", options.eps);
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(options.normalized_shape));
    bias = register_parameter("bias", zeros(options.normalized_shape));
  }
}

Tensor LayerNormImpl::forward(const Tensor& x) {
  return layer_norm(x, options_.normalized_shape, weight, bias, options_.eps);
}

std::string LayerNormImpl::extra_repr() const {
  // Python's tuple spelling: (16,) for one dim, (4, 8) for more.
  std::string dims;
  for (size_t i = 0; i < options_.normalized_shape.size(); ++i)
    dims += fmt::format("{}{}", i == 0 ? "" : ", ", options_.normalized_shape[i]);
  if (options_.normalized_shape.size() == 1) dims += ",";
  return fmt::format("({}), eps={}, elementwise_affine={}", dims, options_.eps, py_bool(options_.elementwise_affine));
}

// ---- Dropout and activations --------------------------------------------------------------------

DropoutImpl::DropoutImpl(const DropoutOptions& options) : Module("Dropout"), options_(options) {
  MF_CHECK(options.p >= 0 && options.p <= 1, "Dropout: probability has to be between 0 and 1, but got {}",
           options.p);
}

Tensor DropoutImpl::forward(const Tensor& x) { return dropout(x, options_.p, is_training()); }

std::string DropoutImpl::extra_repr() const { return fmt::format("p={}", options_.p); }

Tensor ReLUImpl::forward(const Tensor& x) { return relu(x); }

GELUImpl::GELUImpl(GELUOptions options) : Module("GELU"), options_(std::move(options)) {
  MF_CHECK(options_.approximate == "none" || options_.approximate == "tanh",
           "GELU: approximate must be 'none' or 'tanh', got '{}'", options_.approximate);
}

Tensor GELUImpl::forward(const Tensor& x) { return gelu(x, options_.approximate); }

}  // namespace mf::nn
