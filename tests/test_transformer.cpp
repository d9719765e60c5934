// The Transformer against PyTorch's own numbers (tests/data/transformer_tiny.safetensors, made by
// ../shared/reference/generate.py), its masks, and its configuration.
#include <doctest/doctest.h>

#include "helpers.h"
#include "reference.h"

#include <set>

using namespace mf;
using mf::testing::check_close;
using mf::testing::reference;

namespace {

/// The reference model: vocab 13, d_model 16, 2 heads, 2 + 2 layers, d_ff 32, ReLU, no dropout,
/// post-norm, one shared and tied embedding, PAD 0 (tests/data/README.md, ../shared/reference/README.md).
models::TransformerConfig reference_config() {
  return {.src_vocab = 13, .tgt_vocab = 13, .d_model = 16, .heads = 2, .encoder_layers = 2, .decoder_layers = 2,
          .d_ff = 32, .dropout = 0.0, .max_len = 16};
}

std::shared_ptr<models::Transformer> reference_model(DType dtype, Device device = Device::cpu()) {
  auto model = std::make_shared<models::Transformer>(reference_config());
  model->to(dtype);
  nn::StateDict params = testing::reference_with_prefix("param.");
  for (auto& entry : params) entry.tensor = entry.tensor.to(dtype);
  model->load_state_dict(params);  // strict: the names match PyTorch's one for one
  model->to(device);
  return model;
}

/// The reference model after PyTorch's training steps ("trained." in the reference file), float64, in
/// eval mode.
std::shared_ptr<models::Transformer> trained_reference_model() {
  auto model = std::make_shared<models::Transformer>(reference_config());
  model->to(DType::Float64);
  model->load_state_dict(testing::reference_with_prefix("trained."));
  model->eval();
  return model;
}

}  // namespace

TEST_CASE("masks: padding keys, causal future, and both for the decoder") {
  Tensor tokens = from_vector(std::vector<int64_t>{5, 7, 0, 3, 0, 0}, {2, 3});
  Tensor pad = models::padding_mask(tokens, 0, DType::Float32);
  CHECK(pad.shape() == Shape{2, 1, 1, 3});
  CHECK(pad.to_vector<double>() == std::vector<double>{0, 0, -1e9, 0, -1e9, -1e9});

  Tensor causal = models::causal_mask(3, DType::Float64);
  CHECK(causal.shape() == Shape{1, 1, 3, 3});
  CHECK(causal.to_vector<double>() == std::vector<double>{0, -1e9, -1e9, 0, 0, -1e9, 0, 0, 0});

  // Row t of sentence b may see keys k <= t that are not padding.
  Tensor dec = models::decoder_mask(tokens, 0, DType::Float64);
  CHECK(dec.shape() == Shape{2, 1, 3, 3});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t k = 0; k < 3; ++k) {
        bool keep = k <= t && tokens.at<int64_t>({b, k}) != 0;
        CHECK((dec.at<double>({b, 0, t, k}) == 0) == keep);
      }
}

TEST_CASE("parameter names are PyTorch's, one for one") {
  models::Transformer model(reference_config());
  std::set<std::string> ours, theirs;
  for (const auto& entry : model.state_dict()) ours.insert(entry.name);
  for (const auto& entry : testing::reference_with_prefix("param.")) theirs.insert(entry.name);
  CHECK(ours == theirs);
}

TEST_CASE("forward, attention, loss and every gradient match PyTorch in float64") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    auto model = reference_model(DType::Float64, device);
    model->set_record_attention(true);
    const Tensor src = reference("input.src").to(device), tgt_in = reference("input.tgt_in").to(device),
                 tgt_out = reference("input.tgt_out").to(device);

    check_close(model->encode(src), reference("expected.encoder_out"), 1e-10, 1e-12);
    Tensor logits = model->forward(src, tgt_in);
    check_close(logits, reference("expected.logits"), 1e-10, 1e-12);
    for (int64_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      check_close(model->encoder->layers[i]->attention,
                  reference(fmt::format("expected.attn.encoder.layers.{}.self_attn", i)), 1e-10, 1e-12);
      check_close(model->decoder->layers[i]->self_attention,
                  reference(fmt::format("expected.attn.decoder.layers.{}.self_attn", i)), 1e-10, 1e-12);
      check_close(model->decoder->layers[i]->cross_attention,
                  reference(fmt::format("expected.attn.decoder.layers.{}.cross_attn", i)), 1e-10, 1e-12);
    }
    check_close(model->loss(logits, tgt_out, 0.0), reference("expected.loss_no_smoothing"), 1e-10, 1e-12);
    Tensor loss = model->loss(logits, tgt_out, 0.1);
    check_close(loss, reference("expected.loss"), 1e-10, 1e-12);

    loss.backward();
    for (const auto& [name, param] : model->named_parameters()) {
      CAPTURE(name);
      check_close(param.grad(), reference("grad." + name), 1e-9, 1e-12);
    }
  }
}

TEST_CASE("float32 stays within float32 tolerances of PyTorch's float64 numbers") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    auto model = reference_model(DType::Float32, device);
    Tensor logits = model->forward(reference("input.src").to(device), reference("input.tgt_in").to(device));
    check_close(logits, reference("expected.logits").to(DType::Float32), 1e-5, 1e-5);
    Tensor loss = model->loss(logits, reference("input.tgt_out").to(device), 0.1);
    check_close(loss, reference("expected.loss").to(DType::Float32), 1e-5, 1e-6);
    loss.backward();
    for (const auto& [name, param] : model->named_parameters()) {
      CAPTURE(name);
      check_close(param.grad(), reference("grad." + name).to(DType::Float32), 1e-4, 1e-6);
    }
  }
}

TEST_CASE("attention weights can be read after a forward pass") {
  auto model = reference_model(DType::Float64);
  model->set_record_attention(true);
  model->forward(reference("input.src"), reference("input.tgt_in"));
  auto weights = model->attention_weights();
  REQUIRE(weights.size() == 6);
  CHECK(weights[0].first == "encoder.layers.0.self_attn");
  CHECK(weights[0].second.shape() == Shape{3, 2, 5, 5});
  CHECK(weights[5].first == "decoder.layers.1.cross_attn");
  CHECK(weights[5].second.shape() == Shape{3, 2, 6, 5});
}

TEST_CASE("pre-norm, separate embeddings and an untied output build and train a step") {
  models::TransformerConfig config{.src_vocab = 11, .tgt_vocab = 7, .d_model = 8, .heads = 2, .encoder_layers = 1,
                                   .decoder_layers = 1, .d_ff = 16, .dropout = 0.1, .max_len = 10,
                                   .activation = nn::Activation::GELU, .pre_norm = true,
                                   .shared_embeddings = false, .tie_output = false};
  models::Transformer model(config);
  std::set<std::string> names;
  for (const auto& entry : model.state_dict()) names.insert(entry.name);
  for (const char* name : {"src_embed.weight", "tgt_embed.weight", "output_proj.weight", "encoder.norm.weight",
                           "decoder.norm.bias"})
    CHECK_MESSAGE(names.count(name), name);
  Tensor src = from_vector(std::vector<int64_t>{3, 4, 10, 0}, {2, 2});
  Tensor tgt = from_vector(std::vector<int64_t>{1, 5, 1, 0}, {2, 2});
  Tensor logits = model.forward(src, tgt);
  CHECK(logits.shape() == Shape{2, 2, 7});
  model.loss(logits, tgt, 0.1).backward();
  CHECK(model.decoder->layers[0]->cross_attn->q_proj->weight.grad().defined());
}

