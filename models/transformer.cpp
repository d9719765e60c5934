#include "models/transformer.h"

#include "core/graph.h"
#include "core/json_brief.h"
#include "ops/functional.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <initializer_list>
#include <numeric>
#include <utility>

namespace mf::models {

// ---- config -------------------------------------------------------------------------------------

void TransformerConfig::validate() const {
  MF_CHECK(src_vocab > 0 && tgt_vocab > 0, "TransformerConfig: vocabulary sizes must be positive, got {} and {}",
           src_vocab, tgt_vocab);
  MF_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0,
           "TransformerConfig: d_model {} must be a positive multiple of heads {}", d_model, heads);
  MF_CHECK(encoder_layers >= 0 && decoder_layers >= 1, "TransformerConfig: needs >= 0 encoder and >= 1 decoder "
           "layers, got {} and {}", encoder_layers, decoder_layers);
  MF_CHECK(d_ff > 0 && max_len > 0, "TransformerConfig: d_ff {} and max_len {} must be positive", d_ff, max_len);
  MF_CHECK(max_len <= kMaxLen, "TransformerConfig: max_len {} is over the limit of {} positions", max_len, kMaxLen);
  MF_CHECK(dropout >= 0 && dropout < 1, "TransformerConfig: dropout must be in [0, 1), got {}", dropout);
  MF_CHECK(!shared_embeddings || src_vocab == tgt_vocab, "TransformerConfig: shared embeddings need one vocabulary, "
           "got src_vocab {} and tgt_vocab {}", src_vocab, tgt_vocab);
  MF_CHECK(pad_id >= 0 && pad_id < std::min(src_vocab, tgt_vocab), "TransformerConfig: pad_id {} is outside the "
           "vocabularies", pad_id);
}

int64_t TransformerConfig::parameter_count() const {
  validate();
  bool overflow = false;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t product = 0;
    overflow |= __builtin_mul_overflow(a, b, &product);
    return product;
  };
  auto sum = [&](std::initializer_list<int64_t> terms) {
    int64_t total = 0;
    for (int64_t term : terms) overflow |= __builtin_add_overflow(total, term, &total);
    return total;
  };
  const int64_t C = d_model, F = d_ff;
  const int64_t norm = mul(2, C);                                    // weight [C], bias [C]
  const int64_t attention = sum({mul(4, mul(C, C)), mul(4, C)});     // {q,k,v,out}_proj: [C, C] + [C]
  const int64_t ffn = sum({mul(2, mul(C, F)), F, C});               // linear1 [F, C] + [F], linear2 [C, F] + [C]
  const int64_t encoder_layer = sum({attention, ffn, mul(2, norm)});
  const int64_t decoder_layer = sum({mul(2, attention), ffn, mul(3, norm)});
  const int64_t total = sum({mul(shared_embeddings ? src_vocab : sum({src_vocab, tgt_vocab}), C),  // [V, C] each
                             tie_output ? 0 : mul(tgt_vocab, C),                                 // output_proj
                             mul(encoder_layers, encoder_layer), mul(decoder_layers, decoder_layer),
                             pre_norm ? mul(2, norm) : 0});                                      // final norms
  MF_CHECK(!overflow, "TransformerConfig: the model would have more than 2^63 - 1 parameters ({})", to_json());
  return total;
}

std::string TransformerConfig::to_json() const {
  nlohmann::ordered_json j = {
      {"src_vocab", src_vocab}, {"tgt_vocab", tgt_vocab}, {"d_model", d_model}, {"heads", heads},
      {"encoder_layers", encoder_layers}, {"decoder_layers", decoder_layers}, {"d_ff", d_ff},
      {"dropout", dropout}, {"max_len", max_len},
      {"activation", activation == nn::Activation::ReLU ? "relu" : "gelu"}, {"pre_norm", pre_norm},
      {"shared_embeddings", shared_embeddings}, {"tie_output", tie_output}, {"layer_norm_eps", layer_norm_eps},
      {"pad_id", pad_id}, {"freeze_pad_embedding", freeze_pad_embedding}};
  return j.dump();
}

