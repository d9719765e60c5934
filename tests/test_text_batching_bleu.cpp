#include <doctest/doctest.h>

#include "miniflow.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace {

using Tokens = std::vector<std::string>;

std::vector<Tokens> split_all(const std::vector<std::string>& lines) {
  std::vector<Tokens> out;
  for (const std::string& line : lines) {
    std::istringstream words(line);
    out.emplace_back(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>());
  }
  return out;
}

// Lengths 1..50 from a fixed seed, and targets about as long as their sources.
struct Lengths {
  std::vector<int64_t> source, target;
};
Lengths random_lengths(size_t n) {
  std::mt19937_64 rng(7);
  Lengths lengths;
  for (size_t i = 0; i < n; ++i) {
    const auto source = 1 + static_cast<int64_t>(mf::text::uniform_below(rng, 50));
    const auto offset = static_cast<int64_t>(mf::text::uniform_below(rng, 7)) - 3;
    lengths.source.push_back(source);
    lengths.target.push_back(std::max<int64_t>(1, source + offset));
  }
  return lengths;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Batching

TEST_CASE("Fisher-Yates shuffle is pinned to mt19937_64, the same on every standard library") {
  // Expected orders from an independent Python implementation of mt19937_64 (checked against the
  // standard's 10000th output, 9981545732273789042) and the same rejection sampling and swaps.
  std::vector<int> items(10);
  std::iota(items.begin(), items.end(), 0);
  std::mt19937_64 rng(42);
  mf::text::fisher_yates_shuffle(items.begin(), items.end(), rng);
  CHECK(items == std::vector<int>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6});

  std::iota(items.begin(), items.end(), 0);
  rng.seed(43);
  mf::text::fisher_yates_shuffle(items.begin(), items.end(), rng);
  CHECK(items == std::vector<int>{2, 4, 3, 8, 1, 7, 5, 9, 0, 6});

  CHECK(mf::text::uniform_below(rng, 1) == 0);
  CHECK_THROWS_WITH_AS(mf::text::uniform_below(rng, 0), "uniform_below: the range [0, n) is empty (n = 0)", mf::Error);
}

TEST_CASE("batches cover every example once and respect the token budget") {
  const Lengths lengths = random_lengths(1000);
  for (int64_t pool_size : {0, 64, 1}) {
    for (int64_t max_sentences : {0, 8}) {
      CAPTURE(pool_size);
      CAPTURE(max_sentences);
      const mf::text::BatchingOptions options{.max_tokens = 200, .max_sentences = max_sentences, .pool_size = pool_size};
      const std::vector<mf::text::Batch> batches = mf::text::make_batches(lengths.source, lengths.target, options, 1);
      std::vector<int64_t> seen;
      for (const mf::text::Batch& batch : batches) {
        REQUIRE(!batch.empty());
        int64_t width = 0;
        for (int64_t i : batch) width = std::max({width, lengths.source[i], lengths.target[i]});
        CHECK(static_cast<int64_t>(batch.size()) * width <= options.max_tokens);
        if (max_sentences > 0) CHECK(static_cast<int64_t>(batch.size()) <= max_sentences);
        seen.insert(seen.end(), batch.begin(), batch.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(1000);
      std::iota(all.begin(), all.end(), int64_t{0});
      CHECK(seen == all);
    }
  }
}

TEST_CASE("bucketing by length keeps padding low") {
  // One pool sorted by length: a batch holds examples of nearly the same width, so padding adds
  // little; small pools (about two batches each) mix lengths and pad more.
  const Lengths lengths = random_lengths(2000);
  auto padded_over_real = [&](int64_t pool_size) {
    int64_t padded = 0, real = 0;
    const mf::text::BatchingOptions options{.max_tokens = 400, .pool_size = pool_size};
    for (const mf::text::Batch& batch : mf::text::make_batches(lengths.source, lengths.target, options, 3)) {
      int64_t width = 0;
      for (int64_t i : batch) {
        width = std::max({width, lengths.source[i], lengths.target[i]});
        real += std::max(lengths.source[i], lengths.target[i]);
      }
      padded += static_cast<int64_t>(batch.size()) * width;
    }
    return static_cast<double>(padded) / static_cast<double>(real);
  };
  CHECK(padded_over_real(0) < 1.1);
  CHECK(padded_over_real(32) > 1.2);
}

TEST_CASE("batches are reproducible from the seed") {
  const Lengths lengths = random_lengths(500);
  const mf::text::BatchingOptions options{.max_tokens = 256, .pool_size = 100};
  const auto first = mf::text::make_batches(lengths.source, lengths.target, options, 11);
  CHECK(mf::text::make_batches(lengths.source, lengths.target, options, 11) == first);
  CHECK(mf::text::make_batches(lengths.source, lengths.target, options, 12) != first);

  // The overload on encoded sequences batches by their sizes.
  std::vector<std::vector<int64_t>> sources, targets;
  for (size_t i = 0; i < 500; ++i) {
    sources.emplace_back(static_cast<size_t>(lengths.source[i]), 5);
    targets.emplace_back(static_cast<size_t>(lengths.target[i]), 6);
  }
  CHECK(mf::text::make_batches(sources, targets, options, 11) == first);
  CHECK(mf::text::make_batches(std::vector<int64_t>{}, std::vector<int64_t>{}, options, 11).empty());
}

TEST_CASE("batching rejects inconsistent input") {
  const std::vector<int64_t> lengths{3, 9, 4};
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, std::vector<int64_t>{3, 4}, {}, 0),
                       "make_batches: 3 source lengths but 2 target lengths (one of each per example)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, lengths, {.max_tokens = 8}, 0),
                       "make_batches: example 1 is 9 tokens long (source 9, target 9), more than max_tokens = 8; "
                       "raise max_tokens or truncate the corpus (CorpusOptions::max_length)",
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, std::vector<int64_t>{3, -1, 4}, {}, 0),
                       "make_batches: example 1 has a negative length (source 9, target -1)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, lengths, {.max_tokens = 0}, 0),
                       "make_batches: max_tokens must be positive, got 0", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, lengths, {.max_sentences = -2}, 0),
                       "make_batches: max_sentences must be 0 (no cap) or positive, got -2", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::make_batches(lengths, lengths, {.pool_size = -1}, 0),
                       "make_batches: pool_size must be 0 (one pool) or positive, got -1", mf::Error);
}

