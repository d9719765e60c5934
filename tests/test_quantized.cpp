// Int8 quantized inference above the kernel (whose exact sums tests/test_gemm_int8.cpp checks):
// per-channel quantization against its definition, linear_int8 against the float64 product within
// the quantization error bound, the packed-weight cache against in-place changes, and quantized
// Linear and Embedding layers and a Transformer against their float32 selves.
#include <doctest/doctest.h>

#include "helpers.h"
#include "miniflow.h"

#include <cmath>
#include <cstdint>
#include <vector>

using namespace mf;

namespace {

Tensor randn_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Generator generator(seed);
  return randn({rows, cols}, DType::Float32, Device::cpu(), &generator);
}

double largest_gap(const Tensor& a, const Tensor& b) {
  return a.to(DType::Float64).sub(b.to(DType::Float64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("quantize_per_channel: scale max|row| / 63, values rounded, the largest at +-63") {
  // Row 0: max 63, scale 1, multiplier 1: 2.5 is a tie, to even 2; -1.5 to -2. Row 1: max 31.5,
  // scale 0.5, multiplier 2 (both exact): 0.75 -> 1.5 -> 2, 1.25 -> 2.5 -> 2, -31.5 -> -63. Row 2
  // is zero: scale 1, values 0.
  Tensor w = from_vector<float>({2.5f, -1.5f, 63.0f, 0.75f, 1.25f, -31.5f, 0, 0, 0}, {3, 3});
  QuantizedWeight q = quantize_per_channel(w);
  CHECK(q.values.dtype() == DType::Int8);
  CHECK(q.scales.to_vector<float>() == std::vector<float>{1.0f, 0.5f, 1.0f});
  CHECK(q.values.to_vector<int64_t>() == std::vector<int64_t>{2, -2, 63, 2, 2, -63, 0, 0, 0});
  // On random rows: every value within half a step of the weight, and each row's largest at +-63.
  Tensor r = randn_matrix(7, 33, 11);
  QuantizedWeight rq = quantize_per_channel(r);
  std::vector<float> rv = r.to_vector<float>(), scales = rq.scales.to_vector<float>();
  std::vector<float> back = dequantize_per_channel(rq).to_vector<float>();
  std::vector<int64_t> values = rq.values.to_vector<int64_t>();
  for (int64_t j = 0; j < 7; ++j) {
    int64_t largest = 0;
    for (int64_t k = 0; k < 33; ++k) {
      const size_t at = static_cast<size_t>(j * 33 + k);
      CHECK(std::fabs(back[at] - rv[at]) <= scales[j] * 0.5f * 1.0001f);
      largest = std::max<int64_t>(largest, std::abs(values[at]));
    }
    CHECK(largest == 63);
  }
  CHECK_THROWS_WITH_AS(quantize_per_channel(w.to(DType::Float64)), doctest::Contains("expects a float32 CPU weight"),
                       Error);
}

TEST_CASE("linear_int8 stays within the quantization error bound of the float64 product") {
  // With x ~ xs q_x and w ~ ws q_w, each off by at most half a step (xs / 2, ws / 2), a product
  // x w differs from xs q_x ws q_w by at most |x| ws / 2 + |w| xs / 2 + xs ws / 4; summed over k, plus
  // float32's rounding of the epilogue (a few ulps of the result), that bounds each output.
  const int64_t rows = 6, depth = 70, cols = 13;
  Tensor x = randn_matrix(rows, depth, 21), w = randn_matrix(cols, depth, 22), bias = randn_matrix(1, cols, 23).view({cols});
  QuantizedWeight q = quantize_per_channel(w);
  std::vector<float> got = linear_int8(x, q, bias).to_vector<float>();
  std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = bias.to_vector<float>();
  std::vector<float> ws = q.scales.to_vector<float>();
  for (int64_t i = 0; i < rows; ++i) {
    double x_max = 0;
    for (int64_t k = 0; k < depth; ++k) x_max = std::max(x_max, std::fabs(double{xv[i * depth + k]}));
    const double xs = x_max / 127;
    for (int64_t j = 0; j < cols; ++j) {
      double exact = bv[j], bound = 0;
      for (int64_t k = 0; k < depth; ++k) {
        double a = xv[i * depth + k], b = wv[j * depth + k];
        exact += a * b;
        bound += std::fabs(a) * ws[j] / 2 + std::fabs(b) * xs / 2 + xs * ws[j] / 4;
      }
      CAPTURE(i);
      CAPTURE(j);
      CHECK(std::fabs(got[i * cols + j] - exact) <= bound + 1e-5 * (1 + std::fabs(exact)));
    }
  }
}

TEST_CASE("linear_int8 packs a weight once and packs it again after an in-place change") {
  Tensor x = randn_matrix(3, 8, 31);
  QuantizedWeight q = quantize_per_channel(randn_matrix(4, 8, 32));
  Tensor first = linear_int8(x, q);
  CHECK(linear_int8(x, q).to_vector<float>() == first.to_vector<float>());
  // Every value 1, every scale 0.5: each output is x's quantized row sum times x_scale / 2, the
  // same for all four channels.
  q.values.fill_(1);
  q.scales.fill_(0.5);
  std::vector<float> changed = linear_int8(x, q).to_vector<float>();
  QuantizedWeight fresh{.values = q.values.clone(), .scales = q.scales.clone()};
  CHECK(changed == linear_int8(x, fresh).to_vector<float>());
  CHECK(changed != first.to_vector<float>());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 1; j < 4; ++j) CHECK(changed[i * 4 + j] == changed[i * 4]);
}

TEST_CASE("a quantized Linear: int8 state, close to its float32 self, and its outputs' parts bit for bit") {
  manual_seed(5);
  nn::Linear layer(12, 10);
  Tensor x = randn_matrix(4, 12, 41);
  Tensor before = layer->forward(x);
  layer->quantize_int8();
  CHECK(layer->is_quantized());
  CHECK(layer->weight.dtype() == DType::Int8);
  CHECK(!layer->weight.requires_grad());
  nn::StateDict state = layer->state_dict();
  REQUIRE(state.size() == 3);
  CHECK(state[0].name == "weight");
  CHECK(state[2].name == "weight_scale");
  CHECK(layer->extra_repr() == "in_features=12, out_features=10, bias=True, int8");
  Tensor after = layer->forward(x);
  CHECK(largest_gap(after, before) < 0.04);  // the test above's bound comes to at most 0.038 here
  // Each output's sums depend on its own channel only: a part of the outputs equals those columns.
  CHECK(layer->forward_outputs(x, 3, 4).to_vector<float>() == after.narrow(1, 3, 4).contiguous().to_vector<float>());
  // A float32 Linear's parts likewise.
  nn::Linear plain(12, 10);
  CHECK(largest_gap(plain->forward_outputs(x, 3, 4), plain->forward(x).narrow(1, 3, 4)) < 1e-6);
}

TEST_CASE("a quantized Embedding looks up its dequantized rows") {
  manual_seed(6);
  nn::Embedding table(nn::EmbeddingOptions{.num_embeddings = 9, .embedding_dim = 5, .padding_idx = 0});
  Tensor ids = from_vector<int64_t>({3, 0, 8, 3}, {2, 2});
  Tensor before = table->forward(ids);
  table->quantize_int8();
  Tensor after = table->forward(ids);
  CHECK(after.shape() == Shape{2, 2, 5});
  Tensor rows = index_select(dequantize_per_channel(table->quantized_weight()), 0, ids.view({4}));
  CHECK(after.view({4, 5}).to_vector<float>() == rows.to_vector<float>());
  CHECK(after[0][1].to_vector<float>() == std::vector<float>(5, 0.0f));  // the padding row stays zero
  CHECK(largest_gap(after, before) < 0.04);  // N(0, 1) rows: half a step is max|row| / 126
}

TEST_CASE("nn::quantize_int8 quantizes a Transformer's Linear and Embedding layers; its logits stay close") {
  manual_seed(7);
  models::TransformerConfig config{.src_vocab = 11, .tgt_vocab = 11, .d_model = 16, .heads = 2, .encoder_layers = 1,
                                   .decoder_layers = 1, .d_ff = 32, .dropout = 0.0, .max_len = 8};
  models::Transformer model(config);
  model.eval();
  CHECK(!nn::is_quantized_int8(model));
  Tensor src = from_vector<int64_t>({4, 5, 6, 2, 7, 8, 2, 0}, {2, 4});
  Tensor tgt = from_vector<int64_t>({1, 9, 10, 1, 3, 0}, {2, 3});
  Tensor before = model.forward(src, tgt);
  // Encoder: self-attention's q, k, v and out projections, the FFN's 2; decoder: 2 attentions x 4 + 2;
  // one shared embedding.
  CHECK(nn::quantize_int8(model) == 6 + 10 + 1);
  CHECK(nn::quantize_int8(model) == 0);
  CHECK(nn::is_quantized_int8(model));
  Tensor after = model.forward(src, tgt);
  CHECK(after.shape() == before.shape());
  CHECK(largest_gap(after, before) < 0.1);
  CHECK(largest_gap(after, before) > 0);  // the weights really changed
  for (const nn::NamedTensor& p : model.named_parameters())
    if (p.name.ends_with(".weight") && p.name.find("norm") == std::string::npos) {
      CAPTURE(p.name);
      CHECK(p.tensor.dtype() == DType::Int8);
    }
}