TransformerConfig TransformerConfig::from_json(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  MF_CHECK(j.is_object(), "TransformerConfig: not a JSON object: {}", text.substr(0, 200));
  TransformerConfig config;
  auto read = [&](const char* key, auto& field) {
    MF_CHECK(j.contains(key), "TransformerConfig: missing '{}'", key);
    try {
      j.at(key).get_to(field);
    } catch (const nlohmann::json::exception&) {
      fail("TransformerConfig: '{}' has the wrong type ({})", key, detail::brief_json(j.at(key)));
    }
  };
  read("src_vocab", config.src_vocab);
  read("tgt_vocab", config.tgt_vocab);
  read("d_model", config.d_model);
  read("heads", config.heads);
  read("encoder_layers", config.encoder_layers);
  read("decoder_layers", config.decoder_layers);
  read("d_ff", config.d_ff);
  read("dropout", config.dropout);
  read("max_len", config.max_len);
  std::string activation;
  read("activation", activation);
  MF_CHECK(activation == "relu" || activation == "gelu", "TransformerConfig: unknown activation '{}'", activation);
  config.activation = activation == "relu" ? nn::Activation::ReLU : nn::Activation::GELU;
  read("pre_norm", config.pre_norm);
  read("shared_embeddings", config.shared_embeddings);
  read("tie_output", config.tie_output);
  read("layer_norm_eps", config.layer_norm_eps);
  read("pad_id", config.pad_id);
  read("freeze_pad_embedding", config.freeze_pad_embedding);
  config.validate();
  return config;
}

// ---- masks --------------------------------------------------------------------------------------

Tensor padding_mask(const Tensor& tokens, int64_t pad_id, DType dtype) {
  MF_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::Int64, "padding_mask: expects int64 tokens [B, S], got {} {}",
           dtype_name(tokens.dtype()), shape_str(tokens.shape()));
  Tensor is_pad = tokens.eq(static_cast<double>(pad_id));                      // [B, S]
  Tensor mask = zeros(tokens.shape(), dtype, tokens.device()).masked_fill(is_pad, kMaskValue);
  return mask.view({tokens.size(0), 1, 1, tokens.size(1)});                    // [B, 1, 1, S]
}

Tensor decoder_mask(const Tensor& tgt_tokens, int64_t pad_id, DType dtype) {
  Tensor causal = causal_mask(tgt_tokens.size(1), dtype, tgt_tokens.device());  // [1, 1, T, T]
  return causal + padding_mask(tgt_tokens, pad_id, dtype);                     // [B, 1, T, T]
}

// ---- layers -------------------------------------------------------------------------------------

namespace {

nn::MultiHeadAttention make_attention(const TransformerConfig& c) {
  return nn::MultiHeadAttention(
      nn::MultiHeadAttentionOptions{.embed_dim = c.d_model, .num_heads = c.heads, .dropout = c.dropout});
}

nn::PositionwiseFeedForward make_ffn(const TransformerConfig& c) {
  return nn::PositionwiseFeedForward(nn::PositionwiseFeedForwardOptions{
      .d_model = c.d_model, .d_ff = c.d_ff, .dropout = c.dropout, .activation = c.activation});
}

nn::LayerNorm make_norm(const TransformerConfig& c) {
  return nn::LayerNorm(nn::LayerNormOptions{.normalized_shape = {c.d_model}, .eps = c.layer_norm_eps});
}

nn::Dropout make_dropout(const TransformerConfig& c) {
  return nn::Dropout(nn::DropoutOptions{.p = c.dropout});
}

/// One residual sub-layer: post-norm norm(x + dropout(f(x))), or pre-norm x + dropout(f(norm(x))).
template <typename F>
Tensor residual(const Tensor& x, nn::LayerNormImpl& norm, nn::DropoutImpl& dropout, bool pre_norm, F sublayer) {
  if (pre_norm) return x + dropout.forward(sublayer(norm.forward(x)));
  return norm.forward(x + dropout.forward(sublayer(x)));
}

}  // namespace

