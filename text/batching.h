// Length-bucketed batches under a token budget: shuffled reproducibly from a seed for training,
// sorted by length for decoding.
#pragma once

#include <cstdint>
#include <iterator>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace mf::text {

struct BatchingOptions {
  /// Token budget of a batch, padding included: pairs in the batch * its longest sequence (source or
  /// target, whichever is longer) stays at or below max_tokens.
  int64_t max_tokens = 4096;
  /// At most this many pairs per batch; 0: no cap.
  int64_t max_sentences = 0;
  /// Examples sorted by length together (after the shuffle) before being cut into batches; batches
  /// never span pools, so a pool should hold many batches. Larger pools pad less, smaller ones mix
  /// lengths more; 0: the whole epoch is one pool, as fairseq does.
  int64_t pool_size = 0;
};

/// Indices of the examples in one batch (make_batches: shortest first; sorted_batches: longest first).
using Batch = std::vector<int64_t>;

/// A uniform integer in [0, n), n > 0, by rejection sampling. Unlike std::uniform_int_distribution,
/// whose algorithm each standard library chooses, it gives the same numbers everywhere.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n);

/// Fisher–Yates shuffle of [first, last) driven by uniform_below: the same seed gives the same order
/// on every platform, which std::shuffle does not promise.
template <std::random_access_iterator It>
void fisher_yates_shuffle(It first, It last, std::mt19937_64& rng) {
  for (auto i = last - first; i > 1; --i) std::swap(first[i - 1], first[uniform_below(rng, static_cast<uint64_t>(i))]);
}

/// One epoch of batches for examples of the given source and target lengths (as they will be
/// padded, <sos>/<eos> included): shuffles the examples with `seed`, sorts each pool of pool_size
/// by length, cuts it greedily into batches that respect max_tokens and max_sentences, and
/// shuffles the batch order. Every example lands in exactly one batch. Pass a different seed each
/// epoch (seed + epoch) for a different order. Throws mf::Error when the two spans differ in size,
/// for a negative length or option, and for an example longer than max_tokens on its own.
std::vector<Batch> make_batches(std::span<const int64_t> source_lengths, std::span<const int64_t> target_lengths,
                                const BatchingOptions& options, uint64_t seed);

/// make_batches on the lengths of encoded sequences.
std::vector<Batch> make_batches(const std::vector<std::vector<int64_t>>& sources,
                                const std::vector<std::vector<int64_t>>& targets, const BatchingOptions& options,
                                uint64_t seed);

/// Batches for decoding: the examples sorted by length, longest first (equal lengths keep their input
/// order), cut greedily so that a batch's size times its longest length stays within max_tokens and
/// its size within max_sentences (0: no cap). Every example lands in exactly one batch; an example
/// longer than max_tokens gets one of its own rather than an error, since decoding can always take it.
/// The longest batch comes first, so a budget too large for memory fails at once. Throws mf::Error for
/// a negative length, max_tokens below 1 or a negative max_sentences.
std::vector<Batch> sorted_batches(std::span<const int64_t> lengths, int64_t max_tokens, int64_t max_sentences = 0);

/// `batches`, in the order workers will take them, cut so that `workers` taking the next one as each
/// finishes end close together (a guided schedule, by halves): the largest batch is cut in two until
/// there are twice as many batches as workers (every worker gets some), then each of the last `workers`
/// batches is, so that the last to finish runs about half a batch past the others, not a whole one.
/// Halves are consecutive, the first one example longer when the size is odd; a batch of one example
/// stays whole, and the examples keep their order. One worker gets `batches` back unchanged. Throws
/// mf::Error for workers below 1.
std::vector<Batch> split_for_workers(std::vector<Batch> batches, int64_t workers);

}  // namespace mf::text
