// Greedy and beam search (models/generation.h) against fake decoders whose next-token distribution is
// a fixed function of (sentence, prefix), so every expected value can be computed independently: by a
// naive argmax loop, by exhaustive enumeration, or by hand for scripted distributions.
#include <doctest/doctest.h>

#include "helpers.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

using namespace mf;
using namespace mf::generation;
using mf::testing::check_close;

namespace {

constexpr int64_t kPad = 0, kBos = 1, kEos = 2;

/// log p(next token | sentence, prefix) for every token, prefix starting with BOS. Values are
/// float-rounded, so the float32 tensors a decoder returns hold them exactly.
using Model = std::function<std::vector<double>(int64_t sentence, const std::vector<int64_t>& prefix)>;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<double> float_log_softmax(const std::vector<double>& logits) {
  double top = *std::max_element(logits.begin(), logits.end()), total = 0;
  for (double l : logits) total += std::exp(l - top);
  std::vector<double> out;
  for (double l : logits) out.push_back(static_cast<float>(l - top - std::log(total)));
  return out;
}

/// A random model: logits uniform in [-3, 3) hashed from (seed, sentence, whole prefix), EOS pushed up
/// as the prefix grows so sentences end at various lengths. Depending on the sentence and the whole
/// prefix makes any mix-up of rows (batching, reordering) change the numbers.
Model random_model(uint64_t seed, int64_t vocab) {
  return [seed, vocab](int64_t sentence, const std::vector<int64_t>& prefix) {
    uint64_t h = splitmix(seed ^ splitmix(static_cast<uint64_t>(sentence)));
    for (int64_t t : prefix) h = splitmix(h ^ static_cast<uint64_t>(t));
    std::vector<double> logits;
    for (int64_t v = 0; v < vocab; ++v) {
      h = splitmix(h);
      logits.push_back(static_cast<double>(h >> 11) * 0x1.0p-53 * 6 - 3);
    }
    logits[kEos] += 0.6 * static_cast<double>(prefix.size());
    return float_log_softmax(logits);
  };
}

/// A scripted model: at position p (after p generated tokens) the sentence's script[p] (EOS past the
/// end) has probability `p_main`, every other token shares the rest equally.
Model scripted_model(std::vector<std::vector<int64_t>> scripts, int64_t vocab, double p_main = 0.9) {
  return [scripts, vocab, p_main](int64_t sentence, const std::vector<int64_t>& prefix) {
    const auto& script = scripts[static_cast<size_t>(sentence)];
    size_t position = prefix.size() - 1;
    int64_t main = position < script.size() ? script[position] : kEos;
    std::vector<double> out(static_cast<size_t>(vocab), static_cast<float>(std::log((1 - p_main) / (vocab - 1))));
    out[static_cast<size_t>(main)] = static_cast<float>(std::log(p_main));
    return out;
  };
}

/// Probabilities by prefix (BOS left out), `otherwise` for prefixes not in the table.
Model table_model(std::map<std::vector<int64_t>, std::vector<double>> table, std::vector<double> otherwise) {
  return [table, otherwise](int64_t, const std::vector<int64_t>& prefix) {
    auto it = table.find(std::vector<int64_t>(prefix.begin() + 1, prefix.end()));
    std::vector<double> out;
    for (double p : it == table.end() ? otherwise : it->second) out.push_back(static_cast<float>(std::log(p)));
    return out;
  };
}

/// The decoder the searches drive: row i holds sentence sentences[i] and the prefix fed so far. It
/// records how many rows each step saw and every selection, and rejects malformed calls.
class FakeDecoder : public IncrementalDecoder {
 public:
  FakeDecoder(Model model, std::vector<int64_t> sentences, int64_t bos = kBos)
      : model_(std::move(model)), sentences_(std::move(sentences)), bos_(bos) {
    prefixes_.resize(sentences_.size());
  }

  Tensor step(const Tensor& tokens) override {
    MF_CHECK(tokens.dim() == 1 && tokens.dtype() == DType::Int64 && tokens.size(0) == rows(),
             "FakeDecoder: bad tokens {}", shape_str(tokens.shape()));
    std::vector<int64_t> fed = tokens.to_vector<int64_t>();
    rows_per_step.push_back(rows());
    std::vector<float> out;
    for (size_t row = 0; row < fed.size(); ++row) {
      MF_CHECK(!prefixes_[row].empty() || fed[row] == bos_, "FakeDecoder: the first token must be BOS");
      prefixes_[row].push_back(fed[row]);
      // As logits: the log-probabilities shifted by an amount of the row's own, which log_softmax undoes.
      const double shift = gives == Scores::Logits ? 1.5 + 0.75 * static_cast<double>(row % 5) : 0.0;
      for (double v : model_(sentences_[row], prefixes_[row]))
        out.push_back(static_cast<float>(gives == Scores::Probabilities ? std::exp(v) : v + shift));
    }
    return from_vector(out, {rows(), static_cast<int64_t>(out.size()) / std::max<int64_t>(rows(), 1)});
  }

  void select_rows(const Tensor& index) override {
    std::vector<int64_t> picked = index.to_vector<int64_t>();
    selections.push_back(picked);
    std::vector<int64_t> sentences;
    std::vector<std::vector<int64_t>> prefixes;
    for (int64_t i : picked) {
      MF_CHECK(i >= 0 && i < rows(), "FakeDecoder: row {} out of range", i);
      sentences.push_back(sentences_[static_cast<size_t>(i)]);
      prefixes.push_back(prefixes_[static_cast<size_t>(i)]);
    }
    sentences_ = std::move(sentences);
    prefixes_ = std::move(prefixes);
  }

  Scores scores() const override { return gives; }

  int64_t rows() const { return static_cast<int64_t>(sentences_.size()); }

  Scores gives = Scores::LogProbs;  // what step() returns
  std::vector<int64_t> rows_per_step;
  std::vector<std::vector<int64_t>> selections;

