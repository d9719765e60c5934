#include "text/batching.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace mf::text {

uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  MF_CHECK(n > 0, "uniform_below: the range [0, n) is empty (n = 0)");
  // The lowest 2^64 mod n outputs would make small results slightly likelier; redraw them.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = rng();
    if (x >= threshold) return x % n;
  }
}

std::vector<Batch> make_batches(std::span<const int64_t> source_lengths, std::span<const int64_t> target_lengths,
                                const BatchingOptions& options, uint64_t seed) {
  MF_CHECK(source_lengths.size() == target_lengths.size(),
           "make_batches: {} source lengths but {} target lengths (one of each per example)", source_lengths.size(),
           target_lengths.size());
  MF_CHECK(options.max_tokens >= 1, "make_batches: max_tokens must be positive, got {}", options.max_tokens);
  MF_CHECK(options.max_sentences >= 0, "make_batches: max_sentences must be 0 (no cap) or positive, got {}",
           options.max_sentences);
  MF_CHECK(options.pool_size >= 0, "make_batches: pool_size must be 0 (one pool) or positive, got {}",
           options.pool_size);
  const size_t n = source_lengths.size();

  // The width an example pads its batch to; at least 1 so that empty sequences still cost a slot.
  std::vector<int64_t> width(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t source = source_lengths[i], target = target_lengths[i];
    MF_CHECK(source >= 0 && target >= 0, "make_batches: example {} has a negative length (source {}, target {})", i,
             source, target);
    width[i] = std::max({source, target, int64_t{1}});
    MF_CHECK(width[i] <= options.max_tokens,
             "make_batches: example {} is {} tokens long (source {}, target {}), more than max_tokens = {}; raise "
             "max_tokens or truncate the corpus (CorpusOptions::max_length)",
             i, width[i], source, target, options.max_tokens);
  }

  std::mt19937_64 rng(seed);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  fisher_yates_shuffle(order.begin(), order.end(), rng);

  const size_t pool = options.pool_size > 0 ? static_cast<size_t>(options.pool_size) : std::max<size_t>(n, 1);
  std::vector<Batch> batches;
  for (size_t start = 0; start < n; start += pool) {
    auto first = order.begin() + static_cast<std::ptrdiff_t>(start);
    auto last = order.begin() + static_cast<std::ptrdiff_t>(std::min(n, start + pool));
    // Stable, so equal lengths keep their shuffled order and the seed still varies batch contents.
    std::stable_sort(first, last, [&](int64_t a, int64_t b) {
      return std::tie(width[a], source_lengths[a], target_lengths[a]) <
             std::tie(width[b], source_lengths[b], target_lengths[b]);
    });
    Batch batch;
    int64_t batch_width = 0;
    for (auto it = first; it != last; ++it) {
      const int64_t grown_size = static_cast<int64_t>(batch.size()) + 1;
      const int64_t grown_width = std::max(batch_width, width[*it]);
      const bool fits = grown_size * grown_width <= options.max_tokens &&
                        (options.max_sentences == 0 || grown_size <= options.max_sentences);
      if (!fits) {
        batches.push_back(std::move(batch));
        batch = {};
        batch_width = 0;
      }
      batch.push_back(*it);
      batch_width = std::max(batch_width, width[*it]);
    }
    if (!batch.empty()) batches.push_back(std::move(batch));
  }
  fisher_yates_shuffle(batches.begin(), batches.end(), rng);
  return batches;
}

std::vector<Batch> make_batches(const std::vector<std::vector<int64_t>>& sources,
                                const std::vector<std::vector<int64_t>>& targets, const BatchingOptions& options,
                                uint64_t seed) {
  auto lengths = [](const std::vector<std::vector<int64_t>>& sequences) {
    std::vector<int64_t> out;
    out.reserve(sequences.size());
    for (const auto& sequence : sequences) out.push_back(static_cast<int64_t>(sequence.size()));
    return out;
  };
  return make_batches(lengths(sources), lengths(targets), options, seed);
}

}  // namespace mf::text