EncoderLayer::EncoderLayer(const TransformerConfig& config) : Module("EncoderLayer"), pre_norm_(config.pre_norm) {
  self_attn = register_module("self_attn", make_attention(config));
  ffn = register_module("ffn", make_ffn(config));
  norm1 = register_module("norm1", make_norm(config));
  norm2 = register_module("norm2", make_norm(config));
  dropout = register_module("dropout", make_dropout(config));
}

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& mask) {
  Tensor h = residual(x, *norm1, *dropout, pre_norm_, [&](const Tensor& in) {
    nn::AttentionOutput a = self_attn->forward(in, in, in, mask, record_attention);
    if (record_attention) attention = a.weights;
    return a.output;
  });
  return residual(h, *norm2, *dropout, pre_norm_, [&](const Tensor& in) { return ffn->forward(in); });
}

void LayerCache::append(const Tensor& k, const Tensor& v) {
  const int64_t added = k.size(2);
  if (!self_v.defined() || length + added > self_v.size(2)) {
    const int64_t capacity = std::max<int64_t>({16, 2 * length, length + added});
    const int64_t N = k.size(0), H = k.size(1), D = k.size(3);
    Tensor keys = Tensor::empty({N, H, D, capacity}, k.dtype(), k.device());    // [N, H, D, capacity]
    Tensor values = Tensor::empty({N, H, capacity, D}, v.dtype(), v.device());  // [N, H, capacity, D]
    if (length > 0) {
      keys.narrow(3, 0, length).copy_(self_kt.narrow(3, 0, length));
      values.narrow(2, 0, length).copy_(self_v.narrow(2, 0, length));
    }
    self_kt = keys;
    self_v = values;
  }
  self_kt.narrow(3, length, added).copy_(k.transpose(2, 3));
  self_v.narrow(2, length, added).copy_(v);
  length += added;
}

void LayerCache::select_rows(const Tensor& index) {
  if (!self_v.defined()) return;
  const int64_t rows = index.numel();
  // `positions` of each row are copied along `positions_dim`.
  auto select = [&](Tensor& buffer, int64_t positions_dim, int64_t positions) {
    Shape shape = buffer.shape();
    shape[0] = rows;
    Tensor kept =
        rows <= buffer.size(0) ? buffer.narrow(0, 0, rows) : Tensor::empty(shape, buffer.dtype(), buffer.device());
    Tensor written = kept.narrow(positions_dim, 0, positions);
    index_select_out(written, buffer.narrow(positions_dim, 0, positions), 0, index);
    buffer = kept;
  };
  // A row of the transposed keys holds its filled positions as H x D runs of `length` floats, one per
  // `capacity`: about as many cache lines as the whole row, which one copy per row moves faster.
  select(self_kt, 3, self_kt.size(3));
  select(self_v, 2, length);
}

void LayerCache::set_cross(const Tensor& k, const Tensor& v) {
  cross_kt = k.transpose(2, 3).contiguous();  // [N / group, H, D, S]
  cross_v = v;
}

DecoderLayer::DecoderLayer(const TransformerConfig& config) : Module("DecoderLayer"), pre_norm_(config.pre_norm) {
  self_attn = register_module("self_attn", make_attention(config));
  cross_attn = register_module("cross_attn", make_attention(config));
  ffn = register_module("ffn", make_ffn(config));
  norm1 = register_module("norm1", make_norm(config));
  norm2 = register_module("norm2", make_norm(config));
  norm3 = register_module("norm3", make_norm(config));
  dropout = register_module("dropout", make_dropout(config));
}

