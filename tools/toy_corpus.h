// The built-in toy corpus of train_transformer: eight sentence pairs (German -> English and
// English -> Spanish in one model), the small model and schedule that learn it in one epoch, and the
// check that every greedy and beam translation comes out right. tests/test_cuda_training.cpp trains
// the same corpus through the same loop on a GPU.
#pragma once

#include "text/corpus.h"
#include "models/translation.h"
#include "tools/train_loop.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mf::tools {

/// The eight (source, target) pairs.
const std::vector<std::pair<std::string, std::string>>& toy_pairs();

/// train_transformer's settings for the toy corpus, for every flag the user does not give.
struct ToySetup {
  int64_t repeats = 800;  // the epoch holds each pair this many times, so that one epoch is enough
  int64_t epochs = 1, d_model = 64, heads = 4, layers = 1, d_ff = 128, max_len = 16, min_freq = 1, log_every = 100;
  double dropout = 0.0;
  OptimSettings optim{.seed = 1, .max_tokens = 48, .warmup = 100, .lr_factor = 0.5, .label_smoothing = 0.1,
                      .clip = 1.0};
};

/// The toy pairs, each repeated `repeats` times, tokenized with `options`.
text::Corpus make_toy_corpus(int64_t repeats, const text::CorpusOptions& options);

/// One toy source with its greedy and beam-4 translations and the expected one.
struct ToyTranslation {
  std::string source, greedy, beam, expected;
  bool right() const { return greedy == expected && beam == expected; }
};

/// Translates the toy sources greedily and with beam 4 (the model in eval() mode, on its device).
std::vector<ToyTranslation> translate_toy(models::Translator& translator);

}  // namespace mf::tools