 private:
  Model model_;
  std::vector<int64_t> sentences_;
  std::vector<std::vector<int64_t>> prefixes_;
  int64_t bos_;
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

double gnmt(size_t length, double alpha) { return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha); }

/// BOS and then `forced`, with the sum of the forced tokens' log-probabilities under the model.
std::pair<std::vector<int64_t>, double> forced_start(const Model& model, int64_t sentence,
                                                     const std::vector<int64_t>& forced) {
  std::vector<int64_t> prefix{kBos};
  double sum = 0;
  for (int64_t token : forced) {
    sum += model(sentence, prefix)[static_cast<size_t>(token)];
    prefix.push_back(token);
  }
  return {prefix, sum};
}

/// Whether `token` may follow the tokens generated so far (BOS left out).
using Allowed = std::function<bool(const std::vector<int64_t>& generated, int64_t token)>;

bool any_token(const std::vector<int64_t>&, int64_t) { return true; }

/// The searches' min_new_tokens and no_repeat_ngram_size as their documentation states them, written
/// another way than the library's: EOS only once `min_new` tokens are there, and the n-gram that
/// `token` would end must not occur anywhere before it.
Allowed output_rules(int64_t min_new, size_t n) {
  return [min_new, n](const std::vector<int64_t>& generated, int64_t token) {
    if (token == kEos && static_cast<int64_t>(generated.size()) < min_new) return false;
    std::vector<int64_t> out = generated;
    out.push_back(token);
    if (n == 0 || out.size() < n) return true;
    const std::vector<int64_t> last(out.end() - static_cast<std::ptrdiff_t>(n), out.end());
    for (size_t start = 0; start + n < out.size(); ++start)
      if (std::equal(last.begin(), last.end(), out.begin() + static_cast<std::ptrdiff_t>(start))) return false;
    return true;
  };
}

/// Naive greedy decoding of one sentence: the `forced` tokens, then argmax (first maximum) over the
/// `allowed` tokens until EOS or max_new_tokens.
std::pair<std::vector<int64_t>, double> naive_greedy(const Model& model, int64_t sentence, int64_t max_new_tokens,
                                                     const std::vector<int64_t>& forced = {},
                                                     const Allowed& allowed = any_token) {
  auto [prefix, sum] = forced_start(model, sentence, forced);
  while (static_cast<int64_t>(prefix.size()) <= max_new_tokens) {
    std::vector<double> lp = model(sentence, prefix);
    const std::vector<int64_t> generated(prefix.begin() + 1, prefix.end());
    int64_t best = -1;
    for (int64_t t = 0; t < static_cast<int64_t>(lp.size()); ++t)
      if (allowed(generated, t) && (best < 0 || lp[static_cast<size_t>(t)] > lp[static_cast<size_t>(best)])) best = t;
    sum += lp[static_cast<size_t>(best)];
    prefix.push_back(best);
    if (prefix.back() == kEos) break;
  }
  return {prefix, sum};
}

/// Every complete hypothesis of one sentence (ends in EOS, or has max_new_tokens tokens) that begins
/// with `forced` and takes only `allowed` tokens after it, with its log-probability and GNMT score,
/// best first.
std::vector<Hypothesis> enumerate_all(const Model& model, int64_t sentence, int64_t vocab, int64_t max_new_tokens,
                                      double alpha, const std::vector<int64_t>& forced = {},
                                      const Allowed& allowed = any_token) {
  std::vector<Hypothesis> all;
  std::function<void(std::vector<int64_t>&, double)> extend = [&](std::vector<int64_t>& prefix, double sum) {
    std::vector<double> lp = model(sentence, prefix);
    for (int64_t t = 0; t < vocab; ++t) {
      if (!allowed(std::vector<int64_t>(prefix.begin() + 1, prefix.end()), t)) continue;
      prefix.push_back(t);
      double s = sum + lp[static_cast<size_t>(t)];
      if (t == kEos || static_cast<int64_t>(prefix.size()) - 1 == max_new_tokens) {
        std::vector<int64_t> tokens(prefix.begin() + 1, prefix.end());
        all.push_back({tokens, s, s / gnmt(tokens.size(), alpha)});
      } else {
        extend(prefix, s);
      }
      prefix.pop_back();
    }
  };
  auto [prefix, sum] = forced_start(model, sentence, forced);
  extend(prefix, sum);
  std::sort(all.begin(), all.end(), [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  return all;
}

void check_same(const std::vector<Hypothesis>& actual, const std::vector<Hypothesis>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK(actual[i].tokens == expected[i].tokens);
    CHECK(actual[i].log_prob == doctest::Approx(expected[i].log_prob).epsilon(1e-12));
    CHECK(actual[i].score == doctest::Approx(expected[i].score).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("greedy_decode equals a naive argmax loop run on each sentence") {
  for (uint64_t seed : {1, 2, 3}) {
    for (int64_t max_new : {1, 3, 8}) {
      CAPTURE(seed);
      CAPTURE(max_new);
      const int64_t batch = 5, vocab = 7;
      Model model = random_model(seed, vocab);
      FakeDecoder decoder(model, iota(batch));
      GreedyResult result = greedy_decode(decoder, batch, {.max_new_tokens = max_new});

      std::vector<std::pair<std::vector<int64_t>, double>> expected;
      size_t width = 0;
      for (int64_t s = 0; s < batch; ++s) {
        expected.push_back(naive_greedy(model, s, max_new));
        width = std::max(width, expected.back().first.size());
      }
      REQUIRE(result.tokens.shape() == Shape{batch, static_cast<int64_t>(width)});
      for (int64_t s = 0; s < batch; ++s) {
        CAPTURE(s);
        auto row = result.tokens.select(0, s).to_vector<int64_t>();
        auto want = expected[static_cast<size_t>(s)].first;
        want.resize(width, kPad);  // PAD after EOS
        CHECK(row == want);
        CHECK(result.log_probs[static_cast<size_t>(s)] == expected[static_cast<size_t>(s)].second);
      }
      // Every step sees only the sentences that have not produced EOS yet.
      for (size_t step = 0; step < decoder.rows_per_step.size(); ++step) {
        int64_t unfinished = 0;
        for (const auto& e : expected) unfinished += e.first.size() > step + 1;
        CHECK(decoder.rows_per_step[step] == unfinished);
      }
    }
  }
}

TEST_CASE("greedy_decode: BOS first, PAD after EOS, finished rows dropped, early stop (scripted)") {
  const double l9 = static_cast<float>(std::log(0.9));
  SUBCASE("max_new_tokens reached") {
    // Sentence 0 says "5 EOS", sentence 1 "EOS", sentence 2 "4 4 4 4 ...": after step 1 sentence 1 is
    // dropped (keep rows 0 and 2), after step 2 sentence 0 (keep row 1 of 2); sentence 2 hits the limit.
    FakeDecoder decoder(scripted_model({{5, kEos}, {kEos}, {4, 4, 4, 4, 4, 4}}, 6), iota(3));
    GreedyResult result = greedy_decode(decoder, 3, {.max_new_tokens = 4});
    check_close(result.tokens, from_vector<int64_t>({1, 5, 2, 0, 0, 1, 2, 0, 0, 0, 1, 4, 4, 4, 4}, {3, 5}), 0, 0);
    CHECK(result.log_probs == std::vector<double>{2 * l9, l9, 4 * l9});
    CHECK(result.lengths == std::vector<int64_t>{2, 1, 4});
    CHECK(decoder.rows_per_step == std::vector<int64_t>{3, 2, 1, 1});
    CHECK(decoder.selections == std::vector<std::vector<int64_t>>{{0, 2}, {1}});
  }
  SUBCASE("every sentence ends before max_new_tokens") {
    FakeDecoder decoder(scripted_model({{5, kEos}, {kEos}, {4, 4, kEos}}, 6), iota(3));
    GreedyResult result = greedy_decode(decoder, 3, {.max_new_tokens = 10});
    check_close(result.tokens, from_vector<int64_t>({1, 5, 2, 0, 1, 2, 0, 0, 1, 4, 4, 2}, {3, 4}), 0, 0);
    CHECK(decoder.rows_per_step == std::vector<int64_t>{3, 2, 1});
  }
  SUBCASE("other special token ids") {
    // BOS 3, EOS 4, PAD 5; sentence 0 says "4", sentence 1 "0 4".
    FakeDecoder decoder(scripted_model({{4}, {0, 4}}, 6), iota(2), 3);
    GreedyResult result = greedy_decode(decoder, 2, {.max_new_tokens = 3, .sos_id = 3, .eos_id = 4, .pad_id = 5});
    check_close(result.tokens, from_vector<int64_t>({3, 4, 5, 3, 0, 4}, {2, 3}), 0, 0);
  }
}

TEST_CASE("beam_search with beam 1 and no length penalty is greedy_decode") {
  for (uint64_t seed : {4, 5, 6, 7}) {
    CAPTURE(seed);
    const int64_t batch = 6, vocab = 9, max_new = 7;
    Model model = random_model(seed, vocab);
    FakeDecoder greedy_decoder(model, iota(batch)), beam_decoder(model, iota(batch));
    GreedyResult greedy = greedy_decode(greedy_decoder, batch, {.max_new_tokens = max_new});
    auto beams = beam_search(beam_decoder, batch, {.beam_size = 1, .max_new_tokens = max_new, .length_penalty = 0});
    REQUIRE(beams.size() == static_cast<size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) {
      CAPTURE(s);
      REQUIRE(beams[static_cast<size_t>(s)].size() == 1);
      const Hypothesis& h = beams[static_cast<size_t>(s)][0];
      std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
      std::vector<int64_t> want(row.begin() + 1, row.begin() + 1 + static_cast<std::ptrdiff_t>(h.tokens.size()));
      CHECK(h.tokens == want);
      CHECK((h.tokens.size() + 1 == row.size() || row[h.tokens.size() + 1] == kPad));
      CHECK(h.log_prob == greedy.log_probs[static_cast<size_t>(s)]);
      CHECK(h.score == h.log_prob);
    }
  }
}

TEST_CASE("beam_search returns n-best lists in score order, each scored as the model says") {
  const int64_t batch = 4, vocab = 8, max_new = 6;
  for (double alpha : {0.0, 0.6, 1.2}) {
    CAPTURE(alpha);
    Model model = random_model(11, vocab);
    FakeDecoder decoder(model, iota(batch));
    auto results = beam_search(decoder, batch, {.beam_size = 5, .max_new_tokens = max_new, .length_penalty = alpha,
                                                .nbest = 4});
    REQUIRE(results.size() == static_cast<size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) {
      CAPTURE(s);
      const auto& hyps = results[static_cast<size_t>(s)];
      REQUIRE(hyps.size() == 4);
      for (size_t i = 0; i < hyps.size(); ++i) {
        const Hypothesis& h = hyps[i];
        REQUIRE(!h.tokens.empty());
        CHECK(static_cast<int64_t>(h.tokens.size()) <= max_new);
        // EOS only at the end; without EOS the hypothesis used up max_new_tokens.
        CHECK(std::count(h.tokens.begin(), h.tokens.end(), kEos) == (h.tokens.back() == kEos ? 1 : 0));
        if (h.tokens.back() != kEos) CHECK(static_cast<int64_t>(h.tokens.size()) == max_new);
        // The model's own numbers along the hypothesis.
        std::vector<int64_t> prefix{kBos};
        double sum = 0;
        for (int64_t t : h.tokens) {
          sum += model(s, prefix)[static_cast<size_t>(t)];
          prefix.push_back(t);
        }
        CHECK(h.log_prob == doctest::Approx(sum).epsilon(1e-12));
        CHECK(h.score == doctest::Approx(sum / gnmt(h.tokens.size(), alpha)).epsilon(1e-12));
        if (i > 0) {
          CHECK(hyps[i - 1].score >= h.score);
          CHECK(hyps[i - 1].tokens != h.tokens);
        }
      }
    }
    CHECK(decoder.rows_per_step.front() == batch);
    for (int64_t rows : decoder.rows_per_step) CHECK(rows <= batch * 5);
  }
}

// A decoder may return logits (Scores::Logits): the searches normalise them as log_softmax would; or
// probabilities (Scores::Probabilities), whose log they take. The log-probabilities come back within
// float32's rounding; the tokens exactly, with and without banned tokens, and with the vocabulary no
// larger than what beam search ranks (the banned then ranked last rather than passed over).
TEST_CASE("the searches take logits and probabilities as they take log-probabilities") {
  const int64_t batch = 4;
  for (int64_t vocab : {9, 4}) {
    for (const std::vector<int64_t>& banned :
         {std::vector<int64_t>{}, std::vector<int64_t>{vocab - 1}, std::vector<int64_t>{kPad, vocab - 1}}) {
      CAPTURE(vocab);
      CAPTURE(banned.size());
      const Model model = random_model(17, vocab);
      auto decode = [&](IncrementalDecoder::Scores gives, int64_t beam) {
        FakeDecoder decoder(model, iota(batch));
        decoder.gives = gives;
        return beam_search(decoder, batch,
                           {.beam_size = beam, .max_new_tokens = 5, .nbest = beam, .banned_ids = banned});
      };
      for (auto gives : {IncrementalDecoder::Scores::Logits, IncrementalDecoder::Scores::Probabilities}) {
        CAPTURE(static_cast<int>(gives));
        for (int64_t beam : {1, 3}) {
          CAPTURE(beam);
          const auto from_log_probs = decode(IncrementalDecoder::Scores::LogProbs, beam);
          const auto from_other = decode(gives, beam);
          for (size_t s = 0; s < from_log_probs.size(); ++s) {
            REQUIRE(from_other[s].size() == from_log_probs[s].size());
            for (size_t i = 0; i < from_log_probs[s].size(); ++i) {
              const std::vector<int64_t>& tokens = from_other[s][i].tokens;
              CHECK(tokens == from_log_probs[s][i].tokens);
              CHECK(from_other[s][i].log_prob == doctest::Approx(from_log_probs[s][i].log_prob).epsilon(1e-5));
              for (int64_t token : banned) CHECK(std::count(tokens.begin(), tokens.end(), token) == 0);
            }
          }
        }
        FakeDecoder log_probs(model, iota(batch)), other(model, iota(batch));
        other.gives = gives;
        check_close(greedy_decode(other, batch, {.max_new_tokens = 5, .banned_ids = banned}).tokens,
                    greedy_decode(log_probs, batch, {.max_new_tokens = 5, .banned_ids = banned}).tokens, 0, 0);
      }
    }
  }
}

TEST_CASE("beam_search with a beam wider than the search space is exhaustive search") {
  // V = 4 and at most 3 new tokens: 1 + 3 + 9 hypotheses end in EOS and 27 run out of length, 40 in
  // all; at most 9 are ever live at once, so a beam of 64 prunes nothing and never stops early, and
  // its 40-best list must be the brute-force enumeration sorted by score.
  const int64_t batch = 3, vocab = 4, max_new = 3;
  for (double alpha : {0.0, 0.6, 2.0, -0.7}) {
    CAPTURE(alpha);
    Model model = random_model(21, vocab);
    FakeDecoder decoder(model, iota(batch));
    auto results = beam_search(decoder, batch, {.beam_size = 64, .max_new_tokens = max_new, .length_penalty = alpha,
                                                .nbest = 40});
    for (int64_t s = 0; s < batch; ++s) {
      CAPTURE(s);
      std::vector<Hypothesis> all = enumerate_all(model, s, vocab, max_new, alpha);
      REQUIRE(all.size() == 40);
      check_same(results[static_cast<size_t>(s)], all);
    }
  }
}

TEST_CASE("decoding sentences together gives each sentence's result when decoded alone") {
  const int64_t batch = 5, vocab = 6;
  Model model = random_model(31, vocab);
  FakeDecoder greedy_batched(model, iota(batch)), beam_batched(model, iota(batch));
  GreedyResult greedy = greedy_decode(greedy_batched, batch, {.max_new_tokens = 9});
  BeamOptions options{.beam_size = 3, .max_new_tokens = 9, .length_penalty = 0.8, .nbest = 3};
  auto beams = beam_search(beam_batched, batch, options);
  for (int64_t s = 0; s < batch; ++s) {
    CAPTURE(s);
    FakeDecoder greedy_alone(model, {s}), beam_alone(model, {s});
    GreedyResult one = greedy_decode(greedy_alone, 1, {.max_new_tokens = 9});
    std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
    std::vector<int64_t> alone = one.tokens.select(0, 0).to_vector<int64_t>();
    alone.resize(row.size(), kPad);
    CHECK(row == alone);
    CHECK(greedy.log_probs[static_cast<size_t>(s)] == one.log_probs[0]);
    auto single = beam_search(beam_alone, 1, options);
    check_same(beams[static_cast<size_t>(s)], single[0]);
  }
}

TEST_CASE("a forced prefix: greedy search continues it as a naive loop does, beam search as enumeration") {
  // Sentence s must begin with prefixes[s] (none for sentence 0; sentence 3's leaves one token to
  // generate). Both kinds of step result.
  const int64_t batch = 4, vocab = 4, max_new = 4;
  const std::vector<std::vector<int64_t>> prefixes = {{}, {3}, {3, 0}, {1, 3, 0}};
  Model model = random_model(17, vocab);
  for (auto gives : {IncrementalDecoder::Scores::LogProbs, IncrementalDecoder::Scores::Logits,
                     IncrementalDecoder::Scores::Probabilities}) {
    CAPTURE(static_cast<int>(gives));
    // From logits or probabilities the forced tokens' log-probabilities go through log_softmax or log:
    // float rounding.
    const double tolerance = gives == IncrementalDecoder::Scores::LogProbs ? 0 : 1e-6;
    FakeDecoder greedy_decoder(model, iota(batch)), beam_decoder(model, iota(batch));
    greedy_decoder.gives = beam_decoder.gives = gives;
    GreedyResult greedy = greedy_decode(greedy_decoder, batch, {.max_new_tokens = max_new, .prefixes = prefixes});
    // A beam wider than the search space: the search must return every completion of the prefix.
    auto beams = beam_search(beam_decoder, batch,
                             {.beam_size = 256, .max_new_tokens = max_new, .length_penalty = 0.6, .nbest = 256,
                              .prefixes = prefixes});
    for (int64_t s = 0; s < batch; ++s) {
      CAPTURE(s);
      const auto& prefix = prefixes[static_cast<size_t>(s)];
      auto [want, want_log_prob] = naive_greedy(model, s, max_new, prefix);
      std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
      row.resize(want.size());
      CHECK(row == want);
      CHECK(greedy.lengths[static_cast<size_t>(s)] == static_cast<int64_t>(want.size()) - 1);
      CHECK(std::abs(greedy.log_probs[static_cast<size_t>(s)] - want_log_prob) <= tolerance);

      const std::vector<Hypothesis> all = enumerate_all(model, s, vocab, max_new, 0.6, prefix);
      const std::vector<Hypothesis>& found = beams[static_cast<size_t>(s)];
      REQUIRE(found.size() == all.size());
      for (size_t i = 0; i < all.size(); ++i) {
        CAPTURE(i);
        CHECK(std::equal(prefix.begin(), prefix.end(), found[i].tokens.begin()));
        if (tolerance == 0) CHECK(found[i].tokens == all[i].tokens);
        CHECK(std::abs(found[i].log_prob - all[i].log_prob) <= tolerance + 1e-12);
        CHECK(std::abs(found[i].score - all[i].score) <= tolerance + 1e-12);
      }
    }
    // Beam search holds one row for a sentence while its prefix lasts: step 2 has sentence 0's 3 rows
    // (every token but EOS, forked after step 1) and one each for sentences 1-3 (their first prefix
    // token taken, sentence 1's last).
    CHECK(beam_decoder.rows_per_step[1] == 3 + 1 + 1 + 1);
  }
}

TEST_CASE("a forced prefix in a beam: sentences with and without one, decoded together or alone") {
  const int64_t batch = 4, vocab = 7, max_new = 9;
  const std::vector<std::vector<int64_t>> prefixes = {{3, 4}, {}, {6}, {5, 5, 5}};
  Model model = random_model(23, vocab);
  BeamOptions options{.beam_size = 3, .max_new_tokens = max_new, .length_penalty = 0.8, .nbest = 3,
                      .prefixes = prefixes};
  FakeDecoder together(model, iota(batch));
  auto beams = beam_search(together, batch, options);
  for (int64_t s = 0; s < batch; ++s) {
    CAPTURE(s);
    FakeDecoder alone(model, {s});
    BeamOptions one = options;
    one.prefixes = {prefixes[static_cast<size_t>(s)]};
    check_same(beams[static_cast<size_t>(s)], beam_search(alone, 1, one)[0]);
    for (const Hypothesis& h : beams[static_cast<size_t>(s)]) {
      const auto& prefix = prefixes[static_cast<size_t>(s)];
      CHECK(std::equal(prefix.begin(), prefix.end(), h.tokens.begin()));
    }
  }
}

TEST_CASE("a sentence's own token limit gives what decoding it alone with that limit gives") {
  // Limits past max_new_tokens (9 > 7) are capped by it; the rest bind sentences the model keeps going.
  const int64_t batch = 5, vocab = 6, max_new = 7;
  const std::vector<int64_t> limits = {1, 4, 9, 2, 6};
  Model model = random_model(31, vocab);
  FakeDecoder greedy_batched(model, iota(batch)), beam_batched(model, iota(batch));
  GreedyResult greedy =
      greedy_decode(greedy_batched, batch, {.max_new_tokens = max_new, .sentence_max_new_tokens = limits});
  BeamOptions options{.beam_size = 3, .max_new_tokens = max_new, .length_penalty = 0.8, .nbest = 3,
                      .sentence_max_new_tokens = limits};
  auto beams = beam_search(beam_batched, batch, options);
  for (int64_t s = 0; s < batch; ++s) {
    CAPTURE(s);
    const int64_t own = std::min(limits[static_cast<size_t>(s)], max_new);
    FakeDecoder greedy_alone(model, {s}), beam_alone(model, {s});
    GreedyResult one = greedy_decode(greedy_alone, 1, {.max_new_tokens = own});
    std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
    std::vector<int64_t> alone = one.tokens.select(0, 0).to_vector<int64_t>();
    alone.resize(row.size(), kPad);
    CHECK(row == alone);
    CHECK(greedy.log_probs[static_cast<size_t>(s)] == one.log_probs[0]);
    BeamOptions alone_options = options;
    alone_options.max_new_tokens = own;
    alone_options.sentence_max_new_tokens.clear();
    check_same(beams[static_cast<size_t>(s)], beam_search(beam_alone, 1, alone_options)[0]);
  }
  // Scripted sentences that never end stop at exactly their limits, each dropped when it gets there.
  FakeDecoder endless(scripted_model({{4, 4, 4, 4, 4}, {5, 5, 5, 5, 5}, {4, 5, 4, 5, 4}}, 6), iota(3));
  GreedyResult stopped = greedy_decode(endless, 3, {.max_new_tokens = 5, .sentence_max_new_tokens = {2, 4, 3}});
  check_close(stopped.tokens, from_vector<int64_t>({1, 4, 4, 0, 0, 1, 5, 5, 5, 5, 1, 4, 5, 4, 0}, {3, 5}), 0, 0);
  CHECK(stopped.lengths == std::vector<int64_t>{2, 4, 3});
  CHECK(endless.rows_per_step == std::vector<int64_t>{3, 3, 2, 1});
  CHECK(endless.selections == std::vector<std::vector<int64_t>>{{1, 2}, {0}});
}

TEST_CASE("beam_search drops a sentence's rows once it is done (scripted)") {
  // V = 6, p(script token) = 0.9, every other token 0.02; beam 2, no length penalty, max 6.
  // Sentence 1 says "EOS". Step 1 (its one row): EOS ranks first -> finished (log 0.9); tokens 0 and
  // 1 (ties go to the lower id) become the two live beams. Step 2: both rows put EOS first, so the
  // two best candidates are "0 EOS" and "1 EOS" (log 0.02 + log 0.9 each) -> 3 finished; the best
  // live beam has 2 log 0.02, below the 2nd best finished, so sentence 1 is done.
  // Sentence 0 says "3 3 3 3 3 3": EOS never ranks among its top 2 (token 0 ties with it and wins),
  // so it keeps 2 live rows until max_new_tokens, where "3 3 3 3 3 3" and "3 3 3 3 3 0" (the first of
  // the ties at 5 log 0.9 + log 0.02) are finished as they stand. Its "EOS" of step 1 (log 0.02) would
  // beat the latter, but ranked below the beam it was never kept.
  // Rows per step: 1 + 1, then 2 + 2, then 2 for sentence 0 alone.
  FakeDecoder decoder(scripted_model({{3, 3, 3, 3, 3, 3}, {kEos}}, 6), iota(2));
  auto results = beam_search(decoder, 2, {.beam_size = 2, .max_new_tokens = 6, .length_penalty = 0, .nbest = 2});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{2, 4, 2, 2, 2, 2});
  const double l9 = static_cast<float>(std::log(0.9)), l02 = static_cast<float>(std::log(0.02));
  REQUIRE(results[0].size() == 2);
  CHECK(results[0][0].tokens == std::vector<int64_t>{3, 3, 3, 3, 3, 3});
  CHECK(results[0][0].log_prob == doctest::Approx(6 * l9).epsilon(1e-12));
  CHECK(results[0][1].tokens == std::vector<int64_t>{3, 3, 3, 3, 3, 0});
  CHECK(results[0][1].log_prob == doctest::Approx(5 * l9 + l02).epsilon(1e-12));
  REQUIRE(results[1].size() == 2);
  CHECK(results[1][0].tokens == std::vector<int64_t>{kEos});
  CHECK(results[1][0].log_prob == l9);
  CHECK(results[1][1].tokens == std::vector<int64_t>{0, kEos});
  CHECK(results[1][1].log_prob == l02 + l9);
}

TEST_CASE("beam_search keeps a hypothesis in its parent's decoder row where it can (scripted)") {
  // Beam 3, no length penalty. Step 1 (one row): "3" (0.4), "4" (0.35), "5" (0.2) live, in decoder
  // rows 0, 1 and 2, all continuing row 0. Step 2 ranks "4 0" (log 0.35 + log 0.9 = -1.155), "3 0"
  // (log 0.4 + log 0.6 = -1.427) and "3 4" (log 0.4 + log 0.3 = -2.120) above "5 0" (-2.303): "4 0"
  // stays in its parent's row 1 and "3 0" in row 0, so only row 2 moves (it takes "3 4", from row 0):
  // the selection is {0, 1, 0}, where rows in rank order would move every row ({1, 0, 0}). Step 3
  // ends all three (EOS 0.9 after any other prefix); each must carry its own prefix's scores.
  Model model = table_model({{{}, {0.02, 0.02, 0.01, 0.4, 0.35, 0.2}},
                             {{3}, {0.6, 0.04, 0.005, 0.025, 0.3, 0.03}},
                             {{4}, {0.9, 0.002, 0.005, 0.001, 0.002, 0.09}},
                             {{5}, {0.5, 0.1, 0.005, 0.195, 0.1, 0.1}}},
                            {0.02, 0.02, 0.9, 0.02, 0.02, 0.02});
  FakeDecoder decoder(model, {0});
  auto results = beam_search(decoder, 1, {.beam_size = 3, .max_new_tokens = 10, .length_penalty = 0, .nbest = 3});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{1, 3, 3});
  CHECK(decoder.selections == std::vector<std::vector<int64_t>>{{0, 0, 0}, {0, 1, 0}});
  auto log = [](double p) { return static_cast<double>(static_cast<float>(std::log(p))); };
  REQUIRE(results[0].size() == 3);
  CHECK(results[0][0].tokens == std::vector<int64_t>{4, 0, kEos});
  CHECK(results[0][0].log_prob == doctest::Approx(log(0.35) + log(0.9) + log(0.9)).epsilon(1e-12));
  CHECK(results[0][1].tokens == std::vector<int64_t>{3, 0, kEos});
  CHECK(results[0][1].log_prob == doctest::Approx(log(0.4) + log(0.6) + log(0.9)).epsilon(1e-12));
  CHECK(results[0][2].tokens == std::vector<int64_t>{3, 4, kEos});
  CHECK(results[0][2].log_prob == doctest::Approx(log(0.4) + log(0.3) + log(0.9)).epsilon(1e-12));
}

TEST_CASE("beam_search: an EOS ranked below the beam is not kept") {
  // Beam 2, nbest 2, alpha = -1 (lp(L) = 6 / (5 + L), score = sum * (5 + L) / 6), max_new_tokens 10.
  // Step 1 (p: 0 0.3, 1 0.05, EOS 0.15, 3 0.5): "3" (-0.693) and "0" (-1.204) live.
  // Step 2, ranked: "3 EOS" (log 0.5 + log 0.5 = -1.386) finishes (score -1.617); "3 3" (-0.693 +
  // log 0.404 = -1.600) lives; "0 EOS" (-1.204 + log 0.609 = -1.700) ranks 3rd, below the beam, and is
  // dropped; "0 3" (-2.408) lives. Kept, "0 EOS" would have been the 2nd finished (score -1.983), and
  // "3 3" could reach at most -1.600 * 8/6 = -2.133 below it, so the search would stop with "0 EOS" in
  // the 2-best. Dropped, one finished is not enough and step 3 (p(EOS) = 0.9 after any other prefix)
  // finishes "3 3 EOS" (-1.705, score -2.274) and "0 3 EOS"; the live beams (<= -1.600 + log(0.1/3))
  // cannot come near, so the search stops with the 2-best "3 EOS", "3 3 EOS".
  Model model = table_model({{{}, {0.3, 0.05, 0.15, 0.5}},
                             {{3}, {0.048, 0.048, 0.5, 0.404}},
                             {{0}, {0.05, 0.041, 0.609, 0.3}}},
                            {0.1 / 3, 0.1 / 3, 0.9, 0.1 / 3});
  FakeDecoder decoder(model, {0});
  auto results = beam_search(decoder, 1, {.beam_size = 2, .max_new_tokens = 10, .length_penalty = -1, .nbest = 2});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{1, 2, 2});
  REQUIRE(results[0].size() == 2);
  CHECK(results[0][0].tokens == std::vector<int64_t>{3, kEos});
  CHECK(results[0][0].score == doctest::Approx(-1.617).epsilon(1e-3));
  CHECK(results[0][1].tokens == std::vector<int64_t>{3, 3, kEos});
  CHECK(results[0][1].score == doctest::Approx(-2.274).epsilon(1e-3));
}

TEST_CASE("ties go to the earlier hypothesis, then the lower token id") {
  // Uniform over V = 8: every candidate of a step ties. Greedy takes token 0 each time. Beam 6, max 2:
  // step 1 ranks tokens 0, 1, EOS, 3, 4, 5, 6 (a row's 7 best, lowest id first): "EOS" (rank 2)
  // finishes, the other six live. Step 2 walks the 42 tied candidates hypothesis by hypothesis: "0 0",
  // "0 1", "0 EOS" (rank 2, finished), "0 3" ... "0 6" fill the beam and are finished at max length,
  // after "0 EOS". Best first (stable): "EOS", then "0 EOS", "0 0", "0 1", "0 3", "0 4".
  Model model = table_model({}, std::vector<double>(8, 0.125));
  FakeDecoder greedy_decoder(model, {0}), beam_decoder(model, {0});
  GreedyResult greedy = greedy_decode(greedy_decoder, 1, {.max_new_tokens = 2});
  check_close(greedy.tokens, from_vector<int64_t>({kBos, 0, 0}, {1, 3}), 0, 0);
  auto results = beam_search(beam_decoder, 1, {.beam_size = 6, .max_new_tokens = 2, .length_penalty = 0, .nbest = 6});
  std::vector<std::vector<int64_t>> tokens;
  for (const Hypothesis& h : results[0]) tokens.push_back(h.tokens);
  CHECK(tokens == std::vector<std::vector<int64_t>>{{kEos}, {0, kEos}, {0, 0}, {0, 1}, {0, 3}, {0, 4}});
}

TEST_CASE("BeamStop::Exact keeps going while a live hypothesis could still win under the length penalty") {
  // A live hypothesis with sum S and length t can at best end with sum S at a length L in
  // [t + 1, max_new_tokens], i.e. score max(S / lp(t + 1), S / lp(max)), lp(L) = ((5 + L) / 6)^alpha.
  // max_new_tokens is 10 in both cases.
  SUBCASE("alpha = 1: the heuristic S / lp(t) would stop too soon") {
    // Beam 1. Step 1: "EOS" (p 0.5) finishes with score log 0.5 = -0.693; "3" (p 0.48) lives with
    // S = log 0.48 = -0.734 < -0.693, but S / lp(10) = -0.734 / 2.5 = -0.294 may still win. Step 2:
    // "3 EOS" (p 0.99) scores (log 0.48 + log 0.99) / (7/6) = -0.638 and wins. The best live beam,
    // log 0.48 + log(0.01/3) = -6.44, can reach at most -6.44 / (8/6) < -0.638: done after 2 steps.
    Model model = table_model({{{}, {0.01, 0.01, 0.5, 0.48}}}, {0.01 / 3, 0.01 / 3, 0.99, 0.01 / 3});
    FakeDecoder decoder(model, {0});
    auto results = beam_search(
        decoder, 1, {.beam_size = 1, .max_new_tokens = 10, .length_penalty = 1.0, .stop = BeamStop::Exact});
    CHECK(decoder.rows_per_step == std::vector<int64_t>{1, 1});
    REQUIRE(results[0].size() == 1);
    CHECK(results[0][0].tokens == std::vector<int64_t>{3, kEos});
    double sum = static_cast<float>(std::log(0.48)) + static_cast<double>(static_cast<float>(std::log(0.99)));
    CHECK(results[0][0].log_prob == doctest::Approx(sum).epsilon(1e-12));
    CHECK(results[0][0].score == doctest::Approx(sum / (7.0 / 6.0)).epsilon(1e-12));
    CHECK(results[0][0].score == doctest::Approx(-0.638).epsilon(1e-3));
  }
  SUBCASE("alpha = -1: S / lp(max) alone would stop too soon") {
    // lp(L) = 6 / (5 + L), so score = sum * (5 + L) / 6. Beam 2.
    // Step 1 (p: 0 0.15, 1 0.05, EOS 0.5, 3 0.3): "EOS" finishes (score -0.693); "3" (-1.204) and
    // "0" (-1.897) live. Step 2: after "3", p(3) = 0.9, p(EOS) = 0.05; after "0", p(EOS) = 0.9: ranked,
    // "3 3" (-1.309) lives, "0 EOS" (-2.002) finishes with score -2.002 * 7/6 = -2.336, "3 0" (-4.71)
    // lives. Two finished, the 2nd best -2.336; "3 3" can reach -1.309 * 8/6 = -1.745 (at L = 3) but
    // only -1.309 * 15/6 = -3.27 at L = 10, so only the exact bound goes on. Step 3: "3 3 EOS" (-1.414)
    // finishes with score -1.414 * 8/6 = -1.885, the new 2nd best; the best live beam (-4.71) can
    // reach at most -4.71 * 9/6 = -7.07: done after 3 steps.
    Model model = table_model({{{}, {0.15, 0.05, 0.5, 0.3}}, {{3}, {0.03, 0.02, 0.05, 0.9}}},
                              {0.1 / 3, 0.1 / 3, 0.9, 0.1 / 3});
    FakeDecoder decoder(model, {0});
    auto results =
        beam_search(decoder, 1, {.beam_size = 2, .max_new_tokens = 10, .length_penalty = -1.0, .nbest = 2,
                                 .stop = BeamStop::Exact});
    CHECK(decoder.rows_per_step == std::vector<int64_t>{1, 2, 2});
    REQUIRE(results[0].size() == 2);
    CHECK(results[0][0].tokens == std::vector<int64_t>{kEos});
    CHECK(results[0][1].tokens == std::vector<int64_t>{3, 3, kEos});
    CHECK(results[0][1].score == doctest::Approx(-1.885).epsilon(1e-3));
  }
}

TEST_CASE("BeamStop::BeamFinished ends a sentence once beam_size hypotheses have finished") {
  // The alpha = 1 case above: after step 1, "EOS" has finished (score -0.693) and "3" lives. The exact
  // rule goes on and finds "3 EOS" (-0.638); fairseq's rule stops at once with "EOS".
  Model model = table_model({{{}, {0.01, 0.01, 0.5, 0.48}}}, {0.01 / 3, 0.01 / 3, 0.99, 0.01 / 3});
  FakeDecoder decoder(model, {0});
  auto results = beam_search(
      decoder, 1, {.beam_size = 1, .max_new_tokens = 10, .length_penalty = 1.0, .stop = BeamStop::BeamFinished});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{1});
  REQUIRE(results[0].size() == 1);
  CHECK(results[0][0].tokens == std::vector<int64_t>{kEos});
  CHECK(results[0][0].score == doctest::Approx(std::log(0.5)).epsilon(1e-6));
}

TEST_CASE("length_penalty is GNMT's ((5 + length) / 6)^alpha") {
  CHECK(length_penalty(1, 0.6) == 1.0);
  CHECK(length_penalty(7, 1.0) == doctest::Approx(2.0));
  CHECK(length_penalty(13, 0.5) == doctest::Approx(std::sqrt(3.0)));
  CHECK(length_penalty(4, 0.0) == 1.0);
}

TEST_CASE("bad options and misbehaving decoders raise mf::Error") {
  Model model = random_model(1, 5);
  FakeDecoder decoder(model, iota(2));
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.beam_size = 0}), "beam_search: beam_size must be at least 1, got 0",
                       Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.beam_size = 3, .nbest = 4}),
                       "beam_search: nbest must be between 1 and beam_size (3), got 4", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.nbest = 0}),
                       "beam_search: nbest must be between 1 and beam_size (4), got 0", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.max_new_tokens = 0}),
                       "beam_search: max_new_tokens must be at least 1, got 0", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.length_penalty = NAN}),
                       "beam_search: length_penalty must be finite, got nan", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.max_new_tokens = 0}),
                       "greedy_decode: max_new_tokens must be at least 1, got 0", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 0), "greedy_decode: batch_size must be at least 1, got 0", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.pad_id = -1}),
                       "greedy_decode: special token ids must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.sentence_max_new_tokens = {3}}),
                       "greedy_decode: sentence_max_new_tokens holds 1 limits for 2 sentences", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.sentence_max_new_tokens = {3, 0}}),
                       "beam_search: sentence_max_new_tokens must be at least 1, got 0 for sentence 1", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.prefixes = {{3}}}),
                       "greedy_decode: prefixes holds 1 lists for 2 sentences", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.max_new_tokens = 3, .prefixes = {{}, {3, 4, 3}}}),
                       "beam_search: the prefix of sentence 1 holds 3 tokens, which leaves none to generate under its "
                       "limit of 3", Error);
  CHECK_THROWS_WITH_AS(beam_search(decoder, 2, {.prefixes = {{3, kEos}, {}}}),
                       "beam_search: the prefix of sentence 0 holds token 2, the end of sentence", Error);
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.prefixes = {{-1}, {}}}),
                       "greedy_decode: the prefix of sentence 0 holds token -1, not a token id", Error);
  CHECK(decoder.rows_per_step.empty());  // options are checked before the decoder is touched

  SUBCASE("special token outside the vocabulary") {
    CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.eos_id = 5}),
                         "greedy_decode: special token id 5 is outside the decoder's vocabulary of 5 tokens", Error);
  }
  SUBCASE("a step result of the wrong shape") {
    struct OneRow : IncrementalDecoder {
      Tensor step(const Tensor&) override { return zeros({1, 5}); }
      void select_rows(const Tensor&) override {}
    } one_row;
    CHECK_THROWS_WITH_AS(
        beam_search(one_row, 2),
        "beam_search: decoder.step was fed 2 tokens and must return float scores [2, V], got float32 [1, 5]",
        Error);
  }
  SUBCASE("a vocabulary that changes between steps") {
    struct Shrinking : IncrementalDecoder {
      Tensor step(const Tensor& tokens) override { return zeros({tokens.size(0), vocab--}); }
      void select_rows(const Tensor&) override {}
      int64_t vocab = 5;
    } shrinking;
    CHECK_THROWS_WITH_AS(
        greedy_decode(shrinking, 2),
        "greedy_decode: decoder.step returned 4 scores per row, but 5 on the first step", Error);
  }
  SUBCASE("a prefix token outside the vocabulary") {
    CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.prefixes = {{3, 5}, {}}}),
                         "greedy_decode: prefix token id 5 is outside the decoder's vocabulary of 5 tokens", Error);
  }
  SUBCASE("NaN log-probabilities") {
    FakeDecoder nan_decoder([](int64_t, const std::vector<int64_t>&) { return std::vector<double>(4, NAN); }, {0});
    CHECK_THROWS_WITH_AS(greedy_decode(nan_decoder, 1), "greedy_decode: decoder.step returned NaN scores",
                         Error);
  }
}

