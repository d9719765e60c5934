// MultiHeadAttention, PositionwiseFeedForward and PositionalEncoding: naive loops, hand-evaluated
// formulas, gradchecks, and PyTorch's numbers from the shared reference file.
//
// Axes: B = batch, T = target length, S = source length, C = embed dim, H = heads, D = head dim.
#include <doctest/doctest.h>

#include "helpers.h"
#include "reference.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

using namespace mf;
using mf::testing::check_close;

namespace {

using Vec = std::vector<double>;

/// out[r, o] = sum_i x[r, i] weight[o, i] + bias[o] for `rows` rows: the naive nn.Linear.
Vec naive_linear(const Vec& x, int64_t rows, const Tensor& weight, const Tensor& bias) {
  int64_t out_features = weight.size(0), in_features = weight.size(1);
  Vec w = weight.to_vector<double>(), b = bias.to_vector<double>(), out(static_cast<size_t>(rows * out_features));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_features; ++o) {
      double acc = b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in_features; ++i)
        acc += x[static_cast<size_t>(r * in_features + i)] * w[static_cast<size_t>(o * in_features + i)];
      out[static_cast<size_t>(r * out_features + o)] = acc;
    }
  return out;
}

struct NaiveAttention {
  Vec output;   // [B, T, C]
  Vec weights;  // [B, H, T, S]
};

/// One query's attention over S keys from the paper's formula, in float64: the weights softmax over s of
/// (sum_d product(s, d)) / sqrt(D) + mask(s), and the output sum_s weight(s) value(s, d).
struct NaiveRow {
  Vec weights;  // [S]
  Vec output;   // [D]
};
NaiveRow naive_attention_row(int64_t S, int64_t D, const std::function<double(int64_t, int64_t)>& product,
                             const std::function<double(int64_t)>& mask,
                             const std::function<double(int64_t, int64_t)>& value) {
  NaiveRow row{Vec(static_cast<size_t>(S)), Vec(static_cast<size_t>(D))};
  double largest = -INFINITY, total = 0;
  for (int64_t s = 0; s < S; ++s) {
    double score = 0;
    for (int64_t d = 0; d < D; ++d) score += product(s, d);
    row.weights[static_cast<size_t>(s)] = score / std::sqrt(static_cast<double>(D)) + mask(s);
    largest = std::max(largest, row.weights[static_cast<size_t>(s)]);
  }
  for (double& e : row.weights) total += (e = std::exp(e - largest));
  for (int64_t s = 0; s < S; ++s) {
    double& weight = row.weights[static_cast<size_t>(s)];
    weight /= total;
    for (int64_t d = 0; d < D; ++d) row.output[static_cast<size_t>(d)] += weight * value(s, d);
  }
  return row;
}

/// Multi-head attention written out element by element from the paper's formula, with the module's
/// separate projection weights: softmax(Q K^T / sqrt(D) + mask(b, t, s)) V per head, then out_proj.
NaiveAttention naive_attention(const nn::MultiHeadAttentionImpl& mha, const Tensor& query, const Tensor& memory,
                               const std::function<double(int64_t, int64_t, int64_t)>& mask) {
  int64_t B = query.size(0), T = query.size(1), S = memory.size(1), C = query.size(2);
  int64_t H = mha.options().num_heads, D = C / H;
  Vec xq = query.to_vector<double>(), xkv = memory.to_vector<double>();
  Vec q = naive_linear(xq, B * T, mha.q_proj->weight, mha.q_proj->bias);   // [B, T, C]
  Vec k = naive_linear(xkv, B * S, mha.k_proj->weight, mha.k_proj->bias);  // [B, S, C]
  Vec v = naive_linear(xkv, B * S, mha.v_proj->weight, mha.v_proj->bias);  // [B, S, C]
  Vec context(static_cast<size_t>(B * T * C)), weights(static_cast<size_t>(B * H * T * S));
  auto at = [](const Vec& m, int64_t row, int64_t col, int64_t width) {
    return m[static_cast<size_t>(row * width + col)];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        NaiveRow row = naive_attention_row(
            S, D,
            [&](int64_t s, int64_t d) { return at(q, b * T + t, h * D + d, C) * at(k, b * S + s, h * D + d, C); },
            [&](int64_t s) { return mask(b, t, s); },
            [&](int64_t s, int64_t d) { return at(v, b * S + s, h * D + d, C); });
        std::copy(row.weights.begin(), row.weights.end(), weights.begin() + ((b * H + h) * T + t) * S);
        std::copy(row.output.begin(), row.output.end(), context.begin() + (b * T + t) * C + h * D);
      }
  return {naive_linear(context, B * T, mha.out_proj->weight, mha.out_proj->bias), weights};
}

