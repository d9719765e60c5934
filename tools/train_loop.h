// The training loop of tools/train_transformer: Adam + Noam schedule over length-bucketed batches,
// a progress line, per-epoch validation (loss, perplexity, greedy BLEU), checkpoints each epoch and
// on Ctrl-C, exact resumption, and the loss/BLEU chart. It trains on whatever device the model is on:
// batches are built there, the optimizer state lives with the parameters, and checkpoints go through
// the host.
#pragma once

#include "text/corpus.h"
#include "models/translation.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace mf::tools {

/// Encoded sentence pairs (ids without specials) and the tokenized references BLEU compares with.
struct ParallelData {
  std::vector<std::vector<int64_t>> sources, targets;
  std::vector<std::vector<std::string>> references;
};

/// The translation model train_transformer builds from its training corpus.
struct ModelSettings {
  int64_t d_model = 512, heads = 8, encoder_layers = 6, decoder_layers = 6, d_ff = 2048, max_len = 100;
  double dropout = 0.1;
  int64_t min_freq = 2, max_vocab = 0;  // vocabularies: tokens seen at least min_freq times, at most max_vocab
  bool lowercase = true;
};

/// Vocabularies from `train`'s two sides, and a Transformer with separate source and target
/// embeddings and the output projection tied to the target's, initialised on the CPU.
models::Translator build_translator(const text::Corpus& train, const ModelSettings& settings);

/// Encodes a tokenized corpus with the translator's vocabularies.
ParallelData encode_corpus(const models::Translator& translator, const std::vector<std::vector<std::string>>& sources,
                           const std::vector<std::vector<std::string>>& targets);

/// The settings that shape the optimisation; a resumed run must use the same ones.
struct OptimSettings {
  int64_t seed = 1;
  int64_t max_tokens = 4096;
  int64_t warmup = 4000;
  double lr_factor = 1.0;
  double label_smoothing = 0.1;
  double clip = 1.0;
};

struct LoopOptions {
  OptimSettings optim;
  int64_t epochs = 1;
  int64_t log_every = 50;       // steps between progress lines when stdout is not a terminal
  int64_t bleu_sentences = 0;   // validation sentences translated for BLEU; 0: all
  int64_t max_steps = 0;        // stop (saving a checkpoint) after this many steps of this run; 0: no limit
  std::filesystem::path checkpoint;  // empty: no checkpoints
  std::filesystem::path plot;        // empty: no chart
  bool resume = false;               // continue from `checkpoint`
  bool quiet_epochs = false;         // no per-epoch summary line (the toy corpus)
  /// Called after each optimizer step with the step number (1 for the first step of a fresh run) and
  /// the batch's training loss; tests compare curves through it.
  std::function<void(int64_t step, double loss)> on_step;
};

/// Trains `translator` on `train` (validating on `valid` when it holds pairs) for the epochs of
/// `options`, resuming from options.checkpoint when options.resume is set. Returns the exit status:
/// 0 when all epochs ran or max_steps stopped the run, 130 after Ctrl-C (in both early stops the
/// checkpoint then holds the finished steps). Throws
/// mf::Error for a checkpoint that does not fit (other optimisation settings, corrupt progress data),
/// and when a step's loss or gradient norm is not finite: it then stops before that step's update
/// without saving, so the checkpoint on disk keeps the last state saved before it.
int train_translator(models::Translator& translator, const ParallelData& train, const ParallelData& valid,
                     const LoopOptions& options);

/// Greedy corpus BLEU-4 of the first `limit` pairs of `data` (all for 0), batched.
double greedy_bleu(models::Translator& translator, const ParallelData& data, int64_t limit);

}  // namespace mf::tools
