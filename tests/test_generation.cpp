// Greedy and beam search (models/generation.h) against fake decoders whose next-token distribution is
// a fixed function of (sentence, prefix), so every expected value can be computed independently: by a
// naive argmax loop, by exhaustive enumeration, or by hand for scripted distributions.
#include <doctest/doctest.h>

#include "helpers.h"

#include <algorithm>
#include <cmath>
#include <functional>

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
      for (double v : model_(sentences_[row], prefixes_[row])) out.push_back(static_cast<float>(v));
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

  int64_t rows() const { return static_cast<int64_t>(sentences_.size()); }

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

/// Naive greedy decoding of one sentence: argmax (first maximum) until EOS or max_new_tokens.
std::pair<std::vector<int64_t>, double> naive_greedy(const Model& model, int64_t sentence, int64_t max_new_tokens) {
  std::vector<int64_t> prefix{kBos};
  double sum = 0;
  while (static_cast<int64_t>(prefix.size()) <= max_new_tokens) {
    std::vector<double> lp = model(sentence, prefix);
    auto best = std::max_element(lp.begin(), lp.end());  // the first maximum
    sum += *best;
    prefix.push_back(best - lp.begin());
    if (prefix.back() == kEos) break;
  }
  return {prefix, sum};
}

/// Every complete hypothesis of one sentence (ends in EOS, or has max_new_tokens tokens), with its
/// log-probability and GNMT score, best first.
std::vector<Hypothesis> enumerate_all(const Model& model, int64_t sentence, int64_t vocab, int64_t max_new_tokens,
                                      double alpha) {
  std::vector<Hypothesis> all;
  std::function<void(std::vector<int64_t>&, double)> extend = [&](std::vector<int64_t>& prefix, double sum) {
    std::vector<double> lp = model(sentence, prefix);
    for (int64_t t = 0; t < vocab; ++t) {
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
  std::vector<int64_t> prefix{kBos};
  extend(prefix, 0.0);
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
    GreedyResult result = greedy_decode(decoder, 2, {.max_new_tokens = 3, .bos = 3, .eos = 4, .pad = 5});
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

TEST_CASE("beam_search drops a sentence's rows once it is done (scripted)") {
  // V = 6, p(script token) = 0.9, every other token 0.02; beam 2, no length penalty, max 6.
  // Sentence 1 says "EOS". Step 1 (its one row): EOS ranks first -> finished (log 0.9); tokens 0 and
  // 1 (ties go to the lower id) become the two live beams. Step 2: both rows put EOS first, so the
  // two best candidates are "0 EOS" and "1 EOS" (log 0.02 + log 0.9 each) -> 3 finished; the best
  // live beam has 2 log 0.02, below the 2nd best finished, so sentence 1 is done.
  // Sentence 0 says "3 3 3 3 3 3": EOS never ranks among its top 2 (token 0 ties with it and wins),
  // so it keeps 2 live rows until max_new_tokens.
  // Rows per step: 1 + 1, then 2 + 2, then 2 for sentence 0 alone.
  FakeDecoder decoder(scripted_model({{3, 3, 3, 3, 3, 3}, {kEos}}, 6), iota(2));
  auto results = beam_search(decoder, 2, {.beam_size = 2, .max_new_tokens = 6, .length_penalty = 0, .nbest = 2});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{2, 4, 2, 2, 2, 2});
  const double l9 = static_cast<float>(std::log(0.9)), l02 = static_cast<float>(std::log(0.02));
  REQUIRE(results[0].size() == 2);
  CHECK(results[0][0].tokens == std::vector<int64_t>{3, 3, 3, 3, 3, 3});
  CHECK(results[0][0].log_prob == doctest::Approx(6 * l9).epsilon(1e-12));
  REQUIRE(results[1].size() == 2);
  CHECK(results[1][0].tokens == std::vector<int64_t>{kEos});
  CHECK(results[1][0].log_prob == l9);
  CHECK(results[1][1].tokens == std::vector<int64_t>{0, kEos});
  CHECK(results[1][1].log_prob == l02 + l9);
}

TEST_CASE("beam_search keeps going while a live hypothesis could still win under the length penalty") {
  // V = 4, alpha = 1, so lp(L) = (5 + L) / 6 and max_new_tokens 10 gives lp(10) = 2.5. Beam 1.
  // Step 1: p(EOS) = 0.5, p(3) = 0.48. "EOS" finishes with score log 0.5 = -0.693; "3" lives with
  // S = log 0.48 = -0.734. The heuristic bound S / lp(1) = -0.734 would stop here, but S could still
  // end as S / lp(10) = -0.294, so the search goes on. Step 2: p(EOS | 3) = 0.99, and "3 EOS" scores
  // (log 0.48 + log 0.99) / (7/6) = -0.638, which beats "EOS". Then the best live beam (log 0.48 +
  // log(0.01/3)) can reach at most -6.44 / 2.5 = -2.58 < -0.638: done after 2 steps.
  Model model = [](int64_t, const std::vector<int64_t>& prefix) {
    std::vector<double> p = prefix.size() == 1 ? std::vector<double>{0.01, 0.01, 0.5, 0.48}
                                               : std::vector<double>{0.01 / 3, 0.01 / 3, 0.99, 0.01 / 3};
    std::vector<double> out;
    for (double v : p) out.push_back(static_cast<float>(std::log(v)));
    return out;
  };
  FakeDecoder decoder(model, {0});
  auto results = beam_search(decoder, 1, {.beam_size = 1, .max_new_tokens = 10, .length_penalty = 1.0});
  CHECK(decoder.rows_per_step == std::vector<int64_t>{1, 1});
  REQUIRE(results[0].size() == 1);
  CHECK(results[0][0].tokens == std::vector<int64_t>{3, kEos});
  double sum = static_cast<float>(std::log(0.48)) + static_cast<double>(static_cast<float>(std::log(0.99)));
  CHECK(results[0][0].log_prob == doctest::Approx(sum).epsilon(1e-12));
  CHECK(results[0][0].score == doctest::Approx(sum / (7.0 / 6.0)).epsilon(1e-12));
  CHECK(results[0][0].score == doctest::Approx(-0.638).epsilon(1e-3));
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
  CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.pad = -1}),
                       "greedy_decode: special token ids must be >= 0, got -1", Error);
  CHECK(decoder.rows_per_step.empty());  // options are checked before the decoder is touched

  SUBCASE("special token outside the vocabulary") {
    CHECK_THROWS_WITH_AS(greedy_decode(decoder, 2, {.eos = 5}),
                         "greedy_decode: special token id 5 is outside the decoder's vocabulary of 5 tokens", Error);
  }
  SUBCASE("a step result of the wrong shape") {
    struct OneRow : IncrementalDecoder {
      Tensor step(const Tensor&) override { return zeros({1, 5}); }
      void select_rows(const Tensor&) override {}
    } one_row;
    CHECK_THROWS_WITH_AS(
        beam_search(one_row, 2),
        "beam_search: decoder.step was fed 2 tokens and must return float log-probabilities [2, V], got float32 [1, 5]",
        Error);
  }
  SUBCASE("NaN log-probabilities") {
    FakeDecoder nan_decoder([](int64_t, const std::vector<int64_t>&) { return std::vector<double>(4, NAN); }, {0});
    CHECK_THROWS_WITH_AS(greedy_decode(nan_decoder, 1), "greedy_decode: decoder.step returned NaN log-probabilities",
                         Error);
  }
}