TEST_CASE("banned tokens are never generated: greedy and beam search take the best of the others") {
  // Token 3 is the model's first choice at the start; with it banned, "4 EOS" is the best sentence.
  const Model model = table_model(
      {{{}, {0.02, 0.02, 0.06, 0.6, 0.25, 0.05}}, {{4}, {0.02, 0.02, 0.8, 0.1, 0.03, 0.03}}},
      {0.02, 0.02, 0.9, 0.02, 0.02, 0.02});
  FakeDecoder free(model, iota(1));
  check_close(greedy_decode(free, 1, {.max_new_tokens = 4}).tokens, from_vector<int64_t>({kBos, 3, kEos}, {1, 3}), 0,
              0);
  FakeDecoder greedy(model, iota(1));
  check_close(greedy_decode(greedy, 1, {.max_new_tokens = 4, .banned_ids = {3}}).tokens,
              from_vector<int64_t>({kBos, 4, kEos}, {1, 3}), 0, 0);
  FakeDecoder beam(model, iota(1));
  const auto found = beam_search(beam, 1, {.beam_size = 3, .max_new_tokens = 4, .nbest = 3, .banned_ids = {3}});
  REQUIRE(!found[0].empty());
  CHECK(found[0][0].tokens == std::vector<int64_t>{4, kEos});
  for (const Hypothesis& h : found[0]) CHECK(std::find(h.tokens.begin(), h.tokens.end(), 3) == h.tokens.end());
  // With 3 and 4 banned, the first step's best is <eos> (0.06) over token 5 (0.05); with <eos> banned as
  // well, token 5.
  FakeDecoder two(model, iota(1));
  check_close(greedy_decode(two, 1, {.max_new_tokens = 4, .banned_ids = {4, 3}}).tokens,
              from_vector<int64_t>({kBos, kEos}, {1, 2}), 0, 0);
  FakeDecoder three(model, iota(1));
  check_close(greedy_decode(three, 1, {.max_new_tokens = 1, .banned_ids = {4, 3, kEos}}).tokens,
              from_vector<int64_t>({kBos, 5}, {1, 2}), 0, 0);
  FakeDecoder outside(model, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(outside, 1, {.banned_ids = {3, 6}}),
                       doctest::Contains("banned token id 6 is outside"), Error);
  FakeDecoder negative(model, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(negative, 1, {.banned_ids = {-1}}),
                       doctest::Contains("banned token id -1 is outside"), Error);
}