TEST_CASE("config: JSON round trip and clear validation errors") {
  models::TransformerConfig config = reference_config();
  config.pre_norm = true;
  config.activation = nn::Activation::GELU;
  models::TransformerConfig back = models::TransformerConfig::from_json(config.to_json());
  CHECK(back.to_json() == config.to_json());

  config.heads = 3;
  CHECK_THROWS_WITH_AS(config.validate(), "TransformerConfig: d_model 16 must be a positive multiple of heads 3",
                       Error);
  models::TransformerConfig separate = reference_config();
  separate.tgt_vocab = 20;
  CHECK_THROWS_WITH_AS(separate.validate(), doctest::Contains("shared embeddings need one vocabulary"), Error);
  CHECK_THROWS_WITH_AS(models::TransformerConfig::from_json("{\"src_vocab\": 5}"),
                       doctest::Contains("missing 'tgt_vocab'"), Error);
  CHECK_THROWS_WITH_AS(models::TransformerConfig::from_json("not json"), doctest::Contains("not a JSON object"), Error);
  // A value nested a million deep is described, not dumped (dumping recursed once per level and
  // overflowed the stack).
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  CHECK_THROWS_WITH_AS(models::TransformerConfig::from_json(R"({"src_vocab": )" + deep + "}"),
                       "TransformerConfig: 'src_vocab' has the wrong type (a JSON array of size 1)", Error);
}

TEST_CASE("config: parameter_count is the state_dict's size, and max_len is bounded") {
  // Against the built model's own state_dict, for every layout switch: pre-norm (final norms),
  // separate embeddings, an untied output projection, no encoder layers.
  std::vector<models::TransformerConfig> configs(5, reference_config());
  configs[1].pre_norm = true;
  configs[2].shared_embeddings = false;
  configs[2].tgt_vocab = 11;
  configs[3].tie_output = false;
  configs[3].shared_embeddings = false;
  configs[4].encoder_layers = 0;
  configs[4].d_ff = 7;
  for (const models::TransformerConfig& config : configs) {
    CAPTURE(config.to_json());
    int64_t numel = 0;
    for (const nn::NamedTensor& entry : models::Transformer(config).state_dict()) numel += entry.tensor.numel();
    CHECK(config.parameter_count() == numel);
  }
  // By hand for the reference config (V 13, C 16, F 32, 2 + 2 layers, shared and tied): embedding
  // 13 * 16 = 208; attention 4 * (16 * 16 + 16) = 1088; FFN 2 * 16 * 32 + 32 + 16 = 1072; norm 32;
  // encoder layer 1088 + 1072 + 2 * 32 = 2224; decoder layer 2 * 1088 + 1072 + 3 * 32 = 3344;
  // 208 + 2 * 2224 + 2 * 3344 = 11344.
  CHECK(reference_config().parameter_count() == 11344);

  models::TransformerConfig huge = reference_config();
  huge.d_model = huge.d_ff = int64_t{1} << 40;  // 4 C^2 per attention alone is 2^82
  CHECK_THROWS_WITH_AS(huge.parameter_count(), doctest::Contains("more than 2^63 - 1 parameters"), Error);
  models::TransformerConfig long_positions = reference_config();
  long_positions.max_len = models::TransformerConfig::kMaxLen + 1;
  CHECK_THROWS_WITH_AS(long_positions.validate(),
                       "TransformerConfig: max_len 65537 is over the limit of 65536 positions", Error);
}

// ---- decoding -------------------------------------------------------------------------------------

namespace {

/// The classic tutorial loop: re-run the whole decoder over the prefix at every step. Slow, but it
/// shares no cache code with TransformerDecoder, which it checks.
class RecomputingDecoder : public generation::IncrementalDecoder {
 public:
  RecomputingDecoder(models::Transformer& model, const Tensor& src) : model_(model), src_(src) {
    NoGradGuard no_grad;
    memory_ = model.encode(src);
  }
  Tensor step(const Tensor& tokens) override {
    NoGradGuard no_grad;
    Tensor column = tokens.view({-1, 1});
    prefix_ = prefix_.defined() ? cat({prefix_, column}, 1) : column;  // [N, t]
    Tensor logits = model_.decode(prefix_, memory_, src_);              // [N, t, V]
    return logits.select(1, -1).log_softmax(-1);                        // [N, V]
  }
  void select_rows(const Tensor& index) override {
    if (prefix_.defined()) prefix_ = index_select(prefix_, 0, index);
    memory_ = index_select(memory_, 0, index);
    src_ = index_select(src_, 0, index);
  }

 private:
  models::Transformer& model_;
  Tensor src_, memory_, prefix_;
};

/// Two beam searches' results: the same hypotheses in the same order, scores equal to rounding.
void check_same_beams(const std::vector<std::vector<generation::Hypothesis>>& x,
                      const std::vector<std::vector<generation::Hypothesis>>& y) {
  REQUIRE(x.size() == y.size());
  for (size_t s = 0; s < x.size(); ++s) {
    REQUIRE(x[s].size() == y[s].size());
    for (size_t h = 0; h < x[s].size(); ++h) {
      CHECK(x[s][h].tokens == y[s][h].tokens);
      CHECK(x[s][h].score == doctest::Approx(y[s][h].score).epsilon(1e-12));
    }
  }
}

/// `tokens` widened with PAD to `width` columns (our greedy stops once every sentence has ended).
Tensor pad_to(const Tensor& tokens, int64_t width) {
  if (tokens.size(1) == width) return tokens;
  return cat({tokens, zeros({tokens.size(0), width - tokens.size(1)}, DType::Int64)}, 1);
}

}  // namespace

TEST_CASE("greedy decoding with the cache reproduces PyTorch's greedy decodes") {
  for (Device device : testing::test_devices())
    for (const char* prefix : {"param.", "trained."}) {
      CAPTURE(device);
      CAPTURE(prefix);
      auto model = std::make_shared<models::Transformer>(reference_config());
      model->to(DType::Float64);
      model->load_state_dict(testing::reference_with_prefix(prefix));
      model->to(device);
      model->eval();
      generation::GreedyResult result =
          models::greedy_decode(*model, reference("input.src").to(device), {.max_new_tokens = 8});
      std::string expected = std::string(prefix) == "param." ? "expected.greedy" : "expected.greedy_trained";
      check_close(pad_to(result.tokens.to(Device::cpu()), 9), reference(expected), 0, 0);
    }
  // The trained model memorised the batch: its decodes are BOS + tgt_out.
  const Tensor& trained = reference("expected.greedy_trained");
  check_close(trained.slice(1, 1, 7), reference("input.tgt_out"), 0, 0);
}

