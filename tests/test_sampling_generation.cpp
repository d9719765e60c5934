// Decoder-only generation (models/sampling.h) and the key/value cache (nn/kv_cache.h): a small GPT
// built from nn layers generates the same tokens with and without the cache, sample_next's draws
// follow the distributions temperature, top-k and top-p define (worked out by hand below, checked
// within five standard deviations), stop tokens end rows, and the output rules (min_new_tokens,
// no_repeat_ngram_size) and the repetition penalty hold against a naive loop and an exhaustive search.
#include <doctest/doctest.h>

#include "helpers.h"

#include "ops/reference.h"

#include <cmath>
#include <functional>

using namespace mf;
using mf::testing::check_close;

namespace {

/// A post-norm block (the original Transformer's order) with fused query / key / value projections:
/// norm1(x + attention(x)), then norm2(h + mlp(h)).
struct BlockImpl : nn::Module {
  explicit BlockImpl(int64_t width) : Module("Block") {
    attention = register_module("attention", nn::MultiHeadAttention({.embed_dim = width, .num_heads = 2,
                                                                     .fused_qkv = true, .causal = true}));
    norm1 = register_module("norm1", nn::LayerNorm({.normalized_shape = {width}}));
    mlp = register_module("mlp", nn::Sequential(nn::Linear(width, 2 * width), nn::ReLU(), nn::Linear(2 * width, width)));
    norm2 = register_module("norm2", nn::LayerNorm({.normalized_shape = {width}}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = norm1(x + attention(x));
    return norm2(h + mlp(h));
  }
  nn::MultiHeadAttention attention{nullptr};
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::Sequential mlp{nullptr};
};
MF_MODULE(Block);

/// Token and learned position embeddings, two blocks, a final norm and a head: GPT's shape in small.
struct TinyGptImpl : nn::Module {
  TinyGptImpl() : Module("TinyGpt") {
    tokens = register_module("tokens", nn::Embedding(kVocabulary, kWidth));
    positions = register_module("positions", nn::Embedding(32, kWidth));
    blocks = register_module("blocks", nn::ModuleList(Block(kWidth), Block(kWidth)));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions{.normalized_shape = {kWidth}}));
    head = register_module("head", nn::Linear(kWidth, kVocabulary));
  }
  Tensor forward(const Tensor& ids) override {
    int64_t start = nn::cache_position();  // 0 without a cache
    Tensor x = tokens(ids) + positions(arange(start, start + ids.size(1), 1, DType::Int64));
    for (const auto& block : *blocks) x = (*block)(x);
    return head(norm(x));
  }
  static constexpr int64_t kVocabulary = 11, kWidth = 16;
  nn::Embedding tokens{nullptr}, positions{nullptr};
  nn::ModuleList blocks{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::Linear head{nullptr};
};
MF_MODULE(TinyGpt);

/// Frequencies of each token over the rows of one draw.
std::vector<double> frequencies(const Tensor& drawn, int64_t vocabulary) {
  std::vector<double> counts(static_cast<size_t>(vocabulary), 0);
  std::vector<int64_t> values = drawn.to_vector<int64_t>();
  for (int64_t v : values) counts[static_cast<size_t>(v)] += 1.0 / static_cast<double>(values.size());
  return counts;
}

/// Each frequency within five standard deviations sqrt(p (1 - p) / n) of its probability.
void check_distribution(const std::vector<double>& observed, const std::vector<double>& expected, double n) {
  for (size_t k = 0; k < expected.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(observed[k] - expected[k]) <= 5 * std::sqrt(expected[k] * (1 - expected[k]) / n) + 1e-12);
  }
}

}  // namespace

TEST_CASE("the key/value cache gives the logits of the whole sequence, and generate the same tokens") {
  manual_seed(1);
  TinyGpt model;
  model->eval();
  NoGradGuard no_grad;
  Tensor sequence = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6});
  Tensor full = model(sequence);  // [2, 6, V]
  // Fed a prompt of 3 positions, then one position at a time.
  nn::KVCache cache;
  nn::KVCache::Use use(cache);
  std::vector<Tensor> pieces{model(sequence.narrow(1, 0, 3))};
  cache.advance(3);
  for (int64_t t = 3; t < 6; ++t) {
    pieces.push_back(model(sequence.narrow(1, t, 1)));
    cache.advance(1);
  }
  check_close(cat(pieces, 1), full, 1e-5, 1e-5);

  // A second call without advancing would attend to a cache that ran ahead of the positions.
  model(sequence.narrow(1, 0, 1));
  CHECK_THROWS_WITH_AS(model(sequence.narrow(1, 0, 1)), doctest::Contains("key/value cache holds 7 positions, but the cache is at position 6"),
                       Error);
}