TEST_CASE("many banned tokens among each row's best: the searches pass over them as over tokens of probability 0") {
  // Six banned tokens, every row's favourites (their logits raised by 5), more than the searches first
  // make room for among a row's best: they must rank again with room for all six. The reference is the
  // same model with no bans and log-probabilities of -inf for those six, the others unchanged.
  const int64_t batch = 3, vocab = 12, max_new = 4;
  const std::vector<int64_t> banned = {3, 4, 5, 6, 7, 8};
  const auto is_banned = [&](int64_t token) { return std::find(banned.begin(), banned.end(), token) != banned.end(); };
  const Model base = random_model(23, vocab);
  const Model favouring = [&](int64_t sentence, const std::vector<int64_t>& prefix) {
    std::vector<double> logits = base(sentence, prefix);
    for (int64_t token : banned) logits[static_cast<size_t>(token)] += 5;
    return float_log_softmax(logits);
  };
  const Model ruling_out = [&](int64_t sentence, const std::vector<int64_t>& prefix) {
    std::vector<double> log_probs = favouring(sentence, prefix);
    for (int64_t token : banned) log_probs[static_cast<size_t>(token)] = -INFINITY;
    return log_probs;
  };
  FakeDecoder greedy_decoder(favouring, iota(batch));
  const GreedyResult greedy = greedy_decode(greedy_decoder, batch, {.max_new_tokens = max_new, .banned_ids = banned});
  for (int64_t s = 0; s < batch; ++s) {
    CAPTURE(s);
    auto [want, want_log_prob] =
        naive_greedy(favouring, s, max_new, {}, [&](const std::vector<int64_t>&, int64_t t) { return !is_banned(t); });
    std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
    row.resize(want.size());
    CHECK(row == want);
    CHECK(greedy.log_probs[static_cast<size_t>(s)] == want_log_prob);
  }
  FakeDecoder banning(favouring, iota(batch)), without_bans(ruling_out, iota(batch));
  const auto found =
      beam_search(banning, batch, {.beam_size = 3, .max_new_tokens = max_new, .nbest = 3, .banned_ids = banned});
  const auto expected = beam_search(without_bans, batch, {.beam_size = 3, .max_new_tokens = max_new, .nbest = 3});
  for (int64_t s = 0; s < batch; ++s) {
    CAPTURE(s);
    check_same(found[static_cast<size_t>(s)], expected[static_cast<size_t>(s)]);
    for (const Hypothesis& h : found[static_cast<size_t>(s)])
      CHECK(std::none_of(h.tokens.begin(), h.tokens.end(), is_banned));
  }
}