TEST_CASE("split_for_workers: at least two batches a worker, the last ones halved, order and contents kept") {
  using mf::text::Batch;
  const std::vector<Batch> one = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
  CHECK(mf::text::split_for_workers(one, 1) == one);
  // 2 workers want 4 batches: 10 examples halved to 5 + 5, the first 5 (the first of the largest) to
  // 3 + 2, the other 5 likewise; then the last two batches (one per worker) halved.
  CHECK(mf::text::split_for_workers(one, 2) == std::vector<Batch>{{0, 1, 2}, {3, 4}, {5, 6}, {7}, {8}, {9}});
  // Five batches are already more than 2 x 2: only the last two are halved, the one-example batch stays
  // whole and the odd one splits 2 + 1.
  const std::vector<Batch> five = {{0, 1, 2, 3}, {4, 5, 6}, {7, 8}, {9}, {10, 11, 12}};
  CHECK(mf::text::split_for_workers(five, 2) ==
        std::vector<Batch>{{0, 1, 2, 3}, {4, 5, 6}, {7, 8}, {9}, {10, 11}, {12}});
  // More workers than examples: every example alone.
  CHECK(mf::text::split_for_workers({{3, 1}, {2}}, 8) == std::vector<Batch>{{3}, {1}, {2}});
  CHECK(mf::text::split_for_workers({}, 4).empty());
  // Any batches, any workers: the same examples in the same order, at least min(2 x workers, examples)
  // batches.
  const std::vector<Batch> uneven = {{5, 4, 9, 8, 7}, {1}, {0, 2, 3, 6, 10, 11, 12, 13}, {14, 15}};
  for (int64_t workers = 1; workers <= 9; ++workers) {
    CAPTURE(workers);
    const std::vector<Batch> split = mf::text::split_for_workers(uneven, workers);
    std::vector<int64_t> flat;
    for (const Batch& batch : split) {
      CHECK(!batch.empty());
      flat.insert(flat.end(), batch.begin(), batch.end());
    }
    CHECK(flat == std::vector<int64_t>{5, 4, 9, 8, 7, 1, 0, 2, 3, 6, 10, 11, 12, 13, 14, 15});
    CHECK(split.size() >= std::min<size_t>(2 * static_cast<size_t>(workers), flat.size()));
  }
  CHECK_THROWS_WITH_AS(mf::text::split_for_workers(one, 0), "split_for_workers: workers must be positive, got 0",
                       mf::Error);
}