TEST_CASE("the key/value cache's rows follow select_rows: reordered, repeated and dropped, as beams fork") {
  manual_seed(4);
  TinyGpt model;
  model->eval();
  NoGradGuard no_grad;
  Tensor sequence = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6});
  Tensor index = from_vector(std::vector<int64_t>{1, 0, 1}, {3});
  Tensor picked = index_select(sequence, 0, index);  // [3, 6]: rows 1, 0, 1
  Tensor expected = model(picked).narrow(1, 5, 1);   // the last position, computed whole
  nn::KVCache cache;
  nn::KVCache::Use use(cache);
  model(sequence.narrow(1, 0, 5));
  cache.advance(5);
  cache.select_rows(index);
  check_close(model(picked.narrow(1, 5, 1)), expected, 1e-5, 1e-5);
}

TEST_CASE("generate: greedy and sampled tokens are the same with and without the cache, and seeded") {
  manual_seed(2);
  TinyGpt model;
  model->eval();
  auto lm = [&](const Tensor& ids) { return model(ids); };
  Tensor prompt = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  generation::GenerateOptions greedy;
  greedy.sampling.do_sample = false;
  greedy.max_new_tokens = 20;
  Tensor cached = generation::generate(lm, prompt, greedy);
  CHECK(cached.shape() == Shape{2, 23});
  CHECK(cached.narrow(1, 0, 3).to_vector<int64_t>() == prompt.to_vector<int64_t>());
  greedy.use_cache = false;
  CHECK(generation::generate(lm, prompt, greedy).to_vector<int64_t>() == cached.to_vector<int64_t>());

  Generator first(9), second(9);
  generation::GenerateOptions sampled;
  sampled.max_new_tokens = 20;
  sampled.sampling.top_k = 5;
  sampled.sampling.generator = &first;
  Tensor a = generation::generate(lm, prompt, sampled);
  sampled.sampling.generator = &second;
  sampled.use_cache = false;
  CHECK(generation::generate(lm, prompt, sampled).to_vector<int64_t>() == a.to_vector<int64_t>());

  sampled.use_cache = true;
  sampled.context_length = 20;
  CHECK_THROWS_WITH_AS(generation::generate(lm, prompt, sampled),
                       doctest::Contains("prompt (3 tokens) and max_new_tokens (20) must fit in context_length 20"), Error);
}

