// A translation model with everything needed to use it — the Transformer and each side's text codec
// (words or SentencePiece subwords) — and the checkpoint format that train_transformer writes and
// translate reads: one self-contained file, a subword model's bytes included.
//
// Sequences: source = tokens + <eos>; decoder input = <sos> + tokens; decoder target = tokens + <eos>;
// batches are padded with <pad> (text::kPadId), which every mask and the loss ignore.
#pragma once

#include "models/alignment.h"
#include "models/decoding.h"
#include "models/generation.h"
#include "models/transformer.h"
#include "optim/training_state.h"
#include "text/codec.h"
#include "text/corpus.h"
#include "text/lexicon.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace mf::models {

/// One padded batch of pairs, ready for Transformer::forward and Transformer::loss.
struct TranslationBatch {
  Tensor src;      // [B, S] int64: source ids + <eos>, padded
  Tensor tgt_in;   // [B, T] int64: <sos> + target ids, padded
  Tensor tgt_out;  // [B, T] int64: target ids + <eos>, padded
  int64_t target_tokens = 0;  // non-padding entries of tgt_out (the loss's denominator)
};

/// Pads id sequences into a batch (the examples at `indices` of `sources` / `targets`, already encoded
/// without specials).
TranslationBatch make_translation_batch(const std::vector<std::vector<int64_t>>& sources,
                                        const std::vector<std::vector<int64_t>>& targets,
                                        std::span<const int64_t> indices, Device device = Device::cpu());

/// One translation of a sentence.
struct Translation {
  std::string text;
  /// What beam search ranks by, the length-penalized log-probability; greedy search: the log-probability.
  double score = 0;
  /// The ids generated, <eos> excluded (what Translator::align takes).
  std::vector<int64_t> ids;

  /// Tokens generated, <eos> excluded.
  int64_t tokens() const { return static_cast<int64_t>(ids.size()); }

  bool operator==(const Translation&) const = default;
};

class Translator {
 public:
  /// A fresh (untrained) model for the given codecs, whose sizes must be the config's vocabularies;
  /// shared embeddings need one codec for both sides.
  Translator(const TransformerConfig& config, text::TextCodec source, text::TextCodec target);
  /// Word codecs for both sides with one tokenizer.
  Translator(const TransformerConfig& config, text::Vocab src_vocab, text::Vocab tgt_vocab,
             text::TokenizerOptions tokenizer);

  /// Encodes sentences into a padded source batch [B, S] (+ <eos>), truncated to the model's max_len,
  /// on the model's device.
  Tensor encode_sources(const std::vector<std::string>& sentences) const;
  /// The tokens decoding must never produce (GreedyOptions::banned_ids): <pad> and <sos>, which no
  /// output holds (a <pad> generated would be masked out of the decoder's own keys once the output is
  /// read again whole, and drop out of the printed text), <unk> when the target side spells every
  /// text, and the byte pieces of control characters (text::TextCodec::control_character_ids): a
  /// translation is one line of text.
  std::vector<int64_t> banned_tokens() const;
  /// Target ids back to text (up to <eos>).
  std::string decode_target(std::span<const int64_t> ids) const { return target_.decode(ids); }

  /// Translates `sentences` (decode_sources: length-sorted batches, greedy or beam search, never the
  /// banned_tokens()): per sentence its min(nbest, found) translations, best first, in input order. An
  /// empty sentence is translated like any other (from <eos> alone). `target_prefixes`, none or one
  /// per sentence (empty: none), are texts each translation must begin with (DecodingOptions::
  /// target_prefixes, encoded as the target side encodes text); the translations hold them.
  std::vector<std::vector<Translation>> translate(const std::vector<std::string>& sentences,
                                                  const DecodingOptions& options,
                                                  const std::vector<std::string>& target_prefixes = {});
  /// How likely the model finds each target sentence as the translation of the source sentence
  /// beside it (score_targets on both sides' encodings, as translate encodes them).
  std::vector<TargetScore> score(const std::vector<std::string>& sources, const std::vector<std::string>& targets,
                                 const ScoringOptions& options = {});
  /// Which source words each target word was translated from: `targets[i]` (ids without <eos>, say a
  /// Translation's ids) after `sources[i]`, from decoder layer `layer`'s cross-attention (1-based, -1 the
  /// last; target_cross_attention, batched by `batching`; under an ensemble, model()'s) gathered into
  /// the words of the source sentence and of the target's text (word_alignment).
  std::vector<WordAlignment> align(const std::vector<std::string>& sources,
                                   const std::vector<std::vector<int64_t>>& targets, int64_t layer = -1,
                                   const ScoringOptions& batching = {});
  /// The lexical translation table (text::Lexicon::train, IBM Model 1) of `corpus`'s lines as the
  /// codecs encode them, its shortlists' first ids the target codec's most frequent (ids_by_frequency):
  /// what DecodingOptions::shortlist takes.
  text::Lexicon train_lexicon(const text::Corpus& corpus, const text::LexiconOptions& options = {}) const;
  /// Greedy translations of `sentences`, one each (translate with beam_size 1).
  std::vector<std::string> translate_greedy(const std::vector<std::string>& sentences, int64_t max_new_tokens);

  /// Saves the model (and, when given, the optimizer, schedulers and generator of a training run) with
  /// the config, vocabularies, tokenizer settings and the caller's metadata, atomically.
  void save(const std::filesystem::path& path, const optim::TrainingState& training = {},
            const SafetensorsMetadata& extra = {}) const;
  /// Rebuilds a Translator from a checkpoint written by save(): the model comes back on the CPU in
  /// eval() mode. Errors name the file and what is wrong (not a translation checkpoint, corrupt data,
  /// a config that does not match the tensors). A config describing a model more than twice the size
  /// of the file's tensors is refused before the model is built. An int8 checkpoint (one written
  /// after quantize_int8) comes back quantized.
  static Translator load(const std::filesystem::path& path);
  /// The element-wise mean of the models saved in `paths` (say the last epochs' checkpoints of a run,
  /// as fairseq's average_checkpoints.py does), summed in float64: one model that usually translates
  /// better than any of them. They must share config, vocabularies and tokenizer; an error names the
  /// first checkpoint that differs from the first one given, and refuse int8 ones (average the float
  /// checkpoints, then quantize). The result holds no optimizer state.
  static Translator average(const std::vector<std::filesystem::path>& paths);

  /// Decodes and scores with `member`'s model beside this one's from now on: an ensemble (models::
  /// Ensemble), the models' probabilities averaged at every step, as fairseq and Marian do with several
  /// checkpoints of independent runs. The member must have the same source and target codecs (its
  /// config may differ) and be on the same device; it must not be an ensemble itself.
  void add_ensemble_member(Translator member);
  /// The models that decode together: model() first, then each ensemble member's.
  Ensemble models() const;

  /// Quantizes the Linear and Embedding weights of every model (models()) to int8 per output channel for
  /// CPU inference (nn::quantize_int8); save() then writes an int8 checkpoint, which load() brings back quantized.
  void quantize_int8();
  /// Whether the model's weights are int8 (quantize_int8, or loaded from an int8 checkpoint).
  bool is_quantized() const;

  Transformer& model() { return *model_; }
  const std::shared_ptr<Transformer>& model_ptr() const { return model_; }
  const text::TextCodec& source() const { return source_; }
  const text::TextCodec& target() const { return target_; }

 private:
  std::shared_ptr<Transformer> model_;
  std::vector<std::shared_ptr<Transformer>> ensemble_members_;
  text::TextCodec source_, target_;
};

}  // namespace mf::models