std::vector<std::string> names(const nn::Module& module) {
  std::vector<std::string> out;
  for (const nn::NamedTensor& entry : module.named_parameters()) out.push_back(entry.name);
  return out;
}

/// A float64 attention with weights drawn by the default initialisation from a fixed seed.
std::shared_ptr<nn::MultiHeadAttentionImpl> make_attention(const nn::MultiHeadAttentionOptions& options, uint64_t seed) {
  manual_seed(seed);
  auto mha = std::make_shared<nn::MultiHeadAttentionImpl>(options);
  mha->to(DType::Float64);
  return mha;
}

/// Copies separate q/k/v projections into a fused module's in_proj (rows: query, key, value).
void copy_into_fused(const nn::MultiHeadAttentionImpl& separate, nn::MultiHeadAttentionImpl& fused) {
  NoGradGuard no_grad;
  fused.in_proj->weight.copy_(cat({separate.q_proj->weight, separate.k_proj->weight, separate.v_proj->weight}));
  fused.in_proj->bias.copy_(cat({separate.q_proj->bias, separate.k_proj->bias, separate.v_proj->bias}));
  fused.out_proj->weight.copy_(separate.out_proj->weight);
  fused.out_proj->bias.copy_(separate.out_proj->bias);
}

/// An additive key-padding mask [B, 1, 1, S]: -1e9 where `padding` (bool [B, S]) is true, else 0.
Tensor padding_mask(const Tensor& padding) {
  int64_t B = padding.size(0), S = padding.size(1);
  return zeros({B, 1, 1, S}, DType::Float64, padding.device()).masked_fill(padding.view({B, 1, 1, S}), -1e9);
}

}  // namespace

// ---- MultiHeadAttention -------------------------------------------------------------------------

TEST_CASE("MultiHeadAttention parameters are named as in PyTorch-style checkpoints") {
  nn::MultiHeadAttentionImpl separate({.embed_dim = 8, .num_heads = 2});
  CHECK(names(separate) == std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                                      "v_proj.weight", "v_proj.bias", "out_proj.weight",
                                                      "out_proj.bias"});
  nn::MultiHeadAttentionImpl fused({.embed_dim = 8, .num_heads = 2, .bias = false, .fused_qkv = true});
  CHECK(names(fused) == std::vector<std::string>{"in_proj.weight", "out_proj.weight"});
  CHECK(fused.in_proj->weight.shape() == Shape{24, 8});
  CHECK(separate.head_dim() == 4);
}

TEST_CASE("MultiHeadAttention matches a naive loop, with a key-padding mask") {
  auto mha = make_attention({.embed_dim = 6, .num_heads = 2}, 11);
  manual_seed(12);
  Tensor query = randn({2, 3, 6}, DType::Float64), memory = randn({2, 4, 6}, DType::Float64);
  // Batch 1 pads its last key.
  Tensor padding = from_vector<int64_t>({0, 0, 0, 0, 0, 0, 0, 1}, {2, 4}).eq(1.0);
  NaiveAttention expected =
      naive_attention(*mha, query, memory, [](int64_t b, int64_t, int64_t s) { return b == 1 && s == 3 ? -1e9 : 0.0; });
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    mha->to(device);
    Tensor q = query.to(device), m = memory.to(device);
    nn::AttentionOutput out = mha->forward(q, m, m, padding_mask(padding.to(device)), true);
    check_close(out.output, from_vector(expected.output, {2, 3, 6}), 1e-12, 1e-12);
    check_close(out.weights, from_vector(expected.weights, {2, 2, 3, 4}), 1e-12, 1e-12);
    CHECK_FALSE(mha->forward(q, m, m).weights.defined());
  }
}