// ---------------------------------------------------------------------------------------------
// BLEU (expected values derived by hand below, and checked with a Python re-implementation of
// sacrebleu's formula)

TEST_CASE("decoding batches: longest first, cut under the budget, an overlong example alone") {
  // Widths 3 1 4 1 5 10, budget 8: sorted 10 (#5), 5 (#4), 4 (#2), 3 (#0), 1 (#1), 1 (#3); 10 > 8 stands
  // alone, 5 alone (2 x 5 = 10 > 8), 4 and 3 together (2 x 4 = 8), the two 1s together (3 x 4 = 12 > 8).
  const std::vector<int64_t> lengths = {3, 1, 4, 1, 5, 10};
  CHECK(mf::text::sorted_batches(lengths, 8) == std::vector<mf::text::Batch>{{5}, {4}, {2, 0}, {1, 3}});
  // A sentence cap splits further; an empty example costs one slot.
  CHECK(mf::text::sorted_batches(lengths, 100, 2) == std::vector<mf::text::Batch>{{5, 4}, {2, 0}, {1, 3}});
  CHECK(mf::text::sorted_batches(std::vector<int64_t>{0, 0}, 1) == std::vector<mf::text::Batch>{{0}, {1}});
  CHECK(mf::text::sorted_batches(std::vector<int64_t>{}, 8).empty());
  CHECK_THROWS_WITH_AS(mf::text::sorted_batches(lengths, 0), "sorted_batches: max_tokens must be positive, got 0", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::sorted_batches(std::vector<int64_t>{2, -1}, 8),
                       "sorted_batches: example 1 has a negative length (-1)", mf::Error);
}

TEST_CASE("BLEU of a perfect hypothesis is 100") {
  const auto sentences = split_all({"the cat sat on the mat", "ein kleiner test mit vier wörtern"});
  const mf::text::BleuScore bleu = mf::text::corpus_bleu(sentences, sentences);
  CHECK(bleu.score == doctest::Approx(100.0));
  CHECK(bleu.brevity_penalty == 1.0);
  for (double p : bleu.precisions) CHECK(p == doctest::Approx(100.0));
}

TEST_CASE("BLEU with a brevity penalty, worked by hand") {
  // hyp: the quick brown fox jumps over the dog        (c = 8)
  // ref: the quick brown fox jumps over the lazy dog   (r = 9)
  // 1-grams: all 8 match ("the" twice, and the reference has it twice)          p1 = 8/8
  // 2-grams: 7, all but "the dog" match                                          p2 = 6/7
  // 3-grams: 6, all but "over the dog"                                           p3 = 5/6
  // 4-grams: 5, all but "jumps over the dog"                                     p4 = 4/5
  // geometric mean = (1 * 6/7 * 5/6 * 4/5)^(1/4) = (4/7)^(1/4) = 0.869447...
  // c < r, so BP = exp(1 - 9/8) = exp(-0.125) = 0.882497...
  // BLEU = 100 * 0.882497 * 0.869447 = 76.7279645961
  const mf::text::BleuScore bleu = mf::text::sentence_bleu(split_all({"the quick brown fox jumps over the dog"})[0],
                                               split_all({"the quick brown fox jumps over the lazy dog"})[0]);
  CHECK(bleu.matches == std::array<int64_t, 4>{8, 6, 5, 4});
  CHECK(bleu.totals == std::array<int64_t, 4>{8, 7, 6, 5});
  CHECK(bleu.precisions[1] == doctest::Approx(100.0 * 6 / 7));
  CHECK(bleu.brevity_penalty == doctest::Approx(std::exp(-0.125)));
  CHECK(bleu.score == doctest::Approx(100.0 * std::exp(-0.125) * std::pow(4.0 / 7.0, 0.25)));
  CHECK(bleu.score == doctest::Approx(76.7279645961));
  CHECK(bleu.str() == "BLEU = 76.73 100.0/85.7/83.3/80.0 (BP = 0.882 ratio = 0.889 hyp_len = 8 ref_len = 9)");
}