TEST_CASE("min_new_tokens and no_repeat_ngram_size: greedy search as a naive loop under the rules, beam search as "
          "enumeration") {
  // V = 5 and at most 4 new tokens: 341 hypotheses without rules, and a beam of 1024 is wider than any
  // step's candidates, so beam search must return every hypothesis the rules allow. min_new_tokens 7
  // outlasts every limit: no hypothesis ends in EOS.
  const int64_t batch = 3, vocab = 5, max_new = 4;
  const Model model = random_model(41, vocab);
  for (int64_t min_new : {0, 2, 4, 7}) {
    for (int64_t n : {0, 1, 2, 3}) {
      CAPTURE(min_new);
      CAPTURE(n);
      const Allowed allowed = output_rules(min_new, static_cast<size_t>(n));
      for (auto gives : {IncrementalDecoder::Scores::LogProbs, IncrementalDecoder::Scores::Logits}) {
        CAPTURE(static_cast<int>(gives));
        FakeDecoder greedy_decoder(model, iota(batch)), beam_decoder(model, iota(batch));
        greedy_decoder.gives = beam_decoder.gives = gives;
        GreedyResult greedy = greedy_decode(greedy_decoder, batch,
                                            {.max_new_tokens = max_new, .min_new_tokens = min_new,
                                             .no_repeat_ngram_size = n});
        auto beams = beam_search(beam_decoder, batch,
                                 {.beam_size = 1024, .max_new_tokens = max_new, .length_penalty = 0.6, .nbest = 1024,
                                  .min_new_tokens = min_new, .no_repeat_ngram_size = n});
        // From logits the log-probabilities go through log_softmax: float rounding.
        const double tolerance = gives == IncrementalDecoder::Scores::LogProbs ? 0 : 1e-6;
        for (int64_t s = 0; s < batch; ++s) {
          CAPTURE(s);
          auto [want, want_log_prob] = naive_greedy(model, s, max_new, {}, allowed);
          std::vector<int64_t> row = greedy.tokens.select(0, s).to_vector<int64_t>();
          row.resize(want.size());
          CHECK(row == want);
          CHECK(std::abs(greedy.log_probs[static_cast<size_t>(s)] - want_log_prob) <= tolerance);

          const std::vector<Hypothesis> all = enumerate_all(model, s, vocab, max_new, 0.6, {}, allowed);
          const std::vector<Hypothesis>& found = beams[static_cast<size_t>(s)];
          REQUIRE(found.size() == all.size());
          for (size_t i = 0; i < all.size(); ++i) {
            CAPTURE(i);
            if (tolerance == 0) CHECK(found[i].tokens == all[i].tokens);
            CHECK(std::abs(found[i].score - all[i].score) <= tolerance + 1e-12);
          }
        }
      }
    }
  }
}