TEST_CASE("attention rows sum to 1 and masked positions get probability 0") {
  auto mha = make_attention({.embed_dim = 8, .num_heads = 4}, 21);
  Tensor x = randn({3, 5, 8}, DType::Float64);
  Tensor causal = triu(full({1, 1, 5, 5}, -1e9, DType::Float64), 1);  // [1, 1, T, T]: -1e9 above the diagonal
  Tensor weights = mha->forward(x, x, x, causal, true).weights;       // [B, H, T, S]
  REQUIRE(weights.shape() == Shape{3, 4, 5, 5});
  check_close(weights.sum({-1}), ones({3, 4, 5}, DType::Float64), 1e-12, 1e-12);
  std::vector<double> w = weights.to_vector<double>();
  double above = 0, below = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    int64_t t = static_cast<int64_t>(i / 5 % 5), s = static_cast<int64_t>(i % 5);
    (s > t ? above : below) += w[i];
  }
  CHECK(above == 0.0);  // exp(-1e9) underflows to exactly 0
  CHECK(below == doctest::Approx(3 * 4 * 5));
}

TEST_CASE("a float64 mask serves a float32 module") {
  auto mha = make_attention({.embed_dim = 4, .num_heads = 2}, 25);
  Tensor x = randn({2, 3, 4}, DType::Float64);
  Tensor mask = padding_mask(from_vector<int64_t>({0, 0, 1, 0, 0, 0}, {2, 3}).eq(1.0));  // float64 [B, 1, 1, S]
  Tensor expected = mha->forward(x, x, x, mask).output;
  mha->to(DType::Float32);
  Tensor x32 = x.to(DType::Float32);
  Tensor got = mha->forward(x32, x32, x32, mask).output;
  CHECK(got.dtype() == DType::Float32);
  check_close(got.to(DType::Float64), expected, 1e-5, 1e-6);
}

TEST_CASE("fused and separate projections give the same output") {
  auto separate = make_attention({.embed_dim = 8, .num_heads = 2}, 31);
  auto fused = make_attention({.embed_dim = 8, .num_heads = 2, .fused_qkv = true}, 32);
  copy_into_fused(*separate, *fused);
  Tensor x = randn({2, 3, 8}, DType::Float64), memory = randn({2, 4, 8}, DType::Float64);
  Tensor value = randn({2, 4, 8}, DType::Float64);
  SUBCASE("self-attention: one GEMM for q, k and v") {
    check_close(fused->forward(x, x, x).output, separate->forward(x, x, x).output, 1e-12, 1e-12);
  }
  SUBCASE("cross-attention: key and value share one GEMM") {
    check_close(fused->forward(x, memory, memory).output, separate->forward(x, memory, memory).output, 1e-12, 1e-12);
  }
  SUBCASE("query, key and value all different") {
    check_close(fused->forward(x, memory, value).output, separate->forward(x, memory, value).output, 1e-12, 1e-12);
  }
}

TEST_CASE("the project / attend steps serve one decoding step over all keys") {
  // The last query position attending over every key (what a KV cache computes) equals the last row
  // of causal self-attention over the whole sequence.
  auto mha = make_attention({.embed_dim = 8, .num_heads = 2}, 41);
  Tensor x = randn({2, 4, 8}, DType::Float64);
  Tensor causal = triu(full({1, 1, 4, 4}, -1e9, DType::Float64), 1);
  Tensor full_out = mha->forward(x, x, x, causal).output;  // [B, T, C]
  auto [k, v] = mha->project_key_value(x, x);                // [B, H, S, D] each
  Tensor q_last = mha->project_query(x.narrow(1, 3, 1));     // [B, H, 1, D]
  Tensor step = mha->attend(q_last, k, v).output;            // [B, 1, C]
  check_close(step, full_out.narrow(1, 3, 1).contiguous(), 1e-12, 1e-12);
}