Tensor DecoderLayer::forward(const Tensor& y, const Tensor& memory, const Tensor& self_mask, const Tensor& cross_mask,
                             LayerCache* cache) {
  Tensor h = residual(y, *norm1, *dropout, pre_norm_, [&](const Tensor& in) {
    if (!cache) {
      nn::AttentionOutput a = self_attn->forward(in, in, in, self_mask, record_attention);
      if (record_attention) self_attention = a.weights;
      return a.output;
    }
    auto [k, v] = self_attn->project_key_value(in, in);  // [N, H, t_new, D]
    cache->append(k, v);
    nn::AttentionOutput a =
        self_attn->attend(self_attn->project_query(in), cache->keys(), cache->values(), self_mask, record_attention);
    if (record_attention) self_attention = a.weights;
    return a.output;
  });
  h = residual(h, *norm2, *dropout, pre_norm_, [&](const Tensor& in) {
    if (!cache) {
      nn::AttentionOutput a = cross_attn->forward(in, memory, memory, cross_mask, record_attention);
      if (record_attention) cross_attention = a.weights;
      return a.output;
    }
    MF_CHECK(cache->cross_kt.defined(), "DecoderLayer: a cache needs its cross-attention keys and values");
    // The `group` rows of one sentence attend together over its keys: [N, t, C] -> [N / g, g * t, C].
    const int64_t rows = in.size(0), t = in.size(1), g = cache->group;
    Tensor q = cross_attn->project_query(in.reshape({rows / g, g * t, in.size(2)}));  // [N / g, H, g * t, D]
    nn::AttentionOutput a = cross_attn->attend(q, cache->cross_keys(), cache->cross_v, cross_mask, record_attention);
    if (a.weights.defined()) {  // [N / g, H, g * t, S] -> [N, H, t, S]
      const int64_t H = a.weights.size(1), S = a.weights.size(3);
      a.weights = a.weights.reshape({rows / g, H, g, t, S}).permute({0, 2, 1, 3, 4}).reshape({rows, H, t, S});
    }
    if (record_attention) cross_attention = a.weights;
    return a.output.reshape(in.shape());  // [N, t, C]
  });
  return residual(h, *norm3, *dropout, pre_norm_, [&](const Tensor& in) { return ffn->forward(in); });
}

// ---- stacks -------------------------------------------------------------------------------------

Encoder::Encoder(const TransformerConfig& config) : Module("Encoder") {
  auto list = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < config.encoder_layers; ++i) {
    layers.push_back(std::make_shared<EncoderLayer>(config));
    list->push_back(layers.back());
  }
  if (config.pre_norm) norm = register_module("norm", make_norm(config));
}

Tensor Encoder::forward(const Tensor& x, const Tensor& mask) {
  Tensor h = x;
  for (auto& layer : layers) h = layer->forward(h, mask);
  return norm ? norm->forward(h) : h;
}

Decoder::Decoder(const TransformerConfig& config) : Module("Decoder") {
  auto list = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < config.decoder_layers; ++i) {
    layers.push_back(std::make_shared<DecoderLayer>(config));
    list->push_back(layers.back());
  }
  if (config.pre_norm) norm = register_module("norm", make_norm(config));
}

Tensor Decoder::forward(const Tensor& y, const Tensor& memory, const Tensor& self_mask, const Tensor& cross_mask,
                        std::vector<LayerCache>* caches) {
  MF_CHECK(!caches || caches->size() == layers.size(), "Decoder: {} caches for {} layers", caches ? caches->size() : 0,
           layers.size());
  Tensor h = y;
  for (size_t i = 0; i < layers.size(); ++i)
    h = layers[i]->forward(h, memory, self_mask, cross_mask, caches ? &(*caches)[i] : nullptr);
  return norm ? norm->forward(h) : h;
}

// ---- model --------------------------------------------------------------------------------------

Transformer::Transformer(const TransformerConfig& config) : Module("Transformer"), config_(config) {
  config.validate();
  auto embedding = [&](int64_t vocab) {
    nn::EmbeddingOptions options{.num_embeddings = vocab, .embedding_dim = config.d_model};
    if (config.freeze_pad_embedding) options.padding_idx = config.pad_id;
    auto module = nn::Embedding(options);
    // N(0, C^-1/2) keeps embedding * sqrt(C) at unit scale, as in the reference implementations.
    NoGradGuard no_grad;
    module->weight.mul_(1.0 / std::sqrt(static_cast<double>(config.d_model)));
    return module;
  };
  if (config.shared_embeddings) {
    src_embed_ = tgt_embed_ = register_module("embed", embedding(config.src_vocab));
  } else {
    src_embed_ = register_module("src_embed", embedding(config.src_vocab));
    tgt_embed_ = register_module("tgt_embed", embedding(config.tgt_vocab));
  }
  positions_ = register_module("positions", nn::PositionalEncoding(
                                                nn::PositionalEncodingOptions{.d_model = config.d_model,
                                                                              .max_len = config.max_len}));
  dropout_ = register_module("dropout", make_dropout(config));
  encoder = register_module("encoder", std::make_shared<Encoder>(config));
  decoder = register_module("decoder", std::make_shared<Decoder>(config));
  if (!config.tie_output)
    output_proj_ = register_module("output_proj", nn::Linear(nn::LinearOptions{
                                                      .in_features = config.d_model,
                                                      .out_features = config.tgt_vocab,
                                                      .bias = false}));
}