TEST_CASE("sample_next draws from softmax(logits / temperature), cut by top-k and top-p") {
  // Probabilities 0.1, 0.2, 0.7 for tokens 0, 1, 2, in 20000 rows drawn at once.
  constexpr int64_t kRows = 20000;
  Tensor logits = tensor({std::log(0.1), std::log(0.2), std::log(0.7)}).unsqueeze(0).expand({kRows, 3}).contiguous();
  Generator generator(4);
  auto draw = [&](generation::SamplingOptions options) {
    options.generator = &generator;
    return frequencies(generation::sample_next(logits, options), 3);
  };
  check_distribution(draw({}), {0.1, 0.2, 0.7}, kRows);
  // Temperature 0.5 squares the probabilities: 0.01, 0.04, 0.49 over 0.54.
  check_distribution(draw({.temperature = 0.5}), {0.01 / 0.54, 0.04 / 0.54, 0.49 / 0.54}, kRows);
  // top_k 2 keeps tokens 2 and 1: 0.7 / 0.9 and 0.2 / 0.9.
  check_distribution(draw({.top_k = 2}), {0, 0.2 / 0.9, 0.7 / 0.9}, kRows);
  // top_p 0.75: token 2 alone holds 0.7 < 0.75, so token 1 joins; 0.7 + 0.2 reaches it, token 0 goes
  // (Hugging Face keeps the same set). top_p 0.7: token 2 alone reaches it.
  check_distribution(draw({.top_p = 0.75}), {0, 0.2 / 0.9, 0.7 / 0.9}, kRows);
  check_distribution(draw({.top_p = 0.7}), {0, 0, 1}, kRows);
  CHECK(generation::sample_next(logits, {.do_sample = false}).to_vector<int64_t>() == std::vector<int64_t>(kRows, 2));

  CHECK_THROWS_WITH_AS(generation::sample_next(logits, {.temperature = 0}), doctest::Contains("temperature must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(generation::sample_next(logits, {.top_p = 1.5}), doctest::Contains("top_p must be in (0, 1]"), Error);
  CHECK_THROWS_WITH_AS(generation::sample_next(zeros({3}), {}), doctest::Contains("logits must be [B, V] floats"), Error);
}

namespace {

/// A counting model: after token t comes t + 1 (mod 10), at every position it is fed.
Tensor counting_model(const Tensor& ids) {
  std::vector<int64_t> next;
  for (int64_t t : ids.to_vector<int64_t>()) next.push_back((t + 1) % 10);
  return one_hot(from_vector(next, ids.shape()), 10).to(DType::Float32) * 20.0;  // [B, T, 10]
}

}  // namespace

TEST_CASE("generate: a row ends at its stop token and repeats it; generation ends when every row has") {
  const generation::LanguageModel counting = counting_model;
  generation::GenerateOptions options;
  options.sampling.do_sample = false;
  options.max_new_tokens = 10;
  options.stop_tokens = {7};
  Tensor out = generation::generate(counting, from_vector(std::vector<int64_t>{1, 5}, {2, 1}), options);
  CHECK(out.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 7, 7, 7, 7});
  options.stop_tokens = {};
  options.max_new_tokens = 3;
  CHECK(generation::generate(counting, from_vector(std::vector<int64_t>{8}, {1, 1}), options).to_vector<int64_t>() ==
        std::vector<int64_t>{8, 9, 0, 1});

  // Prompts of different lengths: each as if generated alone, cut after its stop token.
  options.stop_tokens = {7};
  options.max_new_tokens = 10;
  std::vector<std::vector<int64_t>> ragged =
      generation::generate(counting, std::vector<std::vector<int64_t>>{{4, 5}, {6}, {1, 2, 3}, {9, 0}}, options);
  CHECK(ragged == std::vector<std::vector<int64_t>>{{4, 5, 6, 7}, {6, 7}, {1, 2, 3, 4, 5, 6, 7}, {9, 0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK_THROWS_WITH_AS(generation::generate(counting, std::vector<std::vector<int64_t>>{{1}, {}}, options),
                       "generate: prompt 1 is empty (each needs at least one token)", Error);

  auto wrong = [](const Tensor& ids) { return zeros({ids.size(0), 10}); };
  CHECK_THROWS_WITH_AS(generation::generate(wrong, from_vector(std::vector<int64_t>{1}, {1, 1}), options),
                       doctest::Contains("the model returned [1, 10] for tokens [1, 1]"), Error);
  CHECK_THROWS_WITH_AS(generation::generate(counting, zeros({1, 2}), options),
                       doctest::Contains("the prompt must be [B, T] int64"), Error);
}

namespace {

/// A first-order Markov model as a language model: the logits after token t are row t of `table`
/// ([V, V]), at every position it is fed, so it needs no cache.
generation::LanguageModel markov(const Tensor& table) {
  return [table](const Tensor& ids) {
    return index_select(table, 0, ids.reshape({-1})).view({ids.size(0), ids.size(1), table.size(1)});
  };
}

/// The rules of generate() as Hugging Face states them, written independently of the library's tail
/// match: whether `token` may follow `sequence` (the prompt, then `new_so_far` generated tokens). It may
/// not when it is the stop token and fewer than min_new tokens were generated (MinNewTokensLength-
/// LogitsProcessor), nor when the sequence's last n-gram with it appended occurs earlier in the
/// sequence (NoRepeatNGramLogitsProcessor, which reads input_ids: for a decoder-only model they
/// begin with the prompt).
struct Rules {
  int64_t stop = -1;
  size_t min_new = 0, n = 0;
  double repetition_penalty = 1.0;
  std::vector<int64_t> banned = {};  // suppress_tokens: never generated
  /// `score` for `token` after `sequence` under the repetition penalty (RepetitionPenaltyLogitsProcessor:
  /// a token the sequence holds has its score divided by the penalty if positive, else multiplied).
  double penalized(const std::vector<int64_t>& sequence, int64_t token, double score) const {
    if (std::find(sequence.begin(), sequence.end(), token) == sequence.end()) return score;
    return score < 0 ? score * repetition_penalty : score / repetition_penalty;
  }
  bool allow(std::vector<int64_t> sequence, size_t new_so_far, int64_t token) const {
    if (token == stop && new_so_far < min_new) return false;
    if (std::find(banned.begin(), banned.end(), token) != banned.end()) return false;
    sequence.push_back(token);
    if (n == 0 || sequence.size() < n) return true;
    const auto last = sequence.end() - static_cast<std::ptrdiff_t>(n);
    for (auto start = sequence.begin(); start < last; ++start)
      if (std::equal(start, start + static_cast<std::ptrdiff_t>(n), last)) return false;
    return true;
  }
};

/// The score of `tokens` generated after `prompt` from a Markov table, worked out independently of
/// beam_search: their summed log-softmax (float64 from the table's floats; banned tokens leave the
/// others' as they are; the repetition penalty applied to it, as Hugging Face's beam search does) over
/// GNMT's length penalty ((5 + length) / 6)^alpha; -infinity where the rules forbid them.
double sequence_score(const std::vector<float>& table, int64_t vocabulary, const std::vector<int64_t>& prompt,
                      const Rules& rules, const std::vector<int64_t>& tokens, double alpha) {
  auto log_prob = [&](int64_t from, int64_t to) {
    double total = 0;
    for (int64_t j = 0; j < vocabulary; ++j) total += std::exp(double(table[static_cast<size_t>(from * vocabulary + j)]));
    return double(table[static_cast<size_t>(from * vocabulary + to)]) - std::log(total);
  };
  std::vector<int64_t> sequence = prompt;
  double sum = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!rules.allow(sequence, i, tokens[i])) return -INFINITY;
    sum += rules.penalized(sequence, tokens[i], log_prob(sequence.back(), tokens[i]));
    sequence.push_back(tokens[i]);
  }
  return sum / std::pow((5.0 + double(tokens.size())) / 6.0, alpha);
}

/// Every continuation of `prompt` the rules allow, by exhaustive search: each sequence of up to `max_new`
/// tokens that ends at its first `rules.stop` or at max_new tokens, best sequence_score first (equal
/// scores in the order they were enumerated, lower token ids first).
std::vector<std::vector<int64_t>> exhaustive_ranked(const std::vector<float>& table, int64_t vocabulary,
                                                    const std::vector<int64_t>& prompt, const Rules& rules,
                                                    int64_t max_new, double alpha) {
  std::vector<std::pair<double, std::vector<int64_t>>> found;
  std::vector<int64_t> tokens;
  std::function<void()> extend = [&]() {
    for (int64_t token = 0; token < vocabulary; ++token) {
      tokens.push_back(token);
      if (token == rules.stop || static_cast<int64_t>(tokens.size()) == max_new) {
        const double score = sequence_score(table, vocabulary, prompt, rules, tokens, alpha);
        if (score > -INFINITY) found.emplace_back(score, tokens);
      } else {
        extend();
      }
      tokens.pop_back();
    }
  };
  extend();
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::vector<int64_t>> ranked;
  for (auto& [score, sequence] : found) ranked.push_back(std::move(sequence));
  return ranked;
}

/// The best continuation of `prompt` by exhaustive search (exhaustive_ranked's first).
std::vector<int64_t> exhaustive_best(const std::vector<float>& table, int64_t vocabulary,
                                     const std::vector<int64_t>& prompt, const Rules& rules, int64_t max_new,
                                     double alpha) {
  return exhaustive_ranked(table, vocabulary, prompt, rules, max_new, alpha).front();
}

/// Greedy generation from a Markov table under the rules, worked out as a naive loop: each step the
/// allowed token with the largest (penalized) logit (the lowest id on a tie), until the stop token or
/// max_new.
std::vector<int64_t> greedy_reference(const std::vector<float>& table, int64_t vocabulary,
                                      const std::vector<int64_t>& prompt, const Rules& rules, int64_t max_new) {
  std::vector<int64_t> sequence = prompt;
  for (int64_t step = 0; step < max_new; ++step) {
    int64_t chosen = -1;
    for (int64_t token = 0; token < vocabulary; ++token) {
      if (!rules.allow(sequence, static_cast<size_t>(step), token)) continue;
      const auto at = [&](int64_t t) {
        return rules.penalized(sequence, t, table[static_cast<size_t>(sequence.back() * vocabulary + t)]);
      };
      if (chosen < 0 || at(token) > at(chosen)) chosen = token;
    }
    REQUIRE(chosen >= 0);
    sequence.push_back(chosen);
    if (chosen == rules.stop) break;
  }
  return sequence;
}

}  // namespace

TEST_CASE("generate: beam search finds what an exhaustive search finds, where greedy search does not") {
  constexpr int64_t kVocabulary = 5, kStop = 2, kMaxNew = 4;
  int greedy_worse = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    CAPTURE(seed);
    Tensor table = reference::randn({kVocabulary, kVocabulary}, seed) * 2.0;
    const std::vector<float> values = table.to_vector<float>();
    for (double alpha : {0.0, 0.6}) {
      CAPTURE(alpha);
      generation::GenerateOptions options;
      options.sampling.do_sample = false;
      options.max_new_tokens = kMaxNew;
      options.stop_tokens = {kStop};
      options.length_penalty = alpha;
      options.num_beams = 64;  // 4^3 live prefixes at most: every one kept, so the search is exhaustive
      Tensor prompt = from_vector(std::vector<int64_t>{0, 1}, {2, 1});
      std::vector<std::vector<int64_t>> found = generation::generate(markov(table), {{0}, {1}}, options);
      for (int64_t row = 0; row < 2; ++row) {
        std::vector<int64_t> expected{row};
        for (int64_t t : exhaustive_best(values, kVocabulary, {row}, {.stop = kStop}, kMaxNew, alpha))
          expected.push_back(t);
        CHECK(found[static_cast<size_t>(row)] == expected);
        options.num_beams = 1;
        if (generation::generate(markov(table), {{row}}, options)[0] != expected) ++greedy_worse;
        options.num_beams = 64;
      }
      // The tensor form: rows padded with their stop token to the longest.
      Tensor padded = generation::generate(markov(table), prompt, options);
      for (int64_t row = 0; row < 2; ++row) {
        std::vector<int64_t> tokens = padded.select(0, row).to_vector<int64_t>();
        const std::vector<int64_t>& cut = found[static_cast<size_t>(row)];
        CHECK(std::equal(cut.begin(), cut.end(), tokens.begin()));
        for (size_t t = cut.size(); t < tokens.size(); ++t) CHECK(tokens[t] == kStop);
      }
    }
  }
  CHECK(greedy_worse > 0);  // the tables include cases where search matters
}

TEST_CASE("generate: beam search gives the same tokens with and without the cache, its rows forked and reordered") {
  manual_seed(3);
  TinyGpt model;
  model->eval();
  auto lm = [&](const Tensor& ids) { return model(ids); };
  Tensor prompt = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  generation::GenerateOptions options;
  options.sampling.do_sample = false;
  options.num_beams = 3;
  options.max_new_tokens = 12;
  options.stop_tokens = {4};
  Tensor cached = generation::generate(lm, prompt, options);
  CHECK(cached.narrow(1, 0, 3).to_vector<int64_t>() == prompt.to_vector<int64_t>());
  options.use_cache = false;
  CHECK(generation::generate(lm, prompt, options).to_vector<int64_t>() == cached.to_vector<int64_t>());
  options.stop_tokens = {};  // no end token: every hypothesis runs max_new_tokens
  CHECK(generation::generate(lm, prompt, options).shape() == Shape{2, 15});

  options.stop_tokens = {4, 5};
  CHECK_THROWS_WITH_AS(generation::generate(lm, prompt, options),
                       doctest::Contains("beam search takes at most one stop token, got 2"), Error);
  options.stop_tokens = {4};
  options.sampling.do_sample = true;
  CHECK_THROWS_WITH_AS(generation::generate(lm, prompt, options),
                       doctest::Contains("set sampling.do_sample = false"), Error);
  options.num_beams = 0;
  CHECK_THROWS_WITH_AS(generation::generate(lm, prompt, options), doctest::Contains("num_beams must be >= 1, got 0"),
                       Error);
}

TEST_CASE("generate: min_new_tokens and no_repeat_ngram_size, the prompt's n-grams counted, worked by hand") {
  const generation::LanguageModel counting = counting_model;  // every token but t + 1 ties at 0
  generation::GenerateOptions options;
  options.sampling.do_sample = false;
  options.max_new_tokens = 1;
  options.no_repeat_ngram_size = 2;
  // The prompt already holds (1, 2): 2 may not follow its last 1, and of the tokens tied at 0 the
  // lowest id, 0, comes instead.
  CHECK(generation::generate(counting, std::vector<std::vector<int64_t>>{{1, 2, 1}}, options) ==
        std::vector<std::vector<int64_t>>{{1, 2, 1, 0}});
  // Stop token 7 banned until 4 new tokens: 6, then 0 (7 ruled out, the lowest tie), 1, 2; then the
  // count goes on to 7, nine new tokens in all.
  options.no_repeat_ngram_size = 0;
  options.min_new_tokens = 4;
  options.max_new_tokens = 10;
  options.stop_tokens = {7};
  CHECK(generation::generate(counting, from_vector(std::vector<int64_t>{5}, {1, 1}), options).to_vector<int64_t>() ==
        std::vector<int64_t>{5, 6, 0, 1, 2, 3, 4, 5, 6, 7});
  options.num_beams = 3;  // beam search keeps to the rule too
  CHECK(generation::generate(counting, std::vector<std::vector<int64_t>>{{5}}, options)[0].size() >= 1 + 4 + 1);

  // No token left: with n = 1 no token may come twice, and the prompt holds both of a two-token model's.
  auto two_tokens = [](const Tensor& ids) { return zeros({ids.size(0), ids.size(1), 2}); };
  options = {};
  options.no_repeat_ngram_size = 1;
  CHECK_THROWS_WITH_AS(generation::generate(two_tokens, from_vector(std::vector<int64_t>{0, 1}, {1, 2}), options),
                       doctest::Contains("generate: a hypothesis has no token left to take"), Error);
  options.no_repeat_ngram_size = -1;
  CHECK_THROWS_WITH_AS(generation::generate(two_tokens, from_vector(std::vector<int64_t>{0}, {1, 1}), options),
                       "generate: no_repeat_ngram_size must be at least 0 (0: off), got -1", Error);
  options.no_repeat_ngram_size = 0;
  options.min_new_tokens = -2;
  CHECK_THROWS_WITH_AS(generation::generate(two_tokens, from_vector(std::vector<int64_t>{0}, {1, 1}), options),
                       "generate: min_new_tokens must be at least 0, got -2", Error);
}

TEST_CASE("generate: greedy and beam search under the rules and the repetition penalty find what a naive loop and an "
          "exhaustive search find") {
  constexpr int64_t kVocabulary = 5, kStop = 2;
  // Prompts whose own n-grams the rules must count: (1, 3) and (4, 4) repeat at their ends.
  const std::vector<std::vector<int64_t>> prompts{{0}, {1, 3, 1}, {4, 4, 0, 4}};
  int prompt_mattered = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    CAPTURE(seed);
    Tensor table = reference::randn({kVocabulary, kVocabulary}, seed + 20) * 2.0;
    const std::vector<float> values = table.to_vector<float>();
    for (size_t min_new : {0, 2, 3})
      for (size_t n : {0, 1, 2, 3})
        for (double penalty : {1.0, 0.7, 1.8}) {
        CAPTURE(min_new);
        CAPTURE(n);
        CAPTURE(penalty);
        // suppress_tokens too (token 3) where n = 0 and the penalty is on: beside the n-gram bans, five
        // tokens less one can leave a row none to take, which is an error.
        const std::vector<int64_t> banned = n == 0 && penalty != 1.0 ? std::vector<int64_t>{3} : std::vector<int64_t>{};
        const Rules rules{.stop = kStop, .min_new = min_new, .n = n, .repetition_penalty = penalty, .banned = banned};
        generation::GenerateOptions options;
        options.sampling.do_sample = false;
        options.stop_tokens = {kStop};
        options.banned_ids = banned;
        options.min_new_tokens = static_cast<int64_t>(min_new);
        options.no_repeat_ngram_size = static_cast<int64_t>(n);
        options.repetition_penalty = penalty;
        options.max_new_tokens = n == 1 ? 1 : 8;  // n = 1 leaves no token after the distinct ones
        std::vector<std::vector<int64_t>> greedy = generation::generate(markov(table), prompts, options);
        for (size_t row = 0; row < prompts.size(); ++row) {
          CAPTURE(row);
          CHECK(greedy[row] == greedy_reference(values, kVocabulary, prompts[row], rules, options.max_new_tokens));
          // Against the same rules blind to the prompt's n-grams: the count must begin at the prompt.
          std::vector<int64_t> blind{prompts[row].back()};
          std::vector<int64_t> without_prompt = greedy_reference(values, kVocabulary, blind, rules, options.max_new_tokens);
          if (!std::equal(without_prompt.begin() + 1, without_prompt.end(), greedy[row].begin() +
                          static_cast<std::ptrdiff_t>(prompts[row].size()), greedy[row].end()))
            ++prompt_mattered;
        }
        if (n == 1) continue;
        options.max_new_tokens = 4;
        options.num_beams = 64;  // wider than the 4^3 live prefixes: exhaustive
        for (double alpha : {0.0, 0.6}) {
          CAPTURE(alpha);
          options.length_penalty = alpha;
          std::vector<std::vector<int64_t>> beam = generation::generate(markov(table), prompts, options);
          for (size_t row = 0; row < prompts.size(); ++row) {
            const auto prompt_length = static_cast<std::ptrdiff_t>(prompts[row].size());
            REQUIRE(std::equal(prompts[row].begin(), prompts[row].end(), beam[row].begin()));
            const std::vector<int64_t> found(beam[row].begin() + prompt_length, beam[row].end());
            const std::vector<int64_t> best = exhaustive_best(values, kVocabulary, prompts[row], rules, 4, alpha);
            // The same sequence, or one whose score ties with it (the penalty can give two orders of the
            // same terms): equal to float32's rounding of the log-probabilities.
            CHECK(sequence_score(values, kVocabulary, prompts[row], rules, found, alpha) ==
                  doctest::Approx(sequence_score(values, kVocabulary, prompts[row], rules, best, alpha)).epsilon(1e-6));
          }
        }
      }
  }
  CHECK(prompt_mattered > 0);
}