TEST_CASE("few queries against keys kept by column, as a decoding cache keeps them, match naive loops") {
  // The fused op's direct path for up to 8 queries reads keys laid out [B, H, D, S] and takes each
  // row of scores, and of outputs, in vectors whose last one overlaps its neighbour: every width of
  // row from 1 to 40 (and head dims that are not whole vectors) against float64 loops of the formula.
  // The queries of a head are summed side by side in groups (of 4 on AVX-512, 2 on AVX2) and the rest
  // alone: 1, 2 and 5 queries take each, and a query's bits must not depend on its group.
  manual_seed(5);
  struct Case {
    int64_t D, S, T;
  };
  std::vector<Case> cases;
  for (int64_t D : {1, 3, 8, 12, 40})
    for (int64_t S = 1; S <= 40; ++S)
      for (int64_t T : {1, 2, 5}) cases.push_back({D, S, T});
  for (auto [D, S, T] : cases) {
    CAPTURE(D);
    CAPTURE(S);
    CAPTURE(T);
    const int64_t H = 2;
    Tensor q = randn({1, H, T, D}), keys_by_column = randn({1, H, D, S}), v = randn({1, H, S, D});
    AttentionResult got = scaled_dot_product_attention_with_weights(q, keys_by_column.transpose(2, 3), v);
    Vec qs = q.to_vector<double>(), ks = keys_by_column.to_vector<double>(), vs = v.to_vector<double>();
    Vec weights(static_cast<size_t>(H * T * S)), output(static_cast<size_t>(H * T * D));
    auto element = [](const Vec& m, int64_t at) { return m[static_cast<size_t>(at)]; };
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        NaiveRow row = naive_attention_row(
            S, D,
            [&](int64_t s, int64_t d) { return element(qs, (h * T + t) * D + d) * element(ks, (h * D + d) * S + s); },
            [](int64_t) { return 0.0; }, [&](int64_t s, int64_t d) { return element(vs, (h * S + s) * D + d); });
        std::copy(row.weights.begin(), row.weights.end(), weights.begin() + (h * T + t) * S);
        std::copy(row.output.begin(), row.output.end(), output.begin() + (h * T + t) * D);
      }
    check_close(got.weights, from_vector(weights, {1, H, T, S}).to(DType::Float32), 1e-5, 1e-6);
    check_close(got.output, from_vector(output, {1, H, T, D}).to(DType::Float32), 1e-5, 1e-5);
    for (int64_t t = 0; t < T; ++t) {
      AttentionResult alone =
          scaled_dot_product_attention_with_weights(q.narrow(2, t, 1), keys_by_column.transpose(2, 3), v);
      CHECK(alone.output.to_vector<float>() == got.output.narrow(2, t, 1).to_vector<float>());
      CHECK(alone.weights.to_vector<float>() == got.weights.narrow(2, t, 1).to_vector<float>());
    }
  }
}

TEST_CASE("attention dropout acts in training only; the returned weights are the probabilities") {
  auto mha = make_attention({.embed_dim = 8, .num_heads = 2, .dropout = 0.5}, 51);
  auto plain = make_attention({.embed_dim = 8, .num_heads = 2}, 51);  // same seed, same weights
  Tensor x = randn({2, 6, 8}, DType::Float64);
  nn::AttentionOutput train = mha->forward(x, x, x, {}, true);
  check_close(train.weights.sum({-1}), ones({2, 2, 6}, DType::Float64), 1e-12, 1e-12);
  Tensor reference = plain->forward(x, x, x).output;
  CHECK((train.output - reference).abs().max().item<double>() > 1e-3);
  mha->eval();
  check_close(mha->forward(x, x, x).output, reference, 0, 0);
}