TEST_CASE("min_new_tokens and no_repeat_ngram_size by hand (scripted), in beam search and in sampling") {
  // The script says "3 4 3 4 EOS" at 0.9, the other tokens sharing the rest equally (ties go to the
  // lower id). With no_repeat_ngram_size 2 the fourth token cannot be 4 ("3 4" twice): 0 takes its
  // place, and the script's EOS follows. With min_new_tokens 7 as well, EOS is banned after "3 4 3 0"
  // until 7 tokens are there: 0 ("0 0" is new), then 1 ("0 0" again is not), then 0 ("1 0"), then EOS.
  const Model model = scripted_model({{3, 4, 3, 4}}, 5);
  FakeDecoder plain(model, iota(1));
  CHECK(greedy_decode(plain, 1, {.max_new_tokens = 9}).tokens.to_vector<int64_t>() ==
        std::vector<int64_t>{kBos, 3, 4, 3, 4, kEos});
  FakeDecoder blocked(model, iota(1));
  CHECK(greedy_decode(blocked, 1, {.max_new_tokens = 9, .no_repeat_ngram_size = 2}).tokens.to_vector<int64_t>() ==
        std::vector<int64_t>{kBos, 3, 4, 3, 0, kEos});
  FakeDecoder longer(model, iota(1));
  CHECK(greedy_decode(longer, 1, {.max_new_tokens = 9, .min_new_tokens = 7, .no_repeat_ngram_size = 2})
            .tokens.to_vector<int64_t>() == std::vector<int64_t>{kBos, 3, 4, 3, 0, 0, 1, 0, kEos});

  // Beam search and sampling keep the rules on a random model: no 2-gram twice, EOS not before 4 tokens.
  const int64_t batch = 6, vocab = 6;
  const Model random = random_model(43, vocab);
  const Allowed allowed = output_rules(4, 2);
  auto keeps_rules = [&](const std::vector<int64_t>& tokens) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (!allowed(std::vector<int64_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(i)), tokens[i]))
        return false;
    return true;
  };
  FakeDecoder beam_decoder(random, iota(batch));
  for (const auto& hyps : beam_search(beam_decoder, batch, {.beam_size = 3, .max_new_tokens = 12, .nbest = 3,
                                                           .min_new_tokens = 4, .no_repeat_ngram_size = 2}))
    for (const Hypothesis& h : hyps) {
      CAPTURE(h.tokens);
      CHECK(keeps_rules(h.tokens));
    }
  Generator generator(7);
  FakeDecoder sample_decoder(random, iota(batch));
  GreedyResult drawn = greedy_decode(sample_decoder, batch,
                                     {.max_new_tokens = 12, .min_new_tokens = 4, .no_repeat_ngram_size = 2,
                                      .sampling = {.do_sample = true, .generator = &generator}});
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<int64_t> tokens = drawn.tokens.select(0, s).to_vector<int64_t>();
    tokens.erase(tokens.begin());  // BOS
    tokens.resize(static_cast<size_t>(drawn.lengths[static_cast<size_t>(s)]));
    CAPTURE(tokens);
    CHECK(keeps_rules(tokens));
  }
}