TEST_CASE("cached decoding gives the tokens and scores of full recomputation") {
  auto model = reference_model(DType::Float64);
  model->eval();
  const Tensor& src = reference("input.src");
  models::TransformerDecoder cached(*model, src);
  RecomputingDecoder recomputed(*model, src);
  generation::GreedyResult a = generation::greedy_decode(cached, 3, {.max_new_tokens = 8});
  generation::GreedyResult b = generation::greedy_decode(recomputed, 3, {.max_new_tokens = 8});
  check_close(a.tokens, b.tokens, 0, 0);
  // Same math, different summation lengths (masked keys add exact zeros, but vector lanes split the
  // sums differently): equal to rounding.
  for (size_t i = 0; i < a.log_probs.size(); ++i) CHECK(a.log_probs[i] == doctest::Approx(b.log_probs[i]).epsilon(1e-12));

  models::TransformerDecoder cached_beam(*model, src);
  RecomputingDecoder recomputed_beam(*model, src);
  generation::BeamOptions beam{.beam_size = 3, .max_new_tokens = 8, .nbest = 3};
  check_same_beams(generation::beam_search(cached_beam, 3, beam), generation::beam_search(recomputed_beam, 3, beam));
}

TEST_CASE("any selection of rows, in runs per sentence or not, keeps full recomputation's log-probabilities") {
  // Runs of 2 per sentence (beams forking), a reorder within the runs, a sentence leaving (its state is
  // compacted away), unequal runs (one copy per row), and a reversal out of that layout.
  auto model = reference_model(DType::Float64);
  model->eval();
  const Tensor& src = reference("input.src");  // [3, 5]
  models::TransformerDecoder cached(*model, src);
  RecomputingDecoder recomputed(*model, src);
  const std::vector<std::vector<int64_t>> selections = {
      {0, 0, 1, 1, 2, 2}, {1, 0, 3, 2, 5, 4}, {0, 1, 4, 5}, {0, 2, 2, 3}, {3, 0}};
  std::vector<int64_t> tokens = {1, 1, 1};  // <sos>
  REQUIRE(cached.scores() == generation::IncrementalDecoder::Scores::Logits);
  for (size_t step = 0; step <= selections.size(); ++step) {
    CAPTURE(step);
    Tensor a = cached.step(from_vector(tokens, {static_cast<int64_t>(tokens.size())})).log_softmax(-1);
    Tensor b = recomputed.step(from_vector(tokens, {static_cast<int64_t>(tokens.size())}));
    check_close(a, b, 1e-12, 1e-12);
    if (step == selections.size()) break;
    const std::vector<int64_t>& rows = selections[step];
    Tensor index = from_vector(rows, {static_cast<int64_t>(rows.size())});
    cached.select_rows(index);
    recomputed.select_rows(index);
    tokens.clear();
    for (size_t i = 0; i < rows.size(); ++i) tokens.push_back(4 + static_cast<int64_t>((step * 5 + i) % 9));
  }
}

TEST_CASE("decode_sources sorts and batches by length, then gives each sentence what decoding it alone gives") {
  auto model = trained_reference_model();
  // Sources of different lengths in no order (ids without <eos>), one empty and one past max_len - 1.
  const std::vector<std::vector<int64_t>> sources = {
      {5, 7, 3, 9}, {12, 3}, {6, 8, 11}, {}, {5, 7, 3, 9, 4, 6, 8, 11, 12, 3, 5, 7, 3, 9, 4, 6, 8, 11}, {4}};
  for (int64_t beam : {1, 3}) {
    CAPTURE(beam);
    const models::DecodingOptions options{.beam_size = beam, .max_new_tokens = 8, .nbest = beam};
    std::vector<std::vector<generation::Hypothesis>> alone;
    for (const std::vector<int64_t>& source : sources)
      alone.push_back(models::decode_sources(*model, {source}, options).front());
    struct Batching {
      int64_t tokens, sentences, workers;
    };
    // {1000, 0, 2}: one batch of all six, cut for the two workers (text::split_for_workers). Three
    // threads, so that the workers asked for run whatever the machine's cores.
    testing::ThreadCountGuard restore;
    set_num_threads(3);
    for (Batching batching :
         {Batching{1, 0, 1}, {8, 0, 1}, {1000, 0, 1}, {1000, 2, 1}, {1, 0, 3}, {8, 0, 0}, {1000, 0, 2}}) {
      CAPTURE(batching.tokens);
      CAPTURE(batching.sentences);
      CAPTURE(batching.workers);
      models::DecodingOptions batched = options;
      batched.batch_tokens = batching.tokens;
      batched.batch_sentences = batching.sentences;
      batched.workers = batching.workers;
      const auto together = models::decode_sources(*model, sources, batched);
      REQUIRE(together.size() == sources.size());
      for (size_t i = 0; i < sources.size(); ++i) {
        CAPTURE(i);
        REQUIRE(together[i].size() == alone[i].size());
        for (size_t h = 0; h < alone[i].size(); ++h) {
          CHECK(together[i][h].tokens == alone[i][h].tokens);
          CHECK(together[i][h].score == doctest::Approx(alone[i][h].score).epsilon(1e-12));
        }
      }
    }
  }
  // One sentence alone is what greedy_decode / beam_search make of it, <eos> ending the tokens.
  const Tensor src = from_vector(std::vector<int64_t>{5, 7, 3, 9, 2}, {1, 5});
  generation::GreedyResult greedy = models::greedy_decode(*model, src, {.max_new_tokens = 8});
  const auto decoded = models::decode_sources(*model, {{5, 7, 3, 9}}, {.max_new_tokens = 8});
  std::vector<int64_t> expected;
  for (int64_t t = 1; t < greedy.tokens.size(1); ++t) {
    expected.push_back(greedy.tokens.at<int64_t>({0, t}));
    if (expected.back() == text::kEosId) break;
  }
  CHECK(decoded[0][0].tokens == expected);
  CHECK(decoded[0][0].log_prob == greedy.log_probs[0]);
  CHECK(models::decode_sources(*model, {}, {}).empty());
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, sources, {.batch_tokens = -1}),
                       "decode_sources: batch_tokens must be 0 (by the weights' precision and the search) or "
                       "positive, got -1",
                       Error);
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, sources, {.batch_sentences = -1}),
                       "decode_sources: batch_sentences must be 0 (no cap) or positive, got -1", Error);
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, sources, {.workers = -1}),
                       "decode_sources: workers must be 0 (one per intra-op thread) or positive, got -1", Error);
}

