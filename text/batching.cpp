#include "text/batching.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace mf::text {

namespace {

/// Appends `examples` (indices, already in batch order) to `batches`, cut greedily: a batch grows while
/// its size times its widest example's `width` stays within max_tokens and its size within
/// max_sentences (0: no cap). An example wider than max_tokens on its own still gets a batch.
void cut_into_batches(std::span<const int64_t> examples, std::span<const int64_t> width, int64_t max_tokens,
                      int64_t max_sentences, std::vector<Batch>& batches) {
  Batch batch;
  int64_t batch_width = 0;
  for (int64_t example : examples) {
    const int64_t grown_size = static_cast<int64_t>(batch.size()) + 1;
    const int64_t grown_width = std::max(batch_width, width[static_cast<size_t>(example)]);
    const bool fits = grown_size * grown_width <= max_tokens && (max_sentences == 0 || grown_size <= max_sentences);
    if (!fits && !batch.empty()) {
      batches.push_back(std::move(batch));
      batch = {};
      batch_width = 0;
    }
    batch.push_back(example);
    batch_width = std::max(batch_width, width[static_cast<size_t>(example)]);
  }
  if (!batch.empty()) batches.push_back(std::move(batch));
}

}  // namespace

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
    cut_into_batches({first, last}, width, options.max_tokens, options.max_sentences, batches);
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

std::vector<Batch> sorted_batches(std::span<const int64_t> lengths, int64_t max_tokens, int64_t max_sentences) {
  MF_CHECK(max_tokens >= 1, "sorted_batches: max_tokens must be positive, got {}", max_tokens);
  MF_CHECK(max_sentences >= 0, "sorted_batches: max_sentences must be 0 (no cap) or positive, got {}", max_sentences);
  std::vector<int64_t> width(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    MF_CHECK(lengths[i] >= 0, "sorted_batches: example {} has a negative length ({})", i, lengths[i]);
    width[i] = std::max(lengths[i], int64_t{1});
  }
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return width[a] > width[b]; });
  std::vector<Batch> batches;
  cut_into_batches(order, width, max_tokens, max_sentences, batches);
  return batches;
}

std::vector<Batch> split_for_workers(std::vector<Batch> batches, int64_t workers) {
  MF_CHECK(workers >= 1, "split_for_workers: workers must be positive, got {}", workers);
  if (workers == 1) return batches;
  // Replaces batches[b] by its two halves, the first one example longer when its size is odd.
  auto halve = [&](size_t b) {
    Batch& first = batches[b];
    Batch second(first.begin() + static_cast<std::ptrdiff_t>((first.size() + 1) / 2), first.end());
    first.resize(first.size() - second.size());
    batches.insert(batches.begin() + static_cast<std::ptrdiff_t>(b) + 1, std::move(second));
  };
  auto by_size = [](const Batch& a, const Batch& b) { return a.size() < b.size(); };
  while (batches.size() < 2 * static_cast<size_t>(workers)) {
    const auto largest = std::max_element(batches.begin(), batches.end(), by_size);
    if (largest == batches.end() || largest->size() < 2) break;
    halve(static_cast<size_t>(largest - batches.begin()));
  }
  // From the back, so that each halving leaves the indices before it in place.
  const size_t tail_start = batches.size() - std::min(batches.size(), static_cast<size_t>(workers));
  for (size_t b = batches.size(); b-- > tail_start;)
    if (batches[b].size() > 1) halve(b);
  return batches;
}

}  // namespace mf::text