TEST_CASE("output rules that leave no token, and negative ones, raise mf::Error") {
  // V = 3 with <pad> and <sos> banned leaves EOS alone, and min_new_tokens 3 bans it at the first step.
  const Model model = random_model(5, 3);
  FakeDecoder decoder(model, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 1, {.banned_ids = {kPad, kBos}, .min_new_tokens = 3,
                                                  .no_repeat_ngram_size = 1}),
                       "greedy_decode: a hypothesis has no token left to take: banned_ids, min_new_tokens and "
                       "no_repeat_ngram_size rule out every one of the 3 tokens", Error);
  FakeDecoder beam_decoder(model, iota(1));
  CHECK_THROWS_WITH_AS(beam_search(beam_decoder, 1, {.banned_ids = {kPad, kBos}, .min_new_tokens = 3,
                                                     .no_repeat_ngram_size = 1}),
                       doctest::Contains("beam_search: a hypothesis has no token left to take"), Error);
  FakeDecoder all_banned(model, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(all_banned, 1, {.banned_ids = {kEos, kPad, kBos, kEos}}),
                       "greedy_decode: banned_ids rule out every one of the 3 tokens", Error);
  FakeDecoder untouched(model, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(untouched, 1, {.min_new_tokens = -1}),
                       "greedy_decode: min_new_tokens must be at least 0, got -1", Error);
  CHECK_THROWS_WITH_AS(beam_search(untouched, 1, {.no_repeat_ngram_size = -2}),
                       "beam_search: no_repeat_ngram_size must be at least 0 (0: off), got -2", Error);
  CHECK_THROWS_WITH_AS(beam_search(untouched, 2, {.no_repeat_ngram_size = 2, .preceding_tokens = {{1, 2}}}),
                       "beam_search: preceding_tokens holds 1 lists for 2 sentences", Error);
  CHECK(untouched.rows_per_step.empty());
}