// The fused op against the composition it replaces (matmul, scale, mask, softmax, dropout, matmul),
// both drawing dropout from generators of one seed: same values, same gradients.
TEST_CASE("scaled_dot_product_attention matches its composition of ops, dropout and weights' gradient included") {
  const int64_t B = 2, H = 3, T = 4, S = 6, D = 5;
  Tensor mask = randn({B, 1, T, S}, DType::Float64);
  mask.narrow(3, S - 2, 2).fill_(-1e9);  // padding over the last two keys
  for (double p : {0.0, 0.3}) {
    CAPTURE(p);
    manual_seed(7);
    Tensor q = randn({B, H, T, D}, DType::Float64).set_requires_grad(),
           k = randn({B, H, S, D}, DType::Float64).set_requires_grad(),
           v = randn({B, H, S, D}, DType::Float64).set_requires_grad();
    Tensor dout = randn({B, H, T, D}, DType::Float64), dweights = randn({B, H, T, S}, DType::Float64);
    Generator fused_stream(11), composed_stream(11);
    AttentionResult fused = scaled_dot_product_attention_with_weights(q, k, v, mask, p, &fused_stream);
    autograd::backward({fused.output, fused.weights}, {dout, dweights});
    std::vector<Tensor> fused_grads = {q.grad(), k.grad(), v.grad()};
    for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());

    Tensor weights = softmax(matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D)) + mask, -1);
    Tensor output = matmul(dropout(weights, p, true, &composed_stream), v);
    autograd::backward({output, weights}, {dout, dweights});
    check_close(fused.output, output, 1e-12, 1e-12);
    check_close(fused.weights, weights, 1e-12, 1e-12);
    check_close(fused_grads[0], q.grad(), 1e-10, 1e-12);
    check_close(fused_grads[1], k.grad(), 1e-10, 1e-12);
    check_close(fused_grads[2], v.grad(), 1e-10, 1e-12);
    CHECK(fused_stream.offset() == composed_stream.offset());
    // Heads are interleaved in the output's memory: merging them for the output projection is a view.
    CHECK(fused.output.transpose(1, 2).is_contiguous());
  }
}

// A loss on the weights alone: no gradient reaches the output, and the op's backward rule, which
// takes undefined gradients (OpDef::takes_undefined_grads), stands in a zero dout itself.
TEST_CASE("scaled_dot_product_attention with a gradient on its weights only matches its composition") {
  const int64_t B = 2, H = 2, T = 3, S = 4, D = 5;
  Tensor q = randn({B, H, T, D}, DType::Float64).set_requires_grad(),
         k = randn({B, H, S, D}, DType::Float64).set_requires_grad(),
         v = randn({B, H, S, D}, DType::Float64).set_requires_grad();
  Tensor mask = randn({B, 1, T, S}, DType::Float64), dweights = randn({B, H, T, S}, DType::Float64);
  AttentionResult fused = scaled_dot_product_attention_with_weights(q, k, v, mask);
  autograd::backward({fused.weights}, {dweights});
  std::vector<Tensor> fused_grads = {q.grad(), k.grad()};
  // v only reaches the output: one op for both outputs, the fused path gives it a zero gradient
  // where the composition gives none.
  check_close(v.grad(), zeros({B, H, S, D}, DType::Float64), 0, 0);
  for (Tensor* t : {&q, &k}) t->set_grad(Tensor());

  Tensor weights = softmax(matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D)) + mask, -1);
  autograd::backward({weights}, {dweights});
  check_close(fused_grads[0], q.grad(), 1e-10, 1e-12);
  check_close(fused_grads[1], k.grad(), 1e-10, 1e-12);
}

// The fused op does not differentiate the mask: called directly with a mask to learn, it refuses;
// the public function composes ops for such a mask, whose gradient then matches the formula
// dmask = sum over broadcast dims of W * (dW - rowsum(dW * W)) (softmax's backward, unscaled).
TEST_CASE("a mask that needs a gradient: the op refuses it, scaled_dot_product_attention composes ops") {
  Tensor q = randn({1, 2, 3, 4}, DType::Float64), k = randn({1, 2, 5, 4}, DType::Float64),
         v = randn({1, 2, 5, 4}, DType::Float64);
  Tensor mask = zeros({1, 1, 3, 5}, DType::Float64).set_requires_grad();
  CHECK_THROWS_WITH_AS(call<OpId::attention>({q, k, v, mask}),
                       doctest::Contains("attention: does not differentiate attn_mask [1, 1, 3, 5]"), Error);
  AttentionResult a = scaled_dot_product_attention_with_weights(q, k, v, mask);
  a.output.sum().backward();
  REQUIRE(mask.grad().defined());
  NoGradGuard no_grad;
  Tensor dw = matmul(ones({1, 2, 3, 4}, DType::Float64), v.transpose(-2, -1));  // d(sum)/dW = 1 V^T
  Tensor expected = (a.weights * (dw - (dw * a.weights).sum({-1}, true))).sum({1}, true);
  check_close(mask.grad(), expected, 1e-10, 1e-12);
}

