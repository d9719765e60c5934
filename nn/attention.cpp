// Axes: B = batch, T = target (query) length, S = source (key/value) length, C = embed dim,
// H = heads, D = head dim (C / H), L = either T or S.
#include "nn/attention.h"

#include "ops/functional.h"

namespace mf::nn {

Tensor causal_mask(int64_t length, DType dtype, Device device) {
  MF_CHECK(length >= 0, "causal_mask: length {} is negative", length);
  Tensor future = triu(full({length, length}, kMaskValue, dtype, device), 1);  // kMaskValue above the diagonal
  return future.view({1, 1, length, length});                                 // [1, 1, T, T]
}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options)
    : Module("MultiHeadAttention"), options_(options) {
  MF_CHECK(options.embed_dim > 0 && options.num_heads > 0,
           "MultiHeadAttention: embed_dim and num_heads must be positive, got {} and {}", options.embed_dim,
           options.num_heads);
  MF_CHECK(options.embed_dim % options.num_heads == 0,
           "MultiHeadAttention: embed_dim {} is not divisible by num_heads {}", options.embed_dim, options.num_heads);
  MF_CHECK(options.dropout >= 0 && options.dropout <= 1,
           "MultiHeadAttention: dropout has to be between 0 and 1, but got {}", options.dropout);
  int64_t C = options.embed_dim;
  auto make = [&](const char* name, int64_t out) {
    return register_module(name, Linear(LinearOptions{C, out, options.bias}));
  };
  if (options.fused_qkv) {
    in_proj = make("in_proj", 3 * C);
  } else {
    q_proj = make("q_proj", C);
    k_proj = make("k_proj", C);
    v_proj = make("v_proj", C);
  }
  out_proj = make("out_proj", C);
}

Tensor MultiHeadAttentionImpl::in_projection(const Tensor& x, int64_t first, int64_t count) const {
  if (!options_.fused_qkv) {
    MF_CHECK(count == 1, "MultiHeadAttention: separate projections run one at a time (asked for {})", count);
    LinearImpl& projection = *(first == 0 ? q_proj : first == 1 ? k_proj : v_proj);
    return projection.forward(x);  // [B, L, C]
  }
  int64_t C = options_.embed_dim;
  return in_proj->forward_outputs(x, first * C, count * C);  // [B, L, count * C]
}

Tensor MultiHeadAttentionImpl::split_heads(const Tensor& x) const {
  int64_t B = x.size(0), L = x.size(1);
  return x.view({B, L, options_.num_heads, head_dim()})  // [B, L, H, D]
      .transpose(1, 2);                                   // [B, H, L, D]
}

namespace {

void check_input(const char* what, const Tensor& x, int64_t C) {
  MF_CHECK(x.defined() && x.dim() == 3 && x.size(2) == C,
           "MultiHeadAttention: {} must be [B, L, {}] (embed_dim {}), got {}", what, C, C,
           x.defined() ? shape_str(x.shape()) : "an undefined tensor");
}

}  // namespace

Tensor MultiHeadAttentionImpl::project_query(const Tensor& query) const {
  check_input("query", query, options_.embed_dim);
  return split_heads(in_projection(query, 0, 1));  // [B, H, T, D]
}

std::pair<Tensor, Tensor> MultiHeadAttentionImpl::project_key_value(const Tensor& key, const Tensor& value) const {
  check_input("key", key, options_.embed_dim);
  check_input("value", value, options_.embed_dim);
  MF_CHECK(key.size(0) == value.size(0) && key.size(1) == value.size(1),
           "MultiHeadAttention: key {} and value {} must have the same batch and length", shape_str(key.shape()),
           shape_str(value.shape()));
  if (options_.fused_qkv && key.is_same(value)) {
    std::vector<Tensor> kv = chunk(in_projection(key, 1, 2), 2, -1);  // 2 x [B, S, C]
    return {split_heads(kv[0]), split_heads(kv[1])};                   // 2 x [B, H, S, D]
  }
  return {split_heads(in_projection(key, 1, 1)), split_heads(in_projection(value, 2, 1))};  // 2 x [B, H, S, D]
}

