// The training loop of a translation model: Adam + Noam schedule over length-bucketed batches, a
// progress line, per-epoch validation (loss, perplexity, greedy BLEU), checkpoints each epoch and on
// Ctrl-C, exact resumption, and the loss/BLEU chart. It trains on whatever device the model is on:
// batches are built there, the optimizer state lives with the parameters, and checkpoints go through
// the host. One TrainingOptions configures it all; tools/train_transformer fills it from its flags.
#pragma once

#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "models/translation.h"
#include "text/corpus.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mf::train {

/// Encoded sentence pairs (ids without specials) and the target lines, as read: the references that
/// validation scores the translations against (sacreBLEU and chrF).
struct ParallelData {
  std::vector<std::vector<int64_t>> sources, targets;
  std::vector<std::string> references;
  /// The source lines subword codecs encoded `sources` from (empty for word codecs): subword sampling
  /// encodes them, and `references`, again each epoch.
  std::vector<std::string> source_text;
};

/// The settings that shape the optimisation; a resumed run must use the same ones (the checkpoint
/// records them).
struct OptimSettings {
  int64_t seed = 1;           // the batch order of epoch e is shuffled with seed + e
  int64_t max_tokens = 1500;  // token budget of a batch, padding included
  int64_t batch_pool = 0;     // examples sorted by length together before batching; 0: the whole epoch
  int64_t warmup = 800;       // Noam schedule warmup steps
  double lr_factor = 1.0;     // Noam schedule factor: lr = f * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5)
  double label_smoothing = 0.1;
  double clip = 1.0;          // gradient norm clipping; 0: off
  /// Subword sampling of the training pairs (text::SubwordSampling), drawn anew each epoch from seed and
  /// epoch; subword_alpha 0: off, every epoch the best segmentation.
  double subword_alpha = 0;
  int64_t subword_nbest = -1;
};

/// How the messages of a run name the settings its user can change. The defaults name TrainingOptions'
/// fields, for a program that sets them in code; train_transformer names its flags.
struct SettingNames {
  /// A field of TrainingOptions, given by its path ("optim.warmup", "max_steps", "checkpoint",
  /// "resume"), as the user sets it. Unset: the path itself.
  std::function<std::string(std::string_view path)> field;
  /// How the user turns on anomaly detection, which names the op that first makes a NaN or inf.
  std::string detect_anomaly = "rerun with autograd::set_detect_anomaly(true)";

  /// `path` as `field` names it.
  std::string operator()(std::string_view path) const { return field ? field(path) : std::string(path); }
};