TEST_CASE("MultiHeadAttention reports bad options and inputs") {
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention({.embed_dim = 10, .num_heads = 3}),
                       "MultiHeadAttention: embed_dim 10 is not divisible by num_heads 3", Error);
  nn::MultiHeadAttentionImpl mha({.embed_dim = 4, .num_heads = 2});
  Tensor x = zeros({2, 3, 4});
  CHECK_THROWS_WITH_AS(mha.forward(zeros({2, 3, 5}), x, x),
                       "MultiHeadAttention: query must be [B, L, 4] (embed_dim 4), got [2, 3, 5]", Error);
  CHECK_THROWS_WITH_AS(mha.forward(x, zeros({1, 3, 4}), zeros({1, 3, 4})),
                       "MultiHeadAttention: query [2, 3, 4] and key [1, 3, 4] have different batch sizes", Error);
  CHECK_THROWS_WITH_AS(mha.forward(x, x, x, zeros({2, 1, 1, 3}, DType::Bool)),
                       doctest::Contains("attn_mask must be an additive float mask"), Error);
  CHECK_THROWS_WITH_AS(mha.forward(x, x, x, zeros({2, 1, 2, 3})),
                       "MultiHeadAttention: attn_mask [2, 1, 2, 3] does not broadcast to [B, H, T, S] = [2, 2, 3, 3]",
                       Error);
}

TEST_CASE("MultiHeadAttention gradcheck over its parameters, separate and fused") {
  for (bool fused : {false, true}) {
    CAPTURE(fused);
    auto mha = make_attention({.embed_dim = 4, .num_heads = 2, .fused_qkv = fused}, 61);
    Tensor x = randn({2, 3, 4}, DType::Float64), memory = randn({2, 2, 4}, DType::Float64);
    Tensor mask = padding_mask(from_vector<int64_t>({0, 0, 0, 1}, {2, 2}).eq(1.0));
    std::string result = autograd::gradcheck(
        [&](const std::vector<Tensor>&) {
          return std::vector<Tensor>{mha->forward(x, memory, memory, mask).output, mha->forward(x, x, x).output};
        },
        mha->parameters());
    CHECK_MESSAGE(result.empty(), result);
  }
}

// ---- PositionwiseFeedForward --------------------------------------------------------------------

TEST_CASE("PositionwiseFeedForward is linear2(act(linear1(x))), ReLU or GELU") {
  for (nn::Activation activation : {nn::Activation::ReLU, nn::Activation::GELU}) {
    CAPTURE(static_cast<int>(activation));
    manual_seed(71);
    nn::PositionwiseFeedForwardImpl ffn({.d_model = 4, .d_ff = 6, .activation = activation});
    CHECK(names(ffn) == std::vector<std::string>{"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"});
    ffn.to(DType::Float64);
    Tensor x = randn({2, 3, 4}, DType::Float64);
    Vec hidden = naive_linear(x.to_vector<double>(), 6, ffn.linear1->weight, ffn.linear1->bias);
    for (double& h : hidden)  // relu, or exact GELU x * Phi(x) = x * erfc(-x / sqrt(2)) / 2
      h = activation == nn::Activation::ReLU ? std::max(h, 0.0) : h * 0.5 * std::erfc(-h / std::sqrt(2.0));
    Vec expected = naive_linear(hidden, 6, ffn.linear2->weight, ffn.linear2->bias);
    check_close(ffn.forward(x), from_vector(expected, {2, 3, 4}), 1e-12, 1e-12);
    std::string result = autograd::gradcheck(
        [&](const std::vector<Tensor>&) { return std::vector<Tensor>{ffn.forward(x)}; }, ffn.parameters());
    CHECK_MESSAGE(result.empty(), result);
  }
}

// ---- PositionalEncoding -------------------------------------------------------------------------