namespace {

Tensor embed_scaled(nn::EmbeddingImpl& embedding, nn::PositionalEncodingImpl& positions, nn::DropoutImpl& dropout,
                    const Tensor& tokens, int64_t start, int64_t d_model) {
  MF_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::Int64, "Transformer: expects int64 tokens [B, L], got {} {}",
           dtype_name(tokens.dtype()), shape_str(tokens.shape()));
  Tensor x = embedding.forward(tokens) * std::sqrt(static_cast<double>(d_model));  // [B, L, C]
  return dropout.forward(positions.forward(x, start));
}

}  // namespace

Tensor Transformer::embed_source(const Tensor& tokens) {
  return embed_scaled(*src_embed_, *positions_, *dropout_, tokens, 0, config_.d_model);
}

Tensor Transformer::embed_target(const Tensor& tokens, int64_t start) {
  return embed_scaled(*tgt_embed_, *positions_, *dropout_, tokens, start, config_.d_model);
}

Tensor Transformer::project_output(const Tensor& states) {
  if (output_proj_) return output_proj_->forward(states);
  if (tgt_embed_->is_quantized()) return linear_int8(states, tgt_embed_->quantized_weight());  // rows: channels
  return matmul(states, tgt_embed_->weight.t());  // [..., C] @ [C, V]: the transpose is a GEMM flag
}

Transformer::OutputRows Transformer::output_rows(const std::vector<int64_t>& ids) {
  NoGradGuard no_grad;
  const int64_t vocabulary = config_.tgt_vocab;
  for (size_t column = 0; column < ids.size(); ++column)
    MF_CHECK(ids[column] >= 0 && ids[column] < vocabulary && (column == 0 || ids[column] > ids[column - 1]),
             "Transformer::output_rows: ids must ascend within the target vocabulary [0, {}); id {} at {} does not",
             vocabulary, ids[column], column);
  const Tensor index = from_vector(ids, {static_cast<int64_t>(ids.size())}, device());
  OutputRows rows;
  const bool tied = !output_proj_;
  rows.weight = index_select(tied ? tgt_embed_->weight : output_proj_->weight, 0, index);
  if (tied ? tgt_embed_->is_quantized() : output_proj_->is_quantized())
    rows.scales = index_select(tied ? tgt_embed_->weight_scale : output_proj_->weight_scale, 0, index);
  if (!tied && output_proj_->bias.defined()) rows.bias = index_select(output_proj_->bias, 0, index);
  return rows;
}

Tensor Transformer::project_output(const Tensor& states, const OutputRows& rows) {
  // Each logit is one row of the weight times the state, as in the whole product.
  return rows.scales.defined() ? linear_int8(states, {rows.weight, rows.scales}, rows.bias)
         : rows.bias.defined() ? linear(states, rows.weight, rows.bias)
                               : matmul(states, rows.weight.t());
}

Tensor Transformer::encode(const Tensor& src) {
  Tensor x = embed_source(src);                                   // [B, S, C]
  return encoder->forward(x, padding_mask(src, config_.pad_id, x.dtype()));
}

Tensor Transformer::decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src) {
  Tensor y = embed_target(tgt_in);                                // [B, T, C]
  Tensor self_mask = decoder_mask(tgt_in, config_.pad_id, y.dtype());  // [B, 1, T, T]
  Tensor cross_mask = padding_mask(src, config_.pad_id, y.dtype());    // [B, 1, 1, S]
  return project_output(decoder->forward(y, memory, self_mask, cross_mask));  // [B, T, V]
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt_in) {
  MF_CHECK(src.dim() == 2 && tgt_in.dim() == 2 && src.size(0) == tgt_in.size(0),
           "Transformer: source {} and target {} must be [B, S] and [B, T] with the same B", shape_str(src.shape()),
           shape_str(tgt_in.shape()));
  return decode(tgt_in, encode(src), src);
}

