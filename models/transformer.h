// The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017): the model
// zoo's first entry.
//
// Axes: B = batch, S = source length, T = target length, C = d_model, H = heads, V = vocabulary.
//
// Parameter names (dotted paths, as PyTorch tutorials and ../shared/reference name them):
//   embed.weight                                  shared source/target embedding [V, C] (shared_embeddings)
//   src_embed.weight, tgt_embed.weight            separate embeddings otherwise
//   output_proj.weight                            output projection [V, C] when not tied to the embedding
//   encoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias}
//   encoder.layers.{i}.ffn.linear{1,2}.{weight,bias}, encoder.layers.{i}.norm{1,2}.{weight,bias}
//   decoder.layers.{i}.{self_attn,cross_attn}.*, decoder.layers.{i}.ffn.*, decoder.layers.{i}.norm{1,2,3}.*
//   encoder.norm.*, decoder.norm.*                final LayerNorms, pre-norm only
#pragma once

#include "models/generation.h"
#include "nn/attention.h"
#include "nn/feed_forward.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/positional_encoding.h"
#include "text/special_tokens.h"

#include <memory>
#include <string>
#include <vector>

namespace mf::models {

struct TransformerConfig {
  int64_t src_vocab = 0;
  int64_t tgt_vocab = 0;
  int64_t d_model = 512;         // C
  int64_t heads = 8;             // H
  int64_t encoder_layers = 6;
  int64_t decoder_layers = 6;
  int64_t d_ff = 2048;
  double dropout = 0.1;
  int64_t max_len = 512;         // longest sequence the positional table covers (at most kMaxLen)
  nn::Activation activation = nn::Activation::ReLU;
  /// false: the paper's post-norm, x = LayerNorm(x + sublayer(x)); true: pre-norm,
  /// x = x + sublayer(LayerNorm(x)) with a final LayerNorm after each stack.
  bool pre_norm = false;
  /// One embedding for source, target and output (needs src_vocab == tgt_vocab).
  bool shared_embeddings = true;
  /// Output projection = target embedding (transposed), no bias.
  bool tie_output = true;
  double layer_norm_eps = 1e-5;
  /// The padding token: masked out of attention and ignored by the loss.
  int64_t pad_id = text::kPadId;
  /// Keep the embedding's pad row zero and without gradient (nn.Embedding's padding_idx). Off by
  /// default, as in the PyTorch tutorials: padding is masked out of attention and the loss anyway.
  bool freeze_pad_embedding = false;

  /// The largest max_len accepted: the positional table is built up front ([max_len, C] float64)
  /// and no checkpoint pays for it, so a corrupt config must not be able to ask for gigabytes.
  static constexpr int64_t kMaxLen = 65536;

  /// Throws mf::Error naming the first inconsistent field.
  void validate() const;
  /// Elements in the state_dict of Transformer(*this), worked out without building it (so a loader
  /// can see what a config would cost first). Validates; throws mf::Error past 2^63 - 1.
  int64_t parameter_count() const;
  std::string to_json() const;
  static TransformerConfig from_json(const std::string& json);
};

/// Additive attention masks (0 = attend, nn::kMaskValue = do not), built once per batch and shared
/// by every layer; nn::causal_mask is the causal one.
using nn::causal_mask;
using nn::kMaskValue;
/// Keys that are not padding: tokens [B, S] -> [B, 1, 1, S].
Tensor padding_mask(const Tensor& tokens, int64_t pad_id, DType dtype);
/// The decoder's self-attention mask: causal and not padding, [B, 1, T, T].
Tensor decoder_mask(const Tensor& tgt_tokens, int64_t pad_id, DType dtype);

class EncoderLayer : public nn::Module {
 public:
  explicit EncoderLayer(const TransformerConfig& config);
  /// x [B, S, C], mask broadcastable to [B, H, S, S] -> [B, S, C].
  Tensor forward(const Tensor& x, const Tensor& mask);

  nn::MultiHeadAttention self_attn{nullptr};
  nn::PositionwiseFeedForward ffn{nullptr};
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::Dropout dropout{nullptr};
  Tensor attention;  // [B, H, S, S] from the last forward that recorded attention
  bool record_attention = false;