TEST_CASE("BLEU sums n-gram counts over the corpus before dividing") {
  // The fox pair above plus an exact 4-word match "a b c d" (4/4, 3/3, 2/2, 1/1):
  // p = 12/12, 9/10, 7/8, 5/6; c = 12, r = 13, BP = exp(1 - 13/12) = exp(-1/12)
  // BLEU = 100 * exp(-1/12) * (0.9 * 0.875 * 0.8333...)^(1/4) = 82.8087296497,
  // not the mean of the sentence scores ((76.73 + 100) / 2 = 88.36).
  const auto hyps = split_all({"the quick brown fox jumps over the dog", "a b c d"});
  const auto refs = split_all({"the quick brown fox jumps over the lazy dog", "a b c d"});
  const mf::text::BleuScore bleu = mf::text::corpus_bleu(hyps, refs);
  CHECK(bleu.hypothesis_length == 12);
  CHECK(bleu.reference_length == 13);
  CHECK(bleu.score == doctest::Approx(100.0 * std::exp(-1.0 / 12) * std::pow(0.9 * 0.875 * 5.0 / 6.0, 0.25)));
  CHECK(bleu.score == doctest::Approx(82.8087296497));

  // Read in two parts (as two ranks would), the summed counts give the same score, bit for bit.
  const mf::text::BleuScore first = mf::text::corpus_bleu({hyps[0]}, {refs[0]});
  const mf::text::BleuScore second = mf::text::corpus_bleu({hyps[1]}, {refs[1]});
  mf::text::BleuScore summed;
  for (size_t n = 0; n < 4; ++n) {
    summed.matches[n] = first.matches[n] + second.matches[n];
    summed.totals[n] = first.totals[n] + second.totals[n];
  }
  summed.hypothesis_length = first.hypothesis_length + second.hypothesis_length;
  summed.reference_length = first.reference_length + second.reference_length;
  CHECK(mf::text::bleu_from_counts(summed).score == bleu.score);
  CHECK(mf::text::bleu_from_counts(summed).str() == bleu.str());
}

TEST_CASE("BLEU clips repeated words and is zero without a 4-gram match unless smoothed") {
  // "the" occurs 7 times but only twice in the reference: p1 = 2/7; no bigram matches.
  const mf::text::BleuScore clipped =
      mf::text::sentence_bleu(split_all({"the the the the the the the"})[0], split_all({"the cat is on the mat"})[0]);
  CHECK(clipped.matches[0] == 2);
  CHECK(clipped.precisions[0] == doctest::Approx(100.0 * 2 / 7));
  CHECK(clipped.score == 0.0);

  // hyp: the cat sat on the mat / ref: the cat is on the mat (c = r = 6, BP = 1)
  // matches 5/6 ("sat" misses), 3/5 (the cat, on the, the mat), 1/4 (on the mat), 0/3.
  // No smoothing: p4 = 0, so BLEU = 0.
  // Add-one for n > 1: p = 5/6, 4/6, 2/5, 1/4; product = 40/720 = 1/18; BLEU = 100 * (1/18)^(1/4) = 48.5491771707
  const Tokens hyp = split_all({"the cat sat on the mat"})[0];
  const Tokens ref = split_all({"the cat is on the mat"})[0];
  CHECK(mf::text::sentence_bleu(hyp, ref).score == 0.0);
  const mf::text::BleuScore smoothed = mf::text::sentence_bleu(hyp, ref, mf::text::BleuSmoothing::AddOne);
  CHECK(smoothed.matches == std::array<int64_t, 4>{5, 3, 1, 0});  // counts are reported unsmoothed
  CHECK(smoothed.precisions[3] == doctest::Approx(25.0));
  CHECK(smoothed.score == doctest::Approx(100.0 * std::pow(1.0 / 18.0, 0.25)));
  CHECK(smoothed.score == doctest::Approx(48.5491771707));

  // Add-one on a hypothesis too short for 3- and 4-grams: those orders count (0+1)/(0+1).
  // p = 2/2, (1+1)/(1+1), 1/1, 1/1; BP = exp(1 - 3/2), so BLEU = 100 * exp(-0.5) = 60.653...
  CHECK(mf::text::sentence_bleu({"a", "b"}, {"a", "b", "c"}, mf::text::BleuSmoothing::AddOne).score ==
        doctest::Approx(100.0 * std::exp(-0.5)));
}

TEST_CASE("BLEU edge cases") {
  CHECK(mf::text::corpus_bleu({}, {}).score == 0.0);
  const mf::text::BleuScore empty = mf::text::sentence_bleu({}, {"a", "b"});
  CHECK(empty.score == 0.0);
  CHECK(empty.brevity_penalty == 0.0);
  CHECK_THROWS_WITH_AS(mf::text::corpus_bleu(split_all({"a b"}), {}),
                       "corpus_bleu: 1 hypotheses but 0 references (one reference per hypothesis)", mf::Error);
}