TEST_CASE("generate: sampled rows keep to the rules, the same with and without the cache") {
  manual_seed(5);
  TinyGpt model;
  model->eval();
  auto lm = [&](const Tensor& ids) { return model(ids); };
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4, 5, 4}, {6, 6, 7}};
  generation::GenerateOptions options;
  options.sampling.temperature = 1.5;
  options.max_new_tokens = 16;
  options.stop_tokens = {3};
  options.min_new_tokens = 5;
  options.no_repeat_ngram_size = 2;
  Generator first(11), second(11);
  options.sampling.generator = &first;
  std::vector<std::vector<int64_t>> cached = generation::generate(lm, prompts, options);
  options.sampling.generator = &second;
  options.use_cache = false;
  CHECK(generation::generate(lm, prompts, options) == cached);
  const Rules rules{.stop = 3, .min_new = 5, .n = 2};
  for (size_t row = 0; row < prompts.size(); ++row) {
    CAPTURE(row);
    const std::vector<int64_t>& out = cached[row];
    REQUIRE(out.size() > prompts[row].size());
    CHECK(out.size() >= prompts[row].size() + 5);  // the stop token, if any, comes after 5 new tokens
    for (size_t t = prompts[row].size(); t < out.size(); ++t)
      CHECK(rules.allow({out.begin(), out.begin() + static_cast<std::ptrdiff_t>(t)}, t - prompts[row].size(), out[t]));
  }
}