TEST_CASE("tokens the model gives probability 0 are never taken: beam search drops them, greedy search says so") {
  // V = 5: after BOS, token 3 has 0.7, EOS 0.3 and token 4 nothing (a shortlist leaving it out); after
  // 3, EOS alone. Beam 3 finds two hypotheses, not a third holding the impossible token 4 or padding.
  const Model model = table_model({{{}, {0, 0, 0.3, 0.7, 0}}, {{3}, {0, 0, 1, 0, 0}}}, {0, 0, 1, 0, 0});
  for (IncrementalDecoder::Scores kind : {IncrementalDecoder::Scores::LogProbs, IncrementalDecoder::Scores::Logits}) {
    FakeDecoder decoder(model, iota(1));
    decoder.gives = kind;
    const auto found = beam_search(decoder, 1, {.beam_size = 3, .length_penalty = 0, .nbest = 3});
    REQUIRE(found[0].size() == 2);
    CHECK(found[0][0].tokens == std::vector<int64_t>{3, kEos});
    CHECK(found[0][0].log_prob == doctest::Approx(std::log(0.7)).epsilon(1e-6));
    CHECK(found[0][1].tokens == std::vector<int64_t>{kEos});
  }
  // EOS banned for one token, and every other token impossible: nothing may be taken.
  const Model only_eos = table_model({}, {0, 0, 1, 0, 0});
  FakeDecoder greedy_decoder(only_eos, iota(1));
  CHECK_THROWS_WITH_AS(greedy_decode(greedy_decoder, 1, {.min_new_tokens = 1}),
                       "greedy_decode: sentence 0 has no token left to take: the model gives every token it may take "
                       "probability 0", Error);
  FakeDecoder beam_decoder(only_eos, iota(1));
  CHECK_THROWS_WITH_AS(beam_search(beam_decoder, 1, {.beam_size = 2, .min_new_tokens = 1}),
                       "beam_search: sentence 0 has no token left to take: the model gives every token it may take "
                       "probability 0", Error);
}

namespace {

/// A decoder scoring only `ids` (IncrementalDecoder::scored_ids): FakeDecoder's scores of those columns.
class ShortlistDecoder : public IncrementalDecoder {
 public:
  ShortlistDecoder(Model model, std::vector<int64_t> sentences, std::vector<int64_t> ids, Scores kind)
      : whole_(std::move(model), std::move(sentences)), ids_(std::move(ids)) {
    whole_.gives = kind;
  }
  Tensor step(const Tensor& tokens) override {
    return index_select(whole_.step(tokens), 1, from_vector(ids_, {size()}));
  }
  void select_rows(const Tensor& index) override { whole_.select_rows(index); }
  Scores scores() const override { return whole_.gives; }
  const std::vector<int64_t>* scored_ids() const override { return &ids_; }

 private:
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  FakeDecoder whole_;
  std::vector<int64_t> ids_;
};

/// `model` with probability 0 for every token outside `ids`: what a decoder scoring only those means.
Model outside_impossible(Model model, std::vector<int64_t> ids) {
  return [model, ids](int64_t sentence, const std::vector<int64_t>& prefix) {
    std::vector<double> out = model(sentence, prefix);
    for (size_t v = 0; v < out.size(); ++v)
      if (std::find(ids.begin(), ids.end(), static_cast<int64_t>(v)) == ids.end()) out[v] = -INFINITY;
    return out;
  };
}

}  // namespace

TEST_CASE("a decoder scoring part of the vocabulary is searched as one giving the rest probability 0") {
  // The searches rank the decoder's columns and hand out their tokens: bans (one of them not scored),
  // EOS held back, no repeated 2-gram and forced prefixes translate to columns and back, so each search
  // finds what it finds over the whole vocabulary with the unscored tokens impossible.
  const Model model = random_model(17, 12);
  const std::vector<int64_t> ids{kEos, 3, 5, 6, 8, 9, 11};
  const std::vector<std::vector<int64_t>> prefixes{{}, {6, 8}, {}};
  for (IncrementalDecoder::Scores kind : {IncrementalDecoder::Scores::LogProbs, IncrementalDecoder::Scores::Logits}) {
    CAPTURE(static_cast<int>(kind));
    auto reference = [&] {
      auto decoder = std::make_unique<FakeDecoder>(outside_impossible(model, ids), iota(3));
      decoder->gives = kind;
      return decoder;
    };
    ShortlistDecoder part(model, iota(3), ids, kind);
    const GreedyOptions greedy_options{.max_new_tokens = 7, .banned_ids = {4, 5}, .min_new_tokens = 2,
                                       .no_repeat_ngram_size = 2, .prefixes = prefixes};
    const GreedyResult greedy = greedy_decode(part, 3, greedy_options);
    const GreedyResult expected_greedy = greedy_decode(*reference(), 3, greedy_options);
    CHECK(greedy.tokens.to_vector<int64_t>() == expected_greedy.tokens.to_vector<int64_t>());
    CHECK(greedy.log_probs == expected_greedy.log_probs);

    ShortlistDecoder beam_part(model, iota(3), ids, kind);
    const BeamOptions beam_options{.beam_size = 3, .max_new_tokens = 7, .nbest = 3, .banned_ids = {4, 5},
                                   .min_new_tokens = 2, .no_repeat_ngram_size = 2, .prefixes = prefixes};
    const auto found = beam_search(beam_part, 3, beam_options);
    const auto expected = beam_search(*reference(), 3, beam_options);
    for (size_t s = 0; s < 3; ++s) {
      CAPTURE(s);
      REQUIRE(found[s].size() == expected[s].size());
      for (size_t h = 0; h < found[s].size(); ++h) {
        CHECK(found[s][h].tokens == expected[s][h].tokens);
        CHECK(found[s][h].log_prob == expected[s][h].log_prob);
      }
    }

    Generator first(5), second(5);
    ShortlistDecoder sampled_part(model, iota(3), ids, kind);
    GreedyOptions sampling = greedy_options;
    sampling.sampling = {.do_sample = true, .generator = &first};
    const GreedyResult drawn = greedy_decode(sampled_part, 3, sampling);
    sampling.sampling.generator = &second;
    const GreedyResult expected_drawn = greedy_decode(*reference(), 3, sampling);
    CHECK(drawn.tokens.to_vector<int64_t>() == expected_drawn.tokens.to_vector<int64_t>());
  }
  // A forced token the decoder does not score cannot be taken.
  ShortlistDecoder part(model, iota(1), ids, IncrementalDecoder::Scores::LogProbs);
  CHECK_THROWS_WITH_AS(greedy_decode(part, 1, {.prefixes = {{7}}}),
                       "greedy_decode: prefix token id 7 is not one of the 7 ids the decoder scores", Error);
}