 private:
  bool pre_norm_;
};

/// One decoder layer's key/value cache for incremental decoding. The self-attention keys and values
/// live in buffers with room to spare (capacity doubles when full), so a step writes only its own
/// positions instead of copying the whole prefix. The cross-attention keys and values are computed
/// once per source sentence and shared by the `group` consecutive rows that decode it (a sentence's
/// beams), so choosing among a sentence's beams never copies them. Keys are stored transposed (D
/// before the positions), which attention reads in place when few queries come at a time.
struct LayerCache {
  Tensor self_kt;   // [N, H, D, capacity]: keys transposed; positions [0, length) are filled
  Tensor self_v;    // [N, H, capacity, D]
  int64_t length = 0;
  Tensor cross_kt;  // [N / group, H, D, S]: keys transposed
  Tensor cross_v;   // [N / group, H, S, D]
  int64_t group = 1;  // rows per source: row r attends over the cross keys and values of r / group

  /// Appends k, v [N, H, t_new, D] at position `length`.
  void append(const Tensor& k, const Tensor& v);
  /// Keeps the self-attention rows `index` (row i becomes row index[i]; on the caches' device), moved
  /// within the buffers while the rows fit them (beam search reorders and drops rows at every step),
  /// else into new buffers of the same capacity; of the values only the filled positions.
  void select_rows(const Tensor& index);
  /// Sets the cross-attention keys and values, k, v [N / group, H, S, D].
  void set_cross(const Tensor& k, const Tensor& v);
  /// The filled positions, [N, H, length, D] views.
  Tensor keys() const { return self_kt.narrow(3, 0, length).transpose(2, 3); }
  Tensor values() const { return self_v.narrow(2, 0, length); }
  /// The cross-attention keys, a [N / group, H, S, D] view.
  Tensor cross_keys() const { return cross_kt.transpose(2, 3); }
};

class DecoderLayer : public nn::Module {
 public:
  explicit DecoderLayer(const TransformerConfig& config);
  /// y [B, T, C] over memory [B, S, C]; self_mask broadcastable to [B, H, T, T], cross_mask to
  /// [B, H, T, S]. With a cache, y holds only the new positions and their keys/values are appended
  /// to the cache (self_mask may then be undefined: every cached position is in the past), memory is
  /// not read (the cache holds its keys and values) and cross_mask is per source, [N / group, 1, 1, S].
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& self_mask, const Tensor& cross_mask,
                 LayerCache* cache = nullptr);

  nn::MultiHeadAttention self_attn{nullptr}, cross_attn{nullptr};
  nn::PositionwiseFeedForward ffn{nullptr};
  nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  nn::Dropout dropout{nullptr};
  Tensor self_attention, cross_attention;  // from the last forward that recorded attention
  bool record_attention = false;

 private:
  bool pre_norm_;
};

/// The encoder stack: layers "layers.{i}", and with pre-norm a final "norm".
class Encoder : public nn::Module {
 public:
  explicit Encoder(const TransformerConfig& config);
  Tensor forward(const Tensor& x, const Tensor& mask);
  std::vector<std::shared_ptr<EncoderLayer>> layers;
  nn::LayerNorm norm{nullptr};  // pre-norm only
};

/// The decoder stack: layers "layers.{i}", and with pre-norm a final "norm".
class Decoder : public nn::Module {
 public:
  explicit Decoder(const TransformerConfig& config);
  /// With caches (one per layer), y holds only new positions (see DecoderLayer::forward).
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& self_mask, const Tensor& cross_mask,
                 std::vector<LayerCache>* caches = nullptr);
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  nn::LayerNorm norm{nullptr};  // pre-norm only
};

class Transformer : public nn::Module {
 public:
  explicit Transformer(const TransformerConfig& config);