TEST_CASE("generate: the repetition penalty, worked by hand, and what sampling draws under it") {
  // Logits [-1, -1.5, -2.5] after any token; penalty 2 on the tokens a row holds. After prompt {0}:
  // [-2, -1.5, -2.5] gives 1; then [-2, -3, -2.5] gives 0, and 0 again.
  auto fixed = [](const Tensor& ids) {
    return from_vector(std::vector<float>{-1.0F, -1.5F, -2.5F}, {1, 1, 3}).expand({ids.size(0), ids.size(1), 3});
  };
  generation::GenerateOptions options;
  options.sampling.do_sample = false;
  options.max_new_tokens = 3;
  options.repetition_penalty = 2.0;
  CHECK(generation::generate(fixed, from_vector(std::vector<int64_t>{0}, {1, 1}), options).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 0, 0});
  // Positive logits are divided: [2, 1.5, 0.5] after {0} gives [1, 1.5, 0.5] -> 1, then [1, 0.75, 0.5] -> 0.
  auto positive = [](const Tensor& ids) {
    return from_vector(std::vector<float>{2.0F, 1.5F, 0.5F}, {1, 1, 3}).expand({ids.size(0), ids.size(1), 3});
  };
  CHECK(generation::generate(positive, from_vector(std::vector<int64_t>{0}, {1, 1}), options).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 0, 0});

  // Sampling draws from softmax of the penalized logits (worked out here in float64), each frequency within
  // five standard deviations over 20,000 rows of the same prompt.
  constexpr int64_t kRows = 20000;
  Tensor table = reference::randn({4, 4}, 31) * 1.5;
  const std::vector<float> values = table.to_vector<float>();
  const std::vector<int64_t> prompt{2, 1};
  options.sampling = {.do_sample = true, .temperature = 0.8};
  options.max_new_tokens = 1;
  options.repetition_penalty = 1.6;
  const Rules rules{.repetition_penalty = 1.6};
  std::vector<double> expected(4);
  double total = 0;
  for (int64_t t = 0; t < 4; ++t) {
    expected[static_cast<size_t>(t)] = std::exp(rules.penalized(prompt, t, values[static_cast<size_t>(4 + t)]) / 0.8);
    total += expected[static_cast<size_t>(t)];
  }
  for (double& p : expected) p /= total;
  std::vector<int64_t> prompts;
  for (int64_t r = 0; r < kRows; ++r) prompts.insert(prompts.end(), prompt.begin(), prompt.end());
  Generator stream(5);
  options.sampling.generator = &stream;
  Tensor drawn = generation::generate(markov(table), from_vector(prompts, {kRows, 2}), options).select(1, 2);
  check_distribution(frequencies(drawn.contiguous(), 4), expected, double(kRows));

  options.repetition_penalty = 0;
  CHECK_THROWS_WITH_AS(generation::generate(fixed, from_vector(std::vector<int64_t>{0}, {1, 1}), options),
                       "generate: repetition_penalty must be positive and finite (1: off), got 0", Error);
}