Tensor Transformer::cross_attention(const Tensor& src, const Tensor& tgt_in, int64_t layer) {
  MF_CHECK(src.dim() == 2 && tgt_in.dim() == 2 && src.size(0) == tgt_in.size(0),
           "Transformer::cross_attention: source {} and target {} must be [B, S] and [B, T] with the same B",
           shape_str(src.shape()), shape_str(tgt_in.shape()));
  MF_CHECK(layer >= 1 && layer <= config_.decoder_layers,
           "Transformer::cross_attention: layer {} is not one of the decoder's {} layers (1-based)", layer,
           config_.decoder_layers);
  const Tensor memory = encode(src);
  Tensor y = embed_target(tgt_in);
  const Tensor self_mask = decoder_mask(tgt_in, config_.pad_id, y.dtype());
  const Tensor cross_mask = padding_mask(src, config_.pad_id, y.dtype());
  DecoderLayer& chosen = *decoder->layers[static_cast<size_t>(layer - 1)];
  struct Recording {  // the chosen layer records for this pass only, whatever happens in it
    DecoderLayer& layer;
    bool before;
    ~Recording() { layer.record_attention = before; }
  } recording{chosen, std::exchange(chosen.record_attention, true)};
  for (int64_t i = 0; i < layer; ++i)
    y = decoder->layers[static_cast<size_t>(i)]->forward(y, memory, self_mask, cross_mask);
  return chosen.cross_attention;
}

Tensor Transformer::loss(const Tensor& logits, const Tensor& tgt_out, double label_smoothing) const {
  MF_CHECK(logits.dim() == 3 && tgt_out.dim() == 2 && logits.size(0) == tgt_out.size(0) &&
               logits.size(1) == tgt_out.size(1),
           "Transformer::loss: logits {} do not match targets {}", shape_str(logits.shape()), shape_str(tgt_out.shape()));
  return cross_entropy(logits.reshape({-1, logits.size(2)}), tgt_out.reshape({-1}), config_.pad_id, label_smoothing);
}

Device Transformer::device() const { return src_embed_->weight.device(); }

void Transformer::set_record_attention(bool on) {
  for (auto& layer : encoder->layers) layer->record_attention = on;
  for (auto& layer : decoder->layers) layer->record_attention = on;
}

bool Transformer::records_attention() const {
  return std::any_of(encoder->layers.begin(), encoder->layers.end(), [](auto& l) { return l->record_attention; }) ||
         std::any_of(decoder->layers.begin(), decoder->layers.end(), [](auto& l) { return l->record_attention; });
}

std::vector<std::pair<std::string, Tensor>> Transformer::attention_weights() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < encoder->layers.size(); ++i)
    out.emplace_back(fmt::format("encoder.layers.{}.self_attn", i), encoder->layers[i]->attention);
  for (size_t i = 0; i < decoder->layers.size(); ++i) {
    out.emplace_back(fmt::format("decoder.layers.{}.self_attn", i), decoder->layers[i]->self_attention);
    out.emplace_back(fmt::format("decoder.layers.{}.cross_attn", i), decoder->layers[i]->cross_attention);
  }
  return out;
}

// ---- incremental decoding ---------------------------------------------------------------------

TransformerDecoder::TransformerDecoder(Transformer& model, const Tensor& src, std::vector<int64_t> output_ids)
    : model_(model), output_ids_(std::move(output_ids)) {
  NoGradGuard no_grad;
  if (!output_ids_.empty()) output_rows_ = model.output_rows(output_ids_);
  Tensor tokens = src.to(model.device());
  Tensor memory = model.encode(tokens);                                    // [B, S, C]
  src_mask_ = padding_mask(tokens, model.config().pad_id, memory.dtype());  // [B, 1, 1, S]
  caches_.resize(model.decoder->layers.size());
  for (size_t i = 0; i < caches_.size(); ++i) {
    auto [k, v] = model.decoder->layers[i]->cross_attn->project_key_value(memory, memory);  // [B, H, S, D] each
    caches_[i].set_cross(k, v);
  }
  source_of_row_.resize(static_cast<size_t>(src.size(0)));
  std::iota(source_of_row_.begin(), source_of_row_.end(), int64_t{0});
}