/// Everything a training run is configured by: the model, its vocabularies and tokenizer, the
/// optimisation and the loop. The defaults are train_transformer's for a real corpus.
struct TrainingOptions {
  /// The model. src_vocab and tgt_vocab are left 0: build_translator sets them from the vocabularies.
  /// Only the fields that differ from TransformerConfig's defaults (the paper's base model) are given:
  /// half its width and depth, a narrower feed-forward block and sentences up to 100 tokens, which
  /// suits a corpus of Multi30k's size.
  models::TransformerConfig model{.d_model = 256, .encoder_layers = 3, .decoder_layers = 3, .d_ff = 512,
                                  .max_len = 100};
  /// How text becomes ids. Words: a vocabulary per side built from the training corpus (`vocab`)
  /// over `tokenizer`'s words. Subwords: SentencePiece (`subword`) learned from the training text, one
  /// model for both sides when `joint_subwords` (and then one embedding for source, target and output),
  /// or `subword_model`, an existing .model file, for both sides.
  enum class Units : uint8_t { Words, Subwords };
  Units units = Units::Subwords;
  text::VocabOptions vocab{.min_freq = 2};
  text::TokenizerOptions tokenizer;
  text::SubwordOptions subword;
  bool joint_subwords = true;
  std::filesystem::path subword_model;
  OptimSettings optim;
  int64_t epochs = 10;          // in all, counting the epochs of the run resumed from
  int64_t log_every = 50;       // steps between progress lines when stdout is not a terminal
  int64_t bleu_sentences = 0;   // validation sentences translated for BLEU; 0: all
  int64_t valid_beam = 4;       // beam size of the validation translations; 1: greedy
  /// Early stopping: end training when validation BLEU has not improved for this many epochs; 0: never.
  /// With a checkpoint, each new best epoch's model is also saved beside it as <name>.best.safetensors.
  int64_t patience = 0;
  /// With a checkpoint: keep the models of the last this many epochs (<name>.epoch<K>.safetensors) and
  /// at the end write their mean, <name>.averaged.safetensors (validated when there is validation
  /// data); 0: off.
  int64_t average_last = 3;
  int64_t max_steps = 0;        // stop (saving a checkpoint) after this many steps of this run; 0: no limit
  std::filesystem::path checkpoint;  // empty: no checkpoints
  std::filesystem::path plot;        // empty: no chart
  bool resume = false;               // continue from `checkpoint`
  bool quiet_epochs = false;         // no per-epoch summary line (the toy corpus)
  SettingNames names;
  /// Data-parallel training: the ranks of `group` share every batch, each training on a contiguous
  /// share of its sentences, and sum their gradients, so that every rank takes the same steps. Rank 0
  /// alone prints, saves checkpoints and writes the chart; validation and BLEU are shared out too.
  /// Every rank calls train_translator with the same options and data. Null: this process alone.
  std::shared_ptr<distributed::ProcessGroup> group;
  /// Bucket size, overlap and the deterministic (rank-order) reduction. `reduce` is ignored: the
  /// ranks' losses are weighted by their shares' tokens, and their gradients summed.
  distributed::DataParallelOptions data_parallel;
  /// Shares each rank splits its part of a batch into, accumulating their gradients (less memory for
  /// the same batch). A batch is split into world size x accumulate shares, each with its own dropout
  /// stream, so a run depends only on that product: 2 ranks x 1 and 1 rank x 2 train alike, and a
  /// checkpoint resumes at any world size. With no group and accumulate 1, a batch is one share.
  int64_t accumulate = 1;
  /// Mixed precision: the run computes under AutocastGuard (ops/functional.h), its GEMMs taking
  /// bfloat16 products summed in float32, everything else and the parameters (master weights,
  /// checkpoints) in float32.
  bool autocast = false;
  /// With a group: shard Adam's state over the ranks (ZeRO stage 1, distributed/zero.h), each keeping
  /// 1/W of it. The steps and checkpoints are the bits of the unsharded run.
  bool shard_optimizer = false;
  /// Called after each optimizer step with the step number (1 for the first step of a fresh run) and
  /// the batch's training loss; tests compare curves through it.
  std::function<void(int64_t step, double loss)> on_step;
};

/// The text codecs options.units asks for, learned from `train` (word vocabularies from its two sides,
/// or a SentencePiece model from its text), and a Transformer of options.model initialised on the
/// CPU: one embedding shared by source, target and output when one subword model serves both sides,
/// else separate ones.
models::Translator build_translator(const text::Corpus& train, const TrainingOptions& options);

/// Encodes a corpus with the translator's codecs: the tokenized sentences for word codecs, the raw text
/// for subword codecs (truncated to max_length ids, counted in `truncated` when given; the source lines
/// kept in source_text).
ParallelData encode_corpus(const models::Translator& translator, const text::Corpus& corpus, int64_t max_length,
                           int64_t* truncated = nullptr);

/// Trains `translator` on `train` (validating on `valid` when it holds pairs) for the epochs of
/// `options`, resuming from options.checkpoint when options.resume is set. Returns the exit status:
/// 0 when all epochs ran or max_steps stopped the run, 130 after Ctrl-C (in both early stops the
/// checkpoint then holds the finished steps). Throws
/// mf::Error for a checkpoint that does not fit (other optimisation settings, corrupt progress data),
/// and when a step's loss or gradient norm is not finite: it then stops before that step's update
/// without saving, so the checkpoint on disk keeps the last state saved before it.
int train_translator(models::Translator& translator, const ParallelData& train, const ParallelData& valid,
                     const TrainingOptions& options);

/// sacreBLEU's corpus BLEU and chrF (13a, cased: text/sacrebleu.h) of greedy translations, 0..100.
struct ValidationScores {
  double bleu = 0, chrf = 0;
};

/// The scores of the translations (greedy, or beam search of `beam` > 1 with the default length
/// penalty) of the first `limit` pairs of `data` (all for 0), as printed, against the reference lines;
/// batched, with decoding bounded by models::output_budget. With a group,
/// each rank translates its share of the pairs and the scores come from their summed counts (the same
/// scores); every rank of the group must call it.
ValidationScores validation_scores(models::Translator& translator, const ParallelData& data, int64_t limit,
                                   distributed::ProcessGroup* group = nullptr, int64_t beam = 1);

/// Where the training loop keeps its other models beside `checkpoint`: `checkpoint`'s name with
/// `suffix` before the extension (multi30k.safetensors, ".best" -> multi30k.best.safetensors).
std::filesystem::path beside(const std::filesystem::path& checkpoint, std::string_view suffix);

}  // namespace mf::train