TEST_CASE("generate: num_return_sequences gives a row's best hypotheses, or its independent draws") {
  constexpr int64_t kVocabulary = 5, kStop = 2;
  Tensor table = reference::randn({kVocabulary, kVocabulary}, 41) * 2.0;
  const std::vector<float> values = table.to_vector<float>();
  const std::vector<std::vector<int64_t>> prompts{{1, 0}, {4, 3}};
  generation::GenerateOptions options;
  options.sampling.do_sample = false;
  options.stop_tokens = {kStop};
  options.max_new_tokens = 4;
  options.num_beams = 64;  // exhaustive, as above
  options.num_return_sequences = 3;
  options.banned_ids = {0};
  const Rules rules{.stop = kStop, .banned = {0}};
  for (double alpha : {0.0, 0.6}) {
    CAPTURE(alpha);
    options.length_penalty = alpha;
    std::vector<std::vector<int64_t>> found = generation::generate(markov(table), prompts, options);
    REQUIRE(found.size() == 6);
    for (size_t row = 0; row < prompts.size(); ++row) {
      const auto ranked = exhaustive_ranked(values, kVocabulary, prompts[row], rules, 4, alpha);
      for (size_t j = 0; j < 3; ++j) {
        CAPTURE(row);
        CAPTURE(j);
        const std::vector<int64_t>& sequence = found[row * 3 + j];
        REQUIRE(std::equal(prompts[row].begin(), prompts[row].end(), sequence.begin()));
        const std::vector<int64_t> tokens(sequence.begin() + 2, sequence.end());
        const double best = sequence_score(values, kVocabulary, prompts[row], rules, ranked[j], alpha);
        CHECK(sequence_score(values, kVocabulary, prompts[row], rules, tokens, alpha) ==
              doctest::Approx(best).epsilon(1e-6));
      }
    }
    // The tensor form: [B * 3, T + n], each row's sequences in a row.
    Tensor padded = generation::generate(markov(table), from_vector(std::vector<int64_t>{1, 0, 4, 3}, {2, 2}), options);
    CHECK(padded.size(0) == 6);
    for (int64_t r = 0; r < 6; ++r) {
      const std::vector<int64_t> tokens = padded.select(0, r).to_vector<int64_t>();
      CHECK(std::equal(found[static_cast<size_t>(r)].begin(), found[static_cast<size_t>(r)].end(), tokens.begin()));
    }
  }

  // Sampling: the same draws as the prompt rows repeated by hand, from the same generator state.
  options.num_beams = 1;
  options.sampling = {.do_sample = true, .temperature = 1.2};
  Generator first(3), second(3);
  options.sampling.generator = &first;
  Tensor drawn = generation::generate(markov(table), from_vector(std::vector<int64_t>{1, 0, 4, 3}, {2, 2}), options);
  options.sampling.generator = &second;
  options.num_return_sequences = 1;
  Tensor repeated = from_vector(std::vector<int64_t>{1, 0, 1, 0, 1, 0, 4, 3, 4, 3, 4, 3}, {6, 2});
  CHECK(generation::generate(markov(table), repeated, options).to_vector<int64_t>() == drawn.to_vector<int64_t>());

  options.sampling.do_sample = false;
  options.num_return_sequences = 2;
  CHECK_THROWS_WITH_AS(generation::generate(markov(table), {{1}}, options),
                       doctest::Contains("greedy search has one answer per prompt; num_return_sequences 2"), Error);
  options.num_beams = 2;
  options.num_return_sequences = 3;
  CHECK_THROWS_WITH_AS(generation::generate(markov(table), {{1}}, options),
                       "generate: num_return_sequences 3 is more than num_beams 2", Error);
  options.num_return_sequences = 0;
  CHECK_THROWS_WITH_AS(generation::generate(markov(table), {{1}}, options),
                       "generate: num_return_sequences must be >= 1, got 0", Error);
  options.num_return_sequences = 1;
  options.num_beams = 1;
  options.banned_ids = {5};
  CHECK_THROWS_WITH_AS(generation::generate(markov(table), {{1}}, options),
                       "generate: banned token id 5 is outside the model's vocabulary of 5 tokens", Error);
}