TEST_CASE("forced decoding's log-probabilities are PyTorch's, and sum to its loss without label smoothing") {
  auto model = reference_model(DType::Float64);
  model->eval();
  const Tensor &src = reference("input.src"), &tgt_in = reference("input.tgt_in"), &tgt_out = reference("input.tgt_out");
  const Tensor log_probs = models::target_log_probs(*model, src, tgt_in, tgt_out);  // [3, 6]
  // By hand from PyTorch's logits: log_softmax of each row, the target's entry, 0 at padding.
  const Tensor& logits = reference("expected.logits");  // [3, 6, 13]
  double total = 0;
  int64_t targets = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < 6; ++t) {
      CAPTURE(b);
      CAPTURE(t);
      const int64_t target = tgt_out.at<int64_t>({b, t});
      double expected = 0;
      if (target != text::kPadId) {
        double largest = -INFINITY, sum = 0;
        for (int64_t v = 0; v < 13; ++v) largest = std::max(largest, logits.at<double>({b, t, v}));
        for (int64_t v = 0; v < 13; ++v) sum += std::exp(logits.at<double>({b, t, v}) - largest);
        expected = logits.at<double>({b, t, target}) - largest - std::log(sum);
        ++targets;
      }
      CHECK(log_probs.at<double>({b, t}) == doctest::Approx(expected).epsilon(1e-12));
      total += log_probs.at<double>({b, t});
    }
  CHECK(-total / static_cast<double>(targets) ==
        doctest::Approx(reference("expected.loss_no_smoothing").item<double>()).epsilon(1e-12));
}

TEST_CASE("score_targets gives a translation the log-probability its search found, whatever its batchmates") {
  auto model = trained_reference_model();
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9, 4}, {12, 3}, {6, 8, 11}, {}, {4, 6}};
  // The searches score their hypotheses step by step through the key/value cache; scoring runs each
  // target through the decoder whole: two ways to one number. Hypotheses cut short by the length limit
  // (no <eos>) are left out: scoring ends every target with <eos>.
  std::vector<std::vector<int64_t>> score_sources, targets;
  std::vector<double> found;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto hypotheses =
        models::decode_sources(*model, {sources[i]}, {.beam_size = 3, .max_new_tokens = 8, .nbest = 3});
    for (const generation::Hypothesis& h : hypotheses.front()) {
      if (h.tokens.empty() || h.tokens.back() != text::kEosId) continue;
      score_sources.push_back(sources[i]);
      targets.emplace_back(h.tokens.begin(), h.tokens.end() - 1);
      found.push_back(h.log_prob);
    }
  }
  REQUIRE(targets.size() >= 2 * sources.size());
  targets.push_back({});  // <eos> alone
  score_sources.push_back({5, 7});
  for (const models::ScoringOptions& options :
       {models::ScoringOptions{.batch_tokens = 1}, {.batch_tokens = 20, .batch_sentences = 3}, {}}) {
    CAPTURE(options.batch_tokens);
    const std::vector<models::TargetScore> scores = models::score_targets(*model, score_sources, targets, options);
    REQUIRE(scores.size() == targets.size());
    for (size_t i = 0; i < found.size(); ++i) {
      CAPTURE(i);
      CHECK(scores[i].log_prob == doctest::Approx(found[i]).epsilon(1e-10));
      CHECK(scores[i].token_log_probs.size() == targets[i].size() + 1);
    }
    const models::TargetScore& eos_alone = scores.back();
    REQUIRE(eos_alone.token_log_probs.size() == 1);
    CHECK(eos_alone.log_prob == eos_alone.token_log_probs[0]);
    CHECK(eos_alone.log_prob < 0);
  }
  // A target past max_len - 1 ids is scored on its first max_len - 1, then <eos>.
  std::vector<int64_t> long_target(40, 7), cut(15, 7);
  const auto long_score = models::score_targets(*model, {{5, 7}}, {long_target}).front();
  CHECK(long_score.token_log_probs.size() == 16);
  CHECK(long_score.log_prob ==
        doctest::Approx(models::score_targets(*model, {{5, 7}}, {cut}).front().log_prob).epsilon(1e-12));
  CHECK(models::score_targets(*model, {}, {}).empty());
  CHECK_THROWS_WITH_AS(models::score_targets(*model, {{5}}, {}), "score_targets: 1 sources but 0 targets", Error);
  CHECK_THROWS_WITH_AS(models::score_targets(*model, {{5}, {6}}, {{4}, {4, 0, 5}}),
                       "score_targets: target 1 holds <pad> (id 0) at position 1", Error);
  CHECK_THROWS_WITH_AS(models::score_targets(*model, {{5}}, {{6}}, {.batch_tokens = 0}),
                       "score_targets: batch_tokens must be positive, got 0", Error);
}

TEST_CASE("target_cross_attention gives each pair a decoder layer's cross-attention, as the pair alone gives it") {
  auto model = trained_reference_model();
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9, 4}, {12, 3}, {6, 8, 11}, {}, {4, 6}};
  const std::vector<std::vector<int64_t>> targets = {{4, 10, 6, 7, 8}, {3}, {9, 5, 12}, {7}, {}};
  // The reference: each pair alone (no padding, no batchmates) through the whole Transformer::forward,
  // whose attention matches PyTorch's (above), averaged over the heads by hand.
  auto alone = [&](size_t pair, int64_t layer) {
    std::vector<int64_t> src = sources[pair], tgt_in = {text::kSosId};
    src.push_back(text::kEosId);
    tgt_in.insert(tgt_in.end(), targets[pair].begin(), targets[pair].end());
    NoGradGuard no_grad;
    model->set_record_attention(true);
    model->forward(from_vector(src, {1, static_cast<int64_t>(src.size())}),
                   from_vector(tgt_in, {1, static_cast<int64_t>(tgt_in.size())}));
    model->set_record_attention(false);
    const Tensor heads = model->decoder->layers[static_cast<size_t>(layer - 1)]->cross_attention.select(0, 0);
    return (heads.select(0, 0) + heads.select(0, 1)) / 2.0;
  };
  for (int64_t layer : {1, 2, -1}) {
    for (const models::ScoringOptions& batching :
         {models::ScoringOptions{.batch_tokens = 1}, {.batch_tokens = 20, .batch_sentences = 3}, {}}) {
      CAPTURE(layer);
      CAPTURE(batching.batch_tokens);
      const std::vector<Tensor> attention = models::target_cross_attention(*model, sources, targets, layer, batching);
      REQUIRE(attention.size() == sources.size());
      for (size_t i = 0; i < sources.size(); ++i) {
        CAPTURE(i);
        REQUIRE(attention[i].shape() == Shape{static_cast<int64_t>(targets[i].size()) + 1,
                                              static_cast<int64_t>(sources[i].size()) + 1});
        check_close(attention[i], alone(i, layer == -1 ? 2 : layer), 1e-12, 1e-12);
        check_close(attention[i].sum({1}), ones({attention[i].size(0)}, DType::Float64), 1e-12, 1e-12);
      }
    }
  }
  // The layers differ, so the layer asked for is the layer read; no layer keeps recording afterwards.
  CHECK(amax(abs(models::target_cross_attention(*model, {sources[0]}, {targets[0]}, 1).front() - alone(0, 2)))
            .item<double>() > 1e-3);
  for (const auto& layer : model->decoder->layers) CHECK_FALSE(layer->record_attention);
  // Pairs past max_len - 1 ids are cut as score_targets cuts them.
  CHECK(models::target_cross_attention(*model, {std::vector<int64_t>(40, 5)}, {std::vector<int64_t>(30, 7)})
            .front()
            .shape() == Shape{16, 16});
  CHECK_THROWS_WITH_AS(models::target_cross_attention(*model, {{5}}, {{6}}, 3),
                       "target_cross_attention: layer must be 1 to the decoder's 2 layers or -1 (the last), got 3",
                       Error);
  CHECK_THROWS_WITH_AS(models::target_cross_attention(*model, {{5}}, {{6}}, 0), doctest::Contains("got 0"), Error);
  CHECK_THROWS_WITH_AS(models::target_cross_attention(*model, {{5}}, {{6, 0}}),
                       "target_cross_attention: target 0 holds <pad> (id 0) at position 1", Error);
}