Tensor TransformerDecoder::step(const Tensor& tokens) {
  NoGradGuard no_grad;
  const auto rows = static_cast<int64_t>(source_of_row_.size());
  MF_CHECK(tokens.dim() == 1 && tokens.size(0) == rows, "TransformerDecoder::step: expects {} tokens, got shape {}",
           rows, shape_str(tokens.shape()));
  Tensor y = model_.embed_target(tokens.to(src_mask_.device()).view({-1, 1}), position_);  // [N, 1, C]
  // No self-attention mask: the cache holds only past positions, all of them visible.
  Tensor h = model_.decoder->forward(y, Tensor(), Tensor(), src_mask_, &caches_);        // [N, 1, C]
  ++position_;
  // [N, V], or [N, K] for a shortlist's K ids.
  return (output_ids_.empty() ? model_.project_output(h) : model_.project_output(h, output_rows_)).squeeze(1);
}

void TransformerDecoder::select_rows(const Tensor& index) {
  NoGradGuard no_grad;
  const std::vector<int64_t> rows = index.to_vector<int64_t>();
  std::vector<int64_t> sources;
  for (int64_t row : rows) {
    MF_CHECK(row >= 0 && row < static_cast<int64_t>(source_of_row_.size()),
             "TransformerDecoder::select_rows: row {} is out of range for {} rows", row, source_of_row_.size());
    sources.push_back(source_of_row_[static_cast<size_t>(row)]);
  }
  // The new rows in runs of one sentence: runs of equal length keep one copy of the sentence state
  // per run (found through the run's first row); otherwise every row gets its own.
  const int64_t old_group = caches_.front().group;
  std::vector<int64_t> positions;  // of the current per-sentence entries, one per run
  int64_t group = 0;
  bool equal_runs = true;
  for (size_t first = 0, last = 0; first < rows.size(); first = last) {
    while (last < rows.size() && sources[last] == sources[first]) ++last;
    positions.push_back(rows[first] / old_group);
    const auto run = static_cast<int64_t>(last - first);
    equal_runs = equal_runs && (group == 0 || run == group);
    group = run;
  }
  if (!equal_runs) {
    positions.clear();
    for (int64_t row : rows) positions.push_back(row / old_group);
    group = 1;
  }
  select_sentences(positions, std::max<int64_t>(group, 1));

  const Tensor picked = index.to(src_mask_.device());
  for (LayerCache& cache : caches_) cache.select_rows(picked);
  source_of_row_ = std::move(sources);
}

void TransformerDecoder::select_sentences(const std::vector<int64_t>& positions, int64_t group) {
  for (LayerCache& cache : caches_) cache.group = group;
  bool unchanged = static_cast<int64_t>(positions.size()) == src_mask_.size(0);
  for (size_t i = 0; unchanged && i < positions.size(); ++i) unchanged = positions[i] == static_cast<int64_t>(i);
  if (unchanged) return;
  const Tensor picked = from_vector(positions, {static_cast<int64_t>(positions.size())}, src_mask_.device());
  src_mask_ = index_select(src_mask_, 0, picked);
  for (LayerCache& cache : caches_) {
    cache.cross_kt = index_select(cache.cross_kt, 0, picked);
    cache.cross_v = index_select(cache.cross_v, 0, picked);
  }
}

generation::GreedyResult greedy_decode(Transformer& model, const Tensor& src, const generation::GreedyOptions& options) {
  TransformerDecoder decoder(model, src);
  return generation::greedy_decode(decoder, src.size(0), options);
}

std::vector<std::vector<generation::Hypothesis>> beam_search(Transformer& model, const Tensor& src,
                                                             const generation::BeamOptions& options) {
  TransformerDecoder decoder(model, src);
  return generation::beam_search(decoder, src.size(0), options);
}

}  // namespace mf::models
