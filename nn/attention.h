// Multi-head attention ("Attention Is All You Need", section 3.2).
//
// Axes: B = batch, T = target (query) length, S = source (key/value) length, C = embed dim
// (d_model), H = heads, D = head dim (C / H).
#pragma once

#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/module.h"
// The feed-forward block and the positional encoding lived in this header until their own; kept
// included for one release, for code that reaches them through it.
#include "nn/feed_forward.h"
#include "nn/kv_cache.h"
#include "nn/positional_encoding.h"

#include <memory>
#include <string>

namespace mf::nn {

/// What an additive attention mask adds where a position must not be attended (0 where it may):
/// finite, so that a fully masked row gives a uniform average instead of NaN.
inline constexpr double kMaskValue = -1e9;

/// Position t may attend to positions <= t: [1, 1, T, T], 0 on and below the diagonal, kMaskValue
/// above (PyTorch's nn.Transformer.generate_square_subsequent_mask, with a finite floor).
Tensor causal_mask(int64_t length, DType dtype = DType::Float32, Device device = Device::cpu());

struct MultiHeadAttentionOptions {
  int64_t embed_dim = 0;  // C
  int64_t num_heads = 1;  // H; must divide embed_dim
  /// Dropout on the attention probabilities (training mode only).
  double dropout = 0.0;
  /// Biases on the four projections.
  bool bias = true;
  /// One in_proj Linear [3C, C] (rows: query, then key, then value) instead of q_proj, k_proj and
  /// v_proj; same math, one GEMM when query, key and value are the same tensor.
  bool fused_qkv = false;
  /// Whether forward(x), self-attention as Sequential calls it, masks future positions.
  bool causal = false;
};

/// What attention returns: the output [B, T, C] and, when asked for, the probabilities [B, H, T, S]
/// per head (before dropout, so rows sum to 1; PyTorch's nn.MultiheadAttention returns them after
/// dropout and averaged over heads by default).
struct AttentionOutput {
  Tensor output;
  Tensor weights;  // undefined unless need_weights
};

/// Multi-head scaled dot-product attention: softmax(Q K^T / sqrt(D) + mask) V per head, heads
/// concatenated and projected by out_proj. Children are Linear(C, C) "q_proj", "k_proj", "v_proj",
/// "out_proj" (or "in_proj" Linear(C, 3C) and "out_proj" with fused_qkv), each with Linear's default
/// initialisation.
///
/// forward is three steps that a key/value cache for incremental decoding can call on their own:
/// project_query, project_key_value (cacheable, and concatenable along S), then attend.
class MultiHeadAttentionImpl : public Module {
 public:
  using Options = MultiHeadAttentionOptions;
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options);
  /// MultiHeadAttention(embed_dim, num_heads), as torch.nn.MultiheadAttention; other options default.
  MultiHeadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : MultiHeadAttentionImpl(MultiHeadAttentionOptions{.embed_dim = embed_dim, .num_heads = num_heads}) {}

  /// query [B, T, C], key and value [B, S, C]; attn_mask an additive float mask (0 to keep, a large
  /// negative value to drop) broadcastable to [B, H, T, S], such as a key padding [B, 1, 1, S], or
  /// undefined for none; it is cast to the scores' dtype. With is_causal (T == S), query t also
  /// attends only to keys <= t: causal_mask(T) is added to attn_mask.
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask = {},
                          bool need_weights = false, bool is_causal = false);
  /// Self-attention of x [B, T, C] -> [B, T, C], causal with options().causal: what Sequential calls.
  /// With a KVCache in use on this thread, x holds only the new positions (see nn/kv_cache.h).
  Tensor forward(const Tensor& x) override;

  /// Queries split into heads: query [B, T, C] -> Q [B, H, T, D].
  Tensor project_query(const Tensor& query) const;
  /// Keys and values split into heads: key, value [B, S, C] -> {K, V}, each [B, H, S, D].
  std::pair<Tensor, Tensor> project_key_value(const Tensor& key, const Tensor& value) const;
  /// Attention of Q [B, H, T, D] over K, V [B, H, S, D] with an optional additive mask, heads merged
  /// and projected by out_proj: output [B, T, C], weights [B, H, T, S] when need_weights.
  AttentionOutput attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                         bool need_weights = false) const;

  const MultiHeadAttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.embed_dim / options_.num_heads; }

  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};  // empty with fused_qkv
  Linear in_proj{nullptr};                                     // only with fused_qkv
  Linear out_proj{nullptr};

 private:
  /// x [B, L, C] through `count` consecutive input projections starting at `first` (0 = query,
  /// 1 = key, 2 = value) -> [B, L, count * C]. Only the fused layout can do more than one at once.
  Tensor in_projection(const Tensor& x, int64_t first, int64_t count) const;
  /// [B, L, C] -> [B, H, L, D].
  Tensor split_heads(const Tensor& x) const;
  /// forward(x) with the keys and values of earlier positions taken from `cache`.
  Tensor forward_cached(const Tensor& x, KVCache& cache);

  MultiHeadAttentionOptions options_;
};
MF_MODULE(MultiHeadAttention);

}  // namespace mf::nn
