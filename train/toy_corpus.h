// The built-in toy corpus of train_transformer: eight sentence pairs (German -> English and
// English -> Spanish in one model), the small model and schedule that learn it in one epoch, and the
// check that every greedy and beam translation comes out right. tests/test_cuda_training.cpp trains
// the same corpus through the same loop on a GPU.
#pragma once

#include "models/translation.h"
#include "text/corpus.h"
#include "train/train_loop.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mf::train {

/// The eight (source, target) pairs.
const std::vector<std::pair<std::string, std::string>>& toy_pairs();

/// The toy epoch holds each pair this many times, so that one epoch is enough.
inline constexpr int64_t kToyRepeats = 800;

/// The toy run's options: one epoch of a small model (d_model 64, 4 heads, 1+1 layers, d_ff 128, no
/// dropout) on a short schedule, every token in the vocabulary, no per-epoch summary and no checkpoint.
TrainingOptions toy_options();

/// The toy pairs, each repeated `repeats` times, tokenized with `options`.
text::Corpus make_toy_corpus(int64_t repeats, const text::CorpusOptions& options);

/// One toy source with its greedy and beam-4 translations and the expected one.
struct ToyTranslation {
  std::string source, greedy, beam, expected;
  bool right() const { return greedy == expected && beam == expected; }
};

/// Translates the toy sources greedily and with beam 4 (the model in eval() mode, on its device).
std::vector<ToyTranslation> translate_toy(models::Translator& translator);

}  // namespace mf::train