TEST_CASE("word_alignment gathers pieces into words: target rows averaged, source columns summed, <eos> left out") {
  // Binary fractions, so the sums below are exact. Source pieces 0 and 1 are word 0, piece 2 word 1,
  // piece 3 word 2; target piece 0 is word 0, pieces 1 and 2 word 1; the last row and column are <eos>.
  const Tensor attention = from_vector<double>({0.125, 0.25, 0.375, 0.125, 0.125,  //
                                                0.5, 0.125, 0.125, 0.125, 0.125,   //
                                                0.0, 0.25, 0.5, 0.0, 0.25,         //
                                                0.25, 0.25, 0.25, 0.125, 0.125},
                                               {4, 5});
  const std::vector<int64_t> source_words = {0, 0, 1, 2}, target_words = {0, 1, 1};
  const models::WordAlignment a = models::word_alignment(attention, source_words, target_words);
  REQUIRE(a.source_words == 3);
  REQUIRE(a.target_words == 2);
  // By hand: word 0's row is piece 0's, (0.125 + 0.25, 0.375, 0.125); word 1's the mean of pieces 1
  // and 2, ((0.625 + 0.25) / 2, (0.125 + 0.5) / 2, (0.125 + 0) / 2).
  CHECK(a.weights == std::vector<double>{0.375, 0.375, 0.125, 0.4375, 0.3125, 0.0625});
  using Link = models::AlignmentLink;
  CHECK(a.hard() == std::vector<Link>{{.source = 0, .target = 0}, {.source = 0, .target = 1}});  // a tie: the first
  CHECK(a.above(0.3) == std::vector<Link>{{0, 0}, {1, 0}, {0, 1}, {1, 1}});
  CHECK(a.above(0.4) == std::vector<Link>{{0, 1}});

  // Pieces of no word (-1) are left out; so is a word the length limit cut (the attention covers its
  // first piece only), and with no source word, hard() links nothing.
  const models::WordAlignment cut = models::word_alignment(attention, std::vector<int64_t>{0, -1, 1, 1, 1},
                                                                std::vector<int64_t>{0, 0, -1});
  CHECK(cut.source_words == 1);
  CHECK(cut.target_words == 1);
  CHECK(cut.weights == std::vector<double>{(0.125 + 0.5) / 2});
  const models::WordAlignment no_source = models::word_alignment(attention.narrow(1, 4, 1), std::vector<int64_t>{}, target_words);
  CHECK(no_source.source_words == 0);
  CHECK(no_source.hard().empty());
  CHECK_THROWS_WITH_AS(models::word_alignment(attention, std::vector<int64_t>{0, 1}, target_words),
                       doctest::Contains("covers more pieces than the 3 target and 2 source word indices"), Error);
}

TEST_CASE("decode_sources' sampling draws each token from the model's distribution, banned token left out") {
  auto model = reference_model(DType::Float64);  // random weights: a spread-out distribution
  model->eval();
  const std::vector<int64_t> source = {5, 7, 3, 9};
  // The first token's distribution by hand: log_softmax of the logits after <sos>, <unk> (3) banned.
  const Tensor logits = model->forward(from_vector(std::vector<int64_t>{5, 7, 3, 9, 2}, {1, 5}),
                                       from_vector(std::vector<int64_t>{1}, {1, 1}));
  std::vector<double> probability = logits.reshape({13}).softmax(0).to_vector<double>();
  const double unbanned = 1 - probability[3];
  for (double& p : probability) p /= unbanned;
  probability[3] = 0;

  const int64_t draws = 4000;
  const std::vector<std::vector<int64_t>> sources(draws, source);
  Generator generator(17);
  const models::DecodingOptions options{.max_new_tokens = 1, .banned_ids = {3},
                                        .sampling = {.generator = &generator}};
  const auto sampled = models::decode_sources(*model, sources, options);
  std::vector<double> count(13, 0);
  for (const auto& hypotheses : sampled) count[static_cast<size_t>(hypotheses.front().tokens.front())] += 1;
  CHECK(count[3] == 0);
  for (size_t token = 0; token < 13; ++token) {
    CAPTURE(token);
    const double p = probability[token], sigma = std::sqrt(p * (1 - p) / draws);
    CHECK(std::abs(count[token] / draws - p) <= 5 * sigma + 1e-9);
  }
  // Each draw's log-probability is the model's own, not renormalised for the ban.
  double largest_error = 0;
  for (const auto& hypotheses : sampled) {
    const auto token = static_cast<size_t>(hypotheses.front().tokens.front());
    largest_error = std::max(largest_error, std::abs(hypotheses.front().log_prob - std::log(probability[token] * unbanned)));
  }
  CHECK(largest_error < 1e-12);

  // The same generator seed gives the same draws whatever the workers; another seed other draws.
  // Three threads, so that three workers run whatever the machine's cores.
  testing::ThreadCountGuard restore;
  set_num_threads(3);
  auto draw = [&](uint64_t seed, int64_t workers) {
    Generator stream(seed);
    models::DecodingOptions repeat = options;
    repeat.max_new_tokens = 6;
    repeat.batch_sentences = 500;
    repeat.workers = workers;
    repeat.sampling.generator = &stream;
    std::vector<std::vector<int64_t>> tokens;
    for (const auto& hypotheses : models::decode_sources(*model, sources, repeat)) tokens.push_back(hypotheses[0].tokens);
    return tokens;
  };
  CHECK(draw(5, 1) == draw(5, 3));
  CHECK(draw(5, 1) != draw(6, 1));
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, {source}, {.beam_size = 2, .sampling = {}}),
                       "decode_sources: sampling draws one translation per sentence: it needs beam_size 1 and nbest 1, "
                       "got 2 and 1",
                       Error);
}

TEST_CASE("sampling with top_k 1 is greedy search; a sampled translation scores as forced decoding scores it") {
  auto model = reference_model(DType::Float64);
  model->eval();
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9, 4}, {12, 3}, {6, 8, 11}, {}, {4, 6}};
  const auto greedy = models::decode_sources(*model, sources, {.max_new_tokens = 8});
  const auto top1 = models::decode_sources(*model, sources, {.max_new_tokens = 8, .sampling = {.top_k = 1}});
  for (size_t i = 0; i < sources.size(); ++i) {
    CAPTURE(i);
    CHECK(top1[i][0].tokens == greedy[i][0].tokens);
    CHECK(top1[i][0].log_prob == greedy[i][0].log_prob);
  }
  std::vector<std::vector<int64_t>> repeated;  // each source 8 times: some draws end with <eos>
  for (int copy = 0; copy < 8; ++copy) repeated.insert(repeated.end(), sources.begin(), sources.end());
  const auto free = models::decode_sources(*model, repeated, {.sampling = {.temperature = 1.5}});
  int64_t scored = 0;
  for (size_t i = 0; i < repeated.size(); ++i) {
    CAPTURE(i);
    // Scored: draws that ended with <eos> and hold no <pad> (this untrained model gives <pad> some
    // probability, and forced decoding takes a <pad> in a target for padding).
    const std::vector<int64_t>& tokens = free[i][0].tokens;
    if (tokens.empty() || tokens.back() != text::kEosId ||
        std::find(tokens.begin(), tokens.end(), text::kPadId) != tokens.end())
      continue;
    const auto forced = models::score_targets(*model, {repeated[i]}, {{tokens.begin(), tokens.end() - 1}});
    CHECK(forced[0].log_prob == doctest::Approx(free[i][0].log_prob).epsilon(1e-10));
    ++scored;
  }
  CHECK(scored >= 5);
}