TEST_CASE("PositionalEncoding's table follows the sinusoid formula") {
  for (int64_t d_model : {6, 5}) {  // an odd width ends on a sine column
    CAPTURE(d_model);
    nn::PositionalEncodingImpl encoding({.d_model = d_model, .max_len = 10});
    CHECK(encoding.parameters().empty());
    REQUIRE(encoding.named_buffers().size() == 1);
    CHECK(encoding.named_buffers()[0].name == "pe");
    CHECK(encoding.pe.shape() == Shape{10, d_model});
    for (int64_t p : {0, 1, 7, 9})
      for (int64_t j = 0; j < d_model; ++j) {
        // PE[p, 2i] = sin(p / 10000^(2i / d)), PE[p, 2i + 1] = cos(p / 10000^(2i / d)).
        double exponent = static_cast<double>(j - j % 2) / static_cast<double>(d_model);
        double angle = static_cast<double>(p) / std::pow(10000.0, exponent);
        double expected = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
        CHECK(encoding.pe.at<double>({p, j}) == doctest::Approx(expected).epsilon(1e-12));
      }
  }
  // Hand-evaluated spot values for d = 6: PE[1, 0] = sin(1), PE[1, 3] = cos(1 / 10000^(2/6)) = cos(1 / 21.544).
  nn::PositionalEncodingImpl six({.d_model = 6, .max_len = 2});
  CHECK(six.pe.at<double>({1, 0}) == doctest::Approx(0.8414709848078965));
  CHECK(six.pe.at<double>({1, 3}) == doctest::Approx(0.9989229760406304));
}

TEST_CASE("PositionalEncoding adds the rows from start and keeps the input's dtype") {
  nn::PositionalEncodingImpl encoding({.d_model = 4, .max_len = 6});
  Tensor x = ones({2, 3, 4});
  Tensor y = encoding.forward(x, 2);
  CHECK(y.dtype() == DType::Float32);
  // ones + PE[start : start + 3], the same rows for both batch entries.
  auto expected = [&](int64_t start) {
    Tensor rows = encoding.pe.narrow(0, start, 3).to(DType::Float32) + 1.0;  // [T, C]
    return rows.unsqueeze(0).expand({2, 3, 4}).contiguous();                // [B, T, C]
  };
  check_close(y, expected(2), 0, 0);
  check_close(encoding.forward(x), expected(0), 0, 0);
  CHECK_THROWS_WITH_AS(encoding.forward(x, 4),
                       "PositionalEncoding: positions 4 to 6 (start 4 + length 3) exceed max_len 6", Error);
  CHECK_THROWS_WITH_AS(encoding.forward(zeros({2, 3, 5})),
                       "PositionalEncoding: input must be [B, T, 4] (d_model 4), got [2, 3, 5]", Error);
}

// ---- against PyTorch ----------------------------------------------------------------------------

namespace {

/// The reference's post-norm encoder layer built from this file's modules, under its names.
class ReferenceEncoderLayer : public nn::Module {
 public:
  ReferenceEncoderLayer() : Module("ReferenceEncoderLayer") {
    self_attn = register_module("self_attn", std::make_shared<nn::MultiHeadAttentionImpl>(
                                                 nn::MultiHeadAttentionOptions{.embed_dim = 16, .num_heads = 2}));
    ffn = register_module("ffn", std::make_shared<nn::PositionwiseFeedForwardImpl>(
                                     nn::PositionwiseFeedForwardOptions{.d_model = 16, .d_ff = 32}));
    norm1 = register_module("norm1", std::make_shared<nn::LayerNormImpl>(nn::LayerNormOptions{.normalized_shape = {16}}));
    norm2 = register_module("norm2", std::make_shared<nn::LayerNormImpl>(nn::LayerNormOptions{.normalized_shape = {16}}));
  }
  std::shared_ptr<nn::MultiHeadAttentionImpl> self_attn;
  std::shared_ptr<nn::PositionwiseFeedForwardImpl> ffn;
  std::shared_ptr<nn::LayerNormImpl> norm1, norm2;
};

}  // namespace