  /// Logits [B, T, V] for source tokens [B, S] and decoder inputs [B, T] (<sos> + target, shifted).
  Tensor forward(const Tensor& src, const Tensor& tgt_in);
  /// Encoder output [B, S, C] for source tokens [B, S].
  Tensor encode(const Tensor& src);
  /// Decoder logits [B, T, V]: target tokens [B, T] over the encoder output for `src`.
  Tensor decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src);
  /// Label-smoothed cross-entropy of logits [B, T, V] against targets [B, T], padding ignored, mean
  /// over the non-padding targets.
  Tensor loss(const Tensor& logits, const Tensor& tgt_out, double label_smoothing) const;

  /// tokens [B, L] -> embedding * sqrt(C) + positional encoding from `start`, then dropout.
  Tensor embed_source(const Tensor& tokens);
  Tensor embed_target(const Tensor& tokens, int64_t start = 0);
  /// Decoder states [..., C] -> logits [..., V].
  Tensor project_output(const Tensor& states);

  /// The output projection's rows for some target ids only (a lexical shortlist's: text::Lexicon).
  struct OutputRows {
    Tensor weight;  // [K, C]: float, or int8 values
    Tensor scales;  // [K] float32 where the weight is int8, else undefined
    Tensor bias;    // [K], or undefined
  };
  /// The rows of the target ids `ids` (ascending, each once, in [0, V)), on the model's device; throws
  /// mf::Error naming an id out of order or range.
  OutputRows output_rows(const std::vector<int64_t>& ids);
  /// Decoder states [..., C] -> the logits of `rows`' ids alone, [..., K]: project_output's bits on
  /// miniflow's GEMMs, which sum each element in one order whatever the columns beside it (OpenBLAS,
  /// on the baseline path, to rounding).
  Tensor project_output(const Tensor& states, const OutputRows& rows);

  /// Decoder layer `layer`'s (1-based) cross-attention probabilities [B, H, T, S] for source tokens
  /// [B, S] and decoder inputs [B, T], as forward would record them; the layers above it and the output
  /// projection do not run.
  Tensor cross_attention(const Tensor& src, const Tensor& tgt_in, int64_t layer);
  /// Keep every layer's attention probabilities after each forward (off by default: it costs memory).
  /// A layer that does not record leaves what it last recorded as it is, so that decoding workers
  /// sharing the model never write to it; while any layer records, decode_sources runs one worker.
  void set_record_attention(bool on);
  /// Whether any layer records its attention probabilities.
  bool records_attention() const;
  /// Each attention module's probabilities from the last forward that recorded them, [B, H, *, *],
  /// keyed by the module's path in state_dict: "encoder.layers.{i}.self_attn",
  /// "decoder.layers.{i}.self_attn" and "decoder.layers.{i}.cross_attn".
  std::vector<std::pair<std::string, Tensor>> attention_weights() const;

  const TransformerConfig& config() const { return config_; }
  /// The device of the model's parameters (to() moves all of them together): where inputs built on
  /// the host (token ids, masks) must go.
  Device device() const;

  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;

 private:
  TransformerConfig config_;
  nn::Embedding src_embed_{nullptr}, tgt_embed_{nullptr};  // the same module when shared
  nn::Linear output_proj_{nullptr};               // empty when tied
  nn::PositionalEncoding positions_{nullptr};
  nn::Dropout dropout_{nullptr};
};

/// Incremental decoding of a Transformer (generation::IncrementalDecoder): the sources are encoded
/// once, the cross-attention keys/values are computed once per layer and sentence, and each step
/// appends one position to every layer's self-attention cache, so a new token costs O(prefix), not a
/// full decoder run. While the rows come in equal runs per sentence (greedy search's one row each, beam
/// search's beam_size), a run's queries attend together over its sentence's keys and values, which are
/// copied only when sentences leave; any other selection falls back to one copy per row. Runs without
/// recording autograd; put the model in eval() mode first for dropout.
class TransformerDecoder : public generation::IncrementalDecoder {
 public:
  /// Starts one row per source sentence (src [B, S] int64, on any device: it is moved to the model's).
  /// With `output_ids` (ascending target ids, each once) the steps score only those (a shortlist: see
  /// Transformer::output_rows; scored_ids()), the other ids having probability 0; empty: the whole
  /// vocabulary.
  TransformerDecoder(Transformer& model, const Tensor& src, std::vector<int64_t> output_ids = {});
  /// tokens [N] -> the next token's logits [N, V], or [N, K] for K output_ids (scores(): the searches
  /// normalise only what they keep).
  Tensor step(const Tensor& tokens) override;
  Scores scores() const override { return Scores::Logits; }
  const std::vector<int64_t>* scored_ids() const override { return output_ids_.empty() ? nullptr : &output_ids_; }
  void select_rows(const Tensor& index) override;

 private:
  /// Keeps the per-sentence state (cross-attention keys/values, source mask) of the sentences at
  /// `positions` of the current ones, in that order, with `group` rows each.
  void select_sentences(const std::vector<int64_t>& positions, int64_t group);

  Transformer& model_;
  Tensor src_mask_;                     // [N / group, 1, 1, S]
  std::vector<LayerCache> caches_;
  std::vector<int64_t> source_of_row_;  // which source sentence each row decodes
  int64_t position_ = 0;
  std::vector<int64_t> output_ids_;     // a shortlist's ids, or none: the whole vocabulary
  Transformer::OutputRows output_rows_;  // their rows (undefined tensors without a shortlist)
};

/// Greedy translation of src [B, S] with the key/value cache (see generation::greedy_decode).
generation::GreedyResult greedy_decode(Transformer& model, const Tensor& src,
                                       const generation::GreedyOptions& options = {});
/// Batched beam search over src [B, S] with the key/value cache (see generation::beam_search).
std::vector<std::vector<generation::Hypothesis>> beam_search(Transformer& model, const Tensor& src,
                                                             const generation::BeamOptions& options = {});

}  // namespace mf::models