TEST_CASE("decode_sources holds each sentence to its own source's output budget, whatever its batchmates") {
  // With <eos> banned no hypothesis can end: each runs to its budget, min(max_len - 1, 1.5 x its
  // source's ids with <eos> + 10): 13 tokens for a source of one id, 15 (max_len - 1) for a long one.
  auto model = reference_model(DType::Float64);
  model->eval();
  const std::vector<std::vector<int64_t>> sources = {{4}, {5, 7, 3, 9, 4, 6, 8, 11, 12, 3, 5, 7}};
  for (int64_t beam : {1, 2}) {
    CAPTURE(beam);
    const models::DecodingOptions options{.beam_size = beam, .banned_ids = {text::kEosId}};
    const auto together = models::decode_sources(*model, sources, options);
    REQUIRE(together.size() == 2);
    CHECK(together[0][0].tokens.size() == 13);
    CHECK(together[1][0].tokens.size() == 15);
    const auto alone = models::decode_sources(*model, {sources[0]}, options);
    CHECK(together[0][0].tokens == alone[0][0].tokens);
  }
}

TEST_CASE("decode_sources' target prefixes begin every translation, scored as forced decoding scores them") {
  auto model = reference_model(DType::Float64);
  model->eval();
  // The last prefix (14 ids) is longer than its source's budget of 13: that budget grows to 15, the
  // model's max_len - 1, which leaves it one more token.
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9, 4}, {12, 3}, {6, 8, 11}, {4}};
  const std::vector<std::vector<int64_t>> prefixes = {{9, 9}, {}, {4, 5, 6}, std::vector<int64_t>(14, 7)};
  for (int64_t beam : {1, 3}) {
    CAPTURE(beam);
    const models::DecodingOptions options{.beam_size = beam, .nbest = beam, .target_prefixes = prefixes};
    const auto together = models::decode_sources(*model, sources, options);
    REQUIRE(together.size() == sources.size());
    std::vector<std::vector<int64_t>> score_sources, targets;
    std::vector<double> found;
    std::vector<bool> ended;
    for (size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(i);
      models::DecodingOptions alone = options;
      alone.target_prefixes = {prefixes[i]};
      const auto by_itself = models::decode_sources(*model, {sources[i]}, alone).front();
      REQUIRE(together[i].size() == by_itself.size());
      for (size_t k = 0; k < together[i].size(); ++k) {
        const generation::Hypothesis& h = together[i][k];
        CHECK(h.tokens == by_itself[k].tokens);
        REQUIRE(h.tokens.size() > prefixes[i].size());
        CHECK(std::equal(prefixes[i].begin(), prefixes[i].end(), h.tokens.begin()));
        CHECK(h.tokens.size() <= 15);
        // score_targets refuses <pad> in a target; this small model generates it now and then.
        if (std::find(h.tokens.begin(), h.tokens.end(), text::kPadId) != h.tokens.end()) continue;
        ended.push_back(h.tokens.back() == text::kEosId);
        score_sources.push_back(sources[i]);
        targets.emplace_back(h.tokens.begin(), h.tokens.end() - (ended.back() ? 1 : 0));
        found.push_back(h.log_prob);
      }
    }
    // The searches' sums, prefix included, against each whole translation run through the decoder at
    // once; scoring ends every target with <eos>, whose term a translation cut short by its budget lacks.
    REQUIRE(found.size() >= 4);
    const std::vector<models::TargetScore> scores = models::score_targets(*model, score_sources, targets);
    for (size_t i = 0; i < found.size(); ++i) {
      CAPTURE(i);
      const double eos_term = ended[i] ? 0 : scores[i].token_log_probs.back();
      CHECK(scores[i].log_prob - eos_term == doctest::Approx(found[i]).epsilon(1e-10));
    }
  }
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, sources, {.target_prefixes = {{4}}}),
                       "decode_sources: target_prefixes holds 1 prefixes for 4 sources", Error);
  CHECK_THROWS_WITH_AS(models::decode_sources(*model, {{4}}, {.target_prefixes = {std::vector<int64_t>(15, 7)}}),
                       "greedy_decode: the prefix of sentence 0 holds 15 tokens, which leaves none to generate under "
                       "its limit of 15", Error);
}

namespace {

/// An ensemble checked without EnsembleDecoder's code: each member re-runs its whole decoder
/// (RecomputingDecoder), and the mean of their probabilities is taken element by element in float64.
class RecomputingEnsemble : public generation::IncrementalDecoder {
 public:
  RecomputingEnsemble(models::Transformer& a, models::Transformer& b, const Tensor& src) : a_(a, src), b_(b, src) {}
  Tensor step(const Tensor& tokens) override {
    const Tensor x = a_.step(tokens), y = b_.step(tokens);  // [N, V] log-probabilities
    const std::vector<double> xs = x.to_vector<double>(), ys = y.to_vector<double>();
    std::vector<double> mean;
    for (size_t i = 0; i < xs.size(); ++i) mean.push_back(std::log((std::exp(xs[i]) + std::exp(ys[i])) / 2));
    return from_vector(mean, x.shape());
  }
  void select_rows(const Tensor& index) override {
    a_.select_rows(index);
    b_.select_rows(index);
  }

 private:
  RecomputingDecoder a_, b_;
};

/// The reference model with every weight moved by N(0, 0.2^2) noise: another model with its vocabulary.
std::shared_ptr<models::Transformer> perturbed_reference_model() {
  auto model = reference_model(DType::Float64);
  Generator noise(11);
  NoGradGuard no_grad;
  for (auto [name, param] : model->named_parameters())
    param.add_(randn(param.shape(), DType::Float64, Device::cpu(), &noise) * 0.2);
  return model;
}

}  // namespace