TEST_CASE("encoder attention matches PyTorch on the reference batch") {
  const std::map<std::string, Tensor>& ref = testing::reference_tensors();

  // Source embedding as the reference README describes: embed.weight[src] * sqrt(16) + PE[position].
  Tensor src = ref.at("input.src");  // [B, S] = [3, 5], PAD = 0
  int64_t B = src.size(0), S = src.size(1);
  Tensor x = index_select(ref.at("param.embed.weight"), 0, src.flatten()).view({B, S, 16}) * 4.0;  // [B, S, C]
  nn::PositionalEncodingImpl encoding({.d_model = 16, .max_len = 16});
  x = encoding.forward(x);
  Tensor mask = padding_mask(src.eq(0.0));  // [B, 1, 1, S]

  SUBCASE("layer 0 attention probabilities") {
    nn::MultiHeadAttentionImpl mha({.embed_dim = 16, .num_heads = 2});
    mha.to(DType::Float64);
    mha.load_state_dict(testing::reference_with_prefix("param.encoder.layers.0.self_attn."));
    Tensor weights = mha.forward(x, x, x, mask, true).weights;  // [B, H, S, S]
    check_close(weights, ref.at("expected.attn.encoder.layers.0.self_attn"), 1e-10, 1e-12);
  }
  SUBCASE("both post-norm encoder layers: attention of layer 1 and the encoder output") {
    // x = LayerNorm(x + attention(x)); x = LayerNorm(x + ffn(x)), twice (README, "The model").
    for (int layer = 0; layer < 2; ++layer) {
      ReferenceEncoderLayer block;
      block.to(DType::Float64);
      block.load_state_dict(testing::reference_with_prefix(fmt::format("param.encoder.layers.{}.", layer)));
      nn::AttentionOutput attn = block.self_attn->forward(x, x, x, mask, true);
      check_close(attn.weights, ref.at(fmt::format("expected.attn.encoder.layers.{}.self_attn", layer)), 1e-10, 1e-12);
      x = block.norm1->forward(x + attn.output);
      x = block.norm2->forward(x + block.ffn->forward(x));
    }
    check_close(x, ref.at("expected.encoder_out"), 1e-10, 1e-10);
  }
}

TEST_CASE("causal attention in nn: causal_mask by hand, is_causal, and a causal layer in a Sequential") {
  // causal_mask(3): row t is 0 up to column t and kMaskValue after, worked out by hand.
  Tensor mask = nn::causal_mask(3, DType::Float64);
  CHECK(mask.shape() == Shape{1, 1, 3, 3});
  const double m = nn::kMaskValue;
  CHECK(mask.to_vector<double>() == std::vector<double>{0, m, m, 0, 0, m, 0, 0, 0});

  manual_seed(3);
  nn::MultiHeadAttentionImpl attention({.embed_dim = 8, .num_heads = 2});
  Tensor x = randn({2, 5, 8});
  Tensor causal = attention.forward(x, x, x, {}, false, true).output;
  // The same as the explicit mask, and with a key-padding mask on top the two add.
  check_close(causal, attention.forward(x, x, x, nn::causal_mask(5)).output, 0, 0);
  Tensor padding = zeros({2, 1, 1, 5});
  padding.narrow(3, 4, 1).fill_(nn::kMaskValue);
  check_close(attention.forward(x, x, x, padding, false, true).output,
              attention.forward(x, x, x, nn::causal_mask(5) + padding).output, 0, 0);
  // Position t does not see the future: changing the last two positions leaves rows 0-2 alone,
  // while without is_causal they move.
  Tensor changed = x.clone();
  changed.narrow(1, 3, 2).copy_(randn({2, 2, 8}));
  Tensor after = attention.forward(changed, changed, changed, {}, false, true).output;
  check_close(after.narrow(1, 0, 3), causal.narrow(1, 0, 3), 0, 0);
  Tensor open = attention.forward(x, x, x).output, open_after = attention.forward(changed, changed, changed).output;
  CHECK((open_after.narrow(1, 0, 3) - open.narrow(1, 0, 3)).abs().max().item<float>() > 1e-3f);

  // A causal self-attention layer sits in a Sequential, which calls forward(x).
  auto layer = std::make_shared<nn::MultiHeadAttentionImpl>(nn::MultiHeadAttentionOptions{
      .embed_dim = 8, .num_heads = 2, .dropout = 0, .bias = true, .fused_qkv = false, .causal = true});
  nn::Sequential stack(layer, nn::ReLU());
  check_close(stack(x), layer->forward(x, x, x, {}, false, true).output.relu(), 0, 0);

  CHECK_THROWS_WITH_AS(attention.forward(x, randn({2, 4, 8}), randn({2, 4, 8}), {}, false, true),
                       doctest::Contains("is_causal needs as many queries as keys, got query [2, 5, 8] and key [2, 4, 8]"),
                       Error);
}