AttentionOutput MultiHeadAttentionImpl::attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                           bool need_weights) const {
  int64_t H = options_.num_heads, D = head_dim();
  MF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(1) == H && q.size(3) == D &&
               k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(1) == H && k.size(3) == D,
           "MultiHeadAttentionImpl::attend: expected Q [B, {}, T, {}] and K, V [B, {}, S, {}], got {}, {}, {}", H, D, H,
           D, shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  int64_t B = q.size(0), T = q.size(2), S = k.size(2);
  if (attn_mask.defined()) {  // scaled_dot_product_attention checks these too, in its own words
    MF_CHECK(is_floating(attn_mask.dtype()),
             "MultiHeadAttention: attn_mask must be an additive float mask (0 keeps, a large negative value "
             "drops), got {}",
             dtype_name(attn_mask.dtype()));
    Shape full{B, H, T, S};
    MF_CHECK(broadcasts_to(attn_mask.shape(), full),
             "MultiHeadAttention: attn_mask {} does not broadcast to [B, H, T, S] = {}", shape_str(attn_mask.shape()),
             shape_str(full));
  }
  AttentionResult a =
      scaled_dot_product_attention_with_weights(q, k, v, attn_mask, is_training() ? options_.dropout : 0.0);
  Tensor merged = a.output.transpose(1, 2).reshape({B, T, H * D});  // [B, T, C]: a view on CPU
  return {out_proj->forward(merged), need_weights ? a.weights : Tensor()};
}

AttentionOutput MultiHeadAttentionImpl::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                            const Tensor& attn_mask, bool need_weights, bool is_causal) {
  check_input("query", query, options_.embed_dim);
  check_input("key", key, options_.embed_dim);
  MF_CHECK(query.size(0) == key.size(0), "MultiHeadAttention: query {} and key {} have different batch sizes",
           shape_str(query.shape()), shape_str(key.shape()));
  Tensor mask = attn_mask;
  if (is_causal) {
    MF_CHECK(query.size(1) == key.size(1),
             "MultiHeadAttention: is_causal needs as many queries as keys, got query {} and key {}",
             shape_str(query.shape()), shape_str(key.shape()));
    Tensor causal = causal_mask(query.size(1), query.dtype(), query.device());  // [1, 1, T, T]
    mask = attn_mask.defined() ? causal + attn_mask.to(query.dtype()) : causal;
  }
  if (options_.fused_qkv && query.is_same(key) && key.is_same(value)) {
    std::vector<Tensor> qkv = chunk(in_projection(query, 0, 3), 3, -1);  // 3 x [B, T, C]
    return attend(split_heads(qkv[0]), split_heads(qkv[1]), split_heads(qkv[2]), mask,
                  need_weights);  // Q, K, V each [B, H, T, D]
  }
  auto [k, v] = project_key_value(key, value);  // [B, H, S, D] each
  return attend(project_query(query), k, v, mask, need_weights);
}

Tensor MultiHeadAttentionImpl::forward(const Tensor& x) {
  if (KVCache* cache = KVCache::active()) return forward_cached(x, *cache);
  return forward(x, x, x, {}, false, options_.causal).output;
}

Tensor MultiHeadAttentionImpl::forward_cached(const Tensor& x, KVCache& cache) {
  check_input("x", x, options_.embed_dim);
  KVCache::Entry& entry = cache.entry(this);
  int64_t past = entry.keys.defined() ? entry.keys.size(2) : 0, T = x.size(1);
  MF_CHECK(past == cache.position(),
           "MultiHeadAttention: its key/value cache holds {} positions, but the cache is at position {} (is the "
           "layer called more than once per model call, or the cache advanced by the wrong count?)",
           past, cache.position());
  MF_CHECK(past == 0 || entry.keys.size(0) == x.size(0),
           "MultiHeadAttention: the key/value cache holds {} rows, but x {} has {}", entry.keys.size(0),
           shape_str(x.shape()), x.size(0));
  auto [k, v] = project_key_value(x, x);  // [B, H, T, D] each
  if (past > 0) {
    k = cat({entry.keys, k}, 2);  // [B, H, past + T, D]
    v = cat({entry.values, v}, 2);
  }
  entry.keys = k;
  entry.values = v;
  // New position t (absolute past + t) sees keys up to past + t: rows past .. past + T of the full mask.
  Tensor mask = options_.causal && T > 1 ? causal_mask(past + T, x.dtype(), x.device()).narrow(2, past, T) : Tensor();
  return attend(project_query(x), k, v, mask).output;
}

}  // namespace mf::nn