TEST_CASE("an ensemble decodes with the mean of its members' probabilities") {
  auto a = reference_model(DType::Float64), b = perturbed_reference_model();
  a->eval();
  b->eval();
  const models::Ensemble ensemble{a.get(), b.get()};
  const Tensor& src = reference("input.src");
  // <pad> is banned throughout: the perturbed model would generate it, and recomputation then masks it
  // out of the keys while a cache holds it.
  const int64_t pad = text::kPadId;
  {
    models::EnsembleDecoder cached(ensemble, src);
    RecomputingEnsemble recomputed(*a, *b, src);
    const generation::GreedyResult x = generation::greedy_decode(cached, 3, {.max_new_tokens = 8, .banned_ids = {pad}});
    const generation::GreedyResult y =
        generation::greedy_decode(recomputed, 3, {.max_new_tokens = 8, .banned_ids = {pad}});
    check_close(x.tokens, y.tokens, 0, 0);
    for (size_t i = 0; i < x.log_probs.size(); ++i)
      CHECK(x.log_probs[i] == doctest::Approx(y.log_probs[i]).epsilon(1e-12));
    // The ensemble's choice is neither member's alone on this input: the mean matters.
    for (const auto& member : {a, b})
      CHECK(x.tokens.to_vector<int64_t>() !=
            models::greedy_decode(*member, src, {.max_new_tokens = 8, .banned_ids = {pad}}).tokens.to_vector<int64_t>());
  }
  {
    models::EnsembleDecoder cached(ensemble, src);
    RecomputingEnsemble recomputed(*a, *b, src);
    const generation::BeamOptions beam{.beam_size = 3, .max_new_tokens = 8, .nbest = 3, .banned_ids = {pad}};
    check_same_beams(generation::beam_search(cached, 3, beam), generation::beam_search(recomputed, 3, beam));
  }
  // decode_sources' hypotheses against the ensemble's forced scoring of them, and a model ensembled with
  // itself against that model alone (the mean of p and p is p).
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9, 4}, {12, 3}, {6, 8, 11}, {4, 6}};
  const models::DecodingOptions beam{.beam_size = 3, .nbest = 3, .banned_ids = {pad}};
  const auto found = models::decode_sources(ensemble, sources, beam);
  std::vector<std::vector<int64_t>> score_sources, targets;
  std::vector<double> log_probs;
  for (size_t i = 0; i < sources.size(); ++i)
    for (const generation::Hypothesis& h : found[i]) {
      if (h.tokens.back() != text::kEosId) continue;  // scoring adds the <eos> they end with
      score_sources.push_back(sources[i]);
      targets.emplace_back(h.tokens.begin(), h.tokens.end() - 1);
      log_probs.push_back(h.log_prob);
    }
  REQUIRE(targets.size() >= 4);
  const auto scores = models::score_targets(ensemble, score_sources, targets);
  for (size_t i = 0; i < targets.size(); ++i) {
    CAPTURE(i);
    CHECK(scores[i].log_prob == doctest::Approx(log_probs[i]).epsilon(1e-10));
  }
  // Sampling from the ensemble's distribution with top-k 1 is its greedy search.
  const models::DecodingOptions greedy{.banned_ids = {pad}};
  models::DecodingOptions top1 = greedy;
  top1.sampling = {.do_sample = true, .top_k = 1};
  const auto greedy_found = models::decode_sources(ensemble, sources, greedy);
  const auto sampled = models::decode_sources(ensemble, sources, top1);
  for (size_t i = 0; i < sources.size(); ++i) {
    CHECK(sampled[i][0].tokens == greedy_found[i][0].tokens);
    CHECK(sampled[i][0].log_prob == doctest::Approx(greedy_found[i][0].log_prob).epsilon(1e-12));
  }
  const auto alone = models::decode_sources(*a, sources, beam);
  const auto twice = models::decode_sources(models::Ensemble{a.get(), a.get()}, sources, beam);
  for (size_t i = 0; i < sources.size(); ++i) {
    REQUIRE(alone[i].size() == twice[i].size());
    for (size_t h = 0; h < alone[i].size(); ++h) {
      CHECK(alone[i][h].tokens == twice[i][h].tokens);
      CHECK(alone[i][h].log_prob == doctest::Approx(twice[i][h].log_prob).epsilon(1e-12));
    }
  }

  models::TransformerConfig other = reference_config();
  other.tgt_vocab = 14;
  other.shared_embeddings = false;
  models::Transformer wider(other);
  CHECK_THROWS_WITH_AS(models::decode_sources(models::Ensemble{a.get(), &wider}, sources, {}),
                       "decode_sources: ensemble member 1 has a target vocabulary of 14 tokens, member 0 of 13", Error);
  CHECK_THROWS_WITH_AS(models::score_targets(models::Ensemble{}, {}, {}), "score_targets: no model given", Error);
}

// Workers decoding side by side share the model's layers, so decoding must not write to them: two
// workers assigning the tensor a layer holds race on its reference count (ThreadSanitizer found it).
TEST_CASE("decode_sources' workers leave the layers' recorded attention as it is; while recording, one decodes") {
  auto model = trained_reference_model();
  model->eval();
  NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9}, {12, 3}, {6, 8, 11}, {4}, {9, 9, 4, 6, 8}};
  const models::DecodingOptions parallel{.max_new_tokens = 8, .batch_sentences = 1, .workers = 3};
  testing::ThreadCountGuard restore;
  set_num_threads(3);
  // A forced pass records one layer's cross-attention, as translate --alignment does between groups.
  const Tensor recorded = model->cross_attention(from_vector(std::vector<int64_t>{5, 7, 3, 9, 2}, {1, 5}),
                                                 from_vector(std::vector<int64_t>{1, 4, 6}, {1, 3}), 1);
  CHECK_FALSE(model->records_attention());
  const auto plain = models::decode_sources(*model, sources, parallel);
  CHECK(model->decoder->layers[0]->cross_attention.is_same(recorded));
  model->set_record_attention(true);
  CHECK(model->records_attention());
  const auto recording = models::decode_sources(*model, sources, parallel);  // on one worker
  model->set_record_attention(false);
  for (size_t i = 0; i < sources.size(); ++i) CHECK(recording[i][0].tokens == plain[i][0].tokens);
  // The last step of the last batch (the longest source, decoded last): one row, one query.
  const Tensor last = model->decoder->layers[0]->cross_attention;
  REQUIRE(last.defined());
  CHECK(last.size(0) == 1);
  CHECK(last.size(2) == 1);
}

TEST_CASE("decode_sources' workers compute as the calling thread would: under its autocast, rethrowing their errors") {
  auto model = trained_reference_model();
  model->to(DType::Float32);  // autocast lowers float32 products only
  model->eval();
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9}, {12, 3}, {6, 8, 11}, {4}, {9, 9, 4, 6, 8}};
  // One sentence per batch, so that three workers (three threads, whatever the machine's cores) share
  // five batches.
  const models::DecodingOptions serial{.max_new_tokens = 8, .batch_sentences = 1, .workers = 1};
  models::DecodingOptions parallel = serial;
  parallel.workers = 3;
  testing::ThreadCountGuard restore;
  set_num_threads(3);
  const auto plain = models::decode_sources(*model, sources, serial);
  std::vector<std::vector<generation::Hypothesis>> autocast_serial, autocast_parallel;
  {
    AutocastGuard autocast(DeviceType::CPU);
    autocast_serial = models::decode_sources(*model, sources, serial);
    autocast_parallel = models::decode_sources(*model, sources, parallel);
  }
  // Autocast rounds the attention products' operands to bfloat16: the log-probabilities move (so a
  // worker that lost the caller's autocast would be seen), and each sentence's batch is computed the
  // same way on a worker as on the caller.
  bool autocast_changed_a_score = false;
  for (size_t i = 0; i < sources.size(); ++i) {
    CAPTURE(i);
    CHECK(autocast_parallel[i][0].tokens == autocast_serial[i][0].tokens);
    CHECK(autocast_parallel[i][0].score == doctest::Approx(autocast_serial[i][0].score).epsilon(1e-6));
    autocast_changed_a_score |= std::abs(autocast_serial[i][0].score - plain[i][0].score) > 1e-4;
  }
  CHECK(autocast_changed_a_score);
  // A token id past the vocabulary fails on whichever worker takes its batch; the caller gets the
  // error the serial decoding gives.
  std::vector<std::vector<int64_t>> bad = sources;
  bad[3] = {reference_config().src_vocab + 5};
  std::string serial_error, parallel_error;
  try {
    models::decode_sources(*model, bad, serial);
  } catch (const Error& e) {
    serial_error = e.what();
  }
  try {
    models::decode_sources(*model, bad, parallel);
  } catch (const Error& e) {
    parallel_error = e.what();
  }
  CHECK_FALSE(serial_error.empty());
  CHECK(parallel_error == serial_error);
}

TEST_CASE("beam width 1 is greedy; beams come back best first") {
  auto model = trained_reference_model();
  const Tensor& src = reference("input.src");
  generation::GreedyResult greedy = models::greedy_decode(*model, src, {.max_new_tokens = 8});
  auto beams = models::beam_search(*model, src, {.beam_size = 1, .max_new_tokens = 8, .length_penalty = 0});
  for (int64_t s = 0; s < 3; ++s) {
    std::vector<int64_t> expected;
    for (int64_t t = 1; t < greedy.tokens.size(1); ++t) {
      int64_t token = greedy.tokens.at<int64_t>({s, t});
      if (token == 0) break;
      expected.push_back(token);
    }
    CHECK(beams[s][0].tokens == expected);
    CHECK(beams[s][0].log_prob == doctest::Approx(greedy.log_probs[s]).epsilon(1e-12));
  }
  auto nbest = models::beam_search(*model, src, {.beam_size = 4, .max_new_tokens = 8, .nbest = 4});
  for (const auto& list : nbest) {
    REQUIRE(list.size() == 4);
    for (size_t h = 1; h < list.size(); ++h) CHECK(list[h - 1].score >= list[h].score);
  }
  // The memorised targets win the beam too: tokens = tgt_out up to EOS.
  CHECK(nbest[1][0].tokens == std::vector<int64_t>{9, 5, 12, 2});
}

TEST_CASE("the output projection over a shortlist's rows gives those ids' logits, bit for bit on miniflow's GEMMs") {
  // Tied (no bias), untied (with bias), float32 and int8: each logit is one row of the weight times the
  // state in either product. miniflow's float32 GEMM (AVX2 and AVX-512) and its int8 GEMM (every path)
  // sum each element in one order whatever the columns around it, so the subset's columns equal the
  // whole's exactly; OpenBLAS, which takes float32 products on the baseline path, sums edge columns
  // in another order: there, 16-term dot products of values ~1 agree to rounding (1e-5 allowed).
  for (bool tied : {true, false})
    for (bool int8 : {false, true}) {
      CAPTURE(tied);
      CAPTURE(int8);
      models::TransformerConfig config = reference_config();
      config.tie_output = tied;
      manual_seed(11);
      models::Transformer model(config);
      model.eval();
      if (int8) nn::quantize_int8(model);
      NoGradGuard no_grad;
      const Tensor states = randn({2, 3, 16});
      const std::vector<int64_t> ids{2, 4, 5, 9, 12};
      const Tensor whole = model.project_output(states);                       // [2, 3, 13]
      const Tensor part = model.project_output(states, model.output_rows(ids));  // [2, 3, 5]
      REQUIRE(part.shape() == Shape{2, 3, 5});
      for (size_t c = 0; c < ids.size(); ++c) {
        CAPTURE(c);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t t = 0; t < 3; ++t) {
            const float listed = part.at<float>({b, t, static_cast<int64_t>(c)}), all = whole.at<float>({b, t, ids[c]});
            if (int8 || kernel_isa() >= Isa::avx2)
              CHECK(listed == all);
            else
              CHECK(listed == doctest::Approx(all).epsilon(1e-5));
          }
      }
    }
  models::Transformer model(reference_config());
  CHECK_THROWS_WITH_AS(model.output_rows({4, 3}), doctest::Contains("id 3 at 1 does not"), Error);
  CHECK_THROWS_WITH_AS(model.output_rows({4, 4}), doctest::Contains("id 4 at 1 does not"), Error);
  CHECK_THROWS_WITH_AS(model.output_rows({13}), doctest::Contains("[0, 13); id 13 at 0 does not"), Error);
  CHECK_THROWS_WITH_AS(model.output_rows({-1}), doctest::Contains("id -1 at 0"), Error);
}

TEST_CASE("decode_sources with a shortlist: every id listed decodes as the whole vocabulary; fewer, only those") {
  auto model = trained_reference_model();
  const std::vector<std::vector<int64_t>> sources = {{5, 7, 3, 9}, {12, 3}, {6, 8, 11}, {}, {4}};
  // A lexicon from a made-up corpus: unit 5 translates to 6, 7 to 8, 12 to 10, and nothing else is seen.
  const text::Lexicon lexicon = text::Lexicon::train({{5}, {7}, {12}}, {{6}, {8}, {10}}, {.null_word = false});
  for (int64_t beam : {1, 3}) {
    CAPTURE(beam);
    const models::DecodingOptions whole{.beam_size = beam, .max_new_tokens = 8, .nbest = beam};
    models::DecodingOptions every = whole;
    every.shortlist = &lexicon;
    every.shortlist_first = 100;  // the default, past the 13 ids: all of them
    const auto expected = models::decode_sources(*model, sources, whole);
    const auto listed = models::decode_sources(*model, sources, every);
    for (size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(i);
      REQUIRE(listed[i].size() == expected[i].size());
      for (size_t h = 0; h < expected[i].size(); ++h) {
        CHECK(listed[i][h].tokens == expected[i][h].tokens);
        CHECK(listed[i][h].score == doctest::Approx(expected[i][h].score).epsilon(1e-12));
      }
    }
    // first 0 and best 1: a batch may produce its sources' translations (6, 8, 10), its own source ids
    // (one embedding for both sides) and <eos>, nothing else; batches of one sentence keep each to its own.
    models::DecodingOptions few = every;
    few.shortlist_first = 0;
    few.shortlist_best = 1;
    few.batch_tokens = 1;
    const auto restricted = models::decode_sources(*model, sources, few);
    const std::vector<std::vector<int64_t>> allowed = {
        {2, 3, 5, 6, 7, 8, 9}, {2, 3, 10, 12}, {2, 6, 8, 11}, {2}, {2, 4}};
    for (size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(i);
      for (const generation::Hypothesis& hypothesis : restricted[i])
        for (int64_t token : hypothesis.tokens)
          CHECK(std::find(allowed[i].begin(), allowed[i].end(), token) != allowed[i].end());
    }
    CHECK(restricted[3].front().tokens == std::vector<int64_t>{text::kEosId});  // <eos> is all the empty one may say
  }
}
