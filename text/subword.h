// Subword vocabularies: a SentencePiece model (unigram or BPE) learned from raw sentences or read
// from a `.model` file, with miniflow's four special tokens at their fixed ids. SentencePiece treats
// text as a sequence of Unicode characters with spaces as "▁", so decode(encode(s)) gives s back
// (after its NFKC normalization), cased and untokenized; with byte fallback, characters the model
// never saw become UTF-8 byte pieces instead of <unk>.
#pragma once

#include "text/special_tokens.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mf::text {

enum class SubwordAlgorithm : uint8_t { Unigram, Bpe };

struct SubwordOptions {
  SubwordAlgorithm algorithm = SubwordAlgorithm::Unigram;
  /// Pieces in the model, the four specials included: the embedding's row count.
  int64_t vocab_size = 8000;
  /// Characters outside the learned pieces become their UTF-8 bytes (256 pieces of the vocabulary)
  /// rather than <unk>, so no input encodes to <unk>.
  bool byte_fallback = true;
  /// Share of the training text's characters the model must cover; the rarest rest are left to byte
  /// fallback or <unk>. 1.0 suits alphabetic scripts; SentencePiece suggests 0.9995 for CJK.
  double character_coverage = 1.0;
  /// Sentences SentencePiece samples from the training text (it loads them all into memory).
  int64_t max_sentences = 1'000'000;
  /// Seeds the sampling of the sentences, so the same text and options give the same model.
  uint32_t seed = 1;
};

/// Subword regularization (Kudo 2018) and BPE-dropout (Provilkov et al. 2020) as SentencePiece's
/// SampleEncode gives them: each time a training sentence is encoded it gets another segmentation, so
/// the model learns the pieces' compositions (Marian's --sentencepiece-alphas, fairseq's and
/// OpenNMT's subword sampling).
struct SubwordSampling {
  /// Unigram models: segmentations are drawn with probability proportional to P(segmentation)^alpha,
  /// so smaller values draw more varied ones (an 8,000-piece model of Multi30k's German side: 0.5 gives
  /// 3% more pieces than the best segmentation, 0.2 31%, 0.1 twice as many). BPE models: the probability
  /// that a merge is skipped, below 1. Positive.
  double alpha = 0.5;
  /// Unigram models: draw among the nbest_size best segmentations; -1: among all of them (the whole
  /// lattice, Kudo's l = infinity). Otherwise at least 2. BPE models ignore it.
  int64_t nbest_size = -1;
};

class SubwordModel {
 public:
  /// Learns a model from `sentences` (raw text, one sentence each; empty ones are skipped). Throws
  /// mf::Error naming the problem when SentencePiece refuses (too few distinct characters for the
  /// vocabulary size, say).
  static SubwordModel train(const std::vector<std::string>& sentences, const SubwordOptions& options);
  /// A model from the bytes of a SentencePiece `.model` file (a serialized ModelProto); `origin`
  /// names them in errors. Its special pieces may sit at any ids: they are mapped onto miniflow's.
  static SubwordModel from_bytes(std::string bytes, std::string_view origin);
  /// from_bytes on the contents of a `.model` file.
  static SubwordModel load(const std::filesystem::path& path);

  /// The model's bytes, as a `.model` file holds them (from_bytes takes them back).
  const std::string& bytes() const { return bytes_; }
  /// Number of ids, the four specials included.
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  /// Whether the model spells unseen characters as byte pieces, so that no text encodes to <unk>.
  bool byte_fallback() const { return byte_fallback_; }
  /// The piece of `id` ("▁the", "<0xC3>", "<eos>"); throws mf::Error when it is out of range.
  const std::string& piece(int64_t id) const;
  /// Every id once, the most frequent units first as the model ranks them: miniflow's four specials,
  /// then SentencePiece's pieces in its order (by score: a unigram model's log-probability, a BPE
  /// model's merge order), then the byte pieces, which spell only the characters no piece holds.
  std::vector<int64_t> ids_by_frequency() const;
  /// Ids of the byte pieces that spell a control character (U+0000 to U+001F and U+007F); empty
  /// without byte fallback. Text that SentencePiece's default normalization (nmt_nfkc) has passed
  /// holds none, so no training target does, but an undertrained model can still produce them, and
  /// a line break inside a translation would split it over two output lines.
  const std::vector<int64_t>& control_character_ids() const { return control_character_ids_; }

  /// Ids of the pieces of `text`, without <sos>/<eos>. Invalid UTF-8 never throws: SentencePiece
  /// replaces each bad byte with U+FFFD first.
  std::vector<int64_t> encode(std::string_view text) const;
  /// encode() of each of `texts` with a sampled segmentation instead of the best one (decode still
  /// gives the text back). The draws depend on `seed` alone: the same texts, sampling and seed give the
  /// same ids in any thread or process. Throws mf::Error for sampling outside its ranges.
  std::vector<std::vector<int64_t>> sample_encode(std::span<const std::string> texts, const SubwordSampling& sampling,
                                                  uint32_t seed) const;
  /// The pieces themselves (for display).
  std::vector<std::string> pieces(std::string_view text) const;
  /// Text of `ids` up to the first <eos>, skipping <pad> and <sos>; <unk> (only possible without byte
  /// fallback) reads " ⁇ ".
  std::string decode(std::span<const int64_t> ids) const;
  /// Per id, the 0-based index of the word of decode(ids) it spells, words being what spaces separate
  /// there: a piece starting with "▁" begins a word, a piece of "▁" alone belongs to the word after
  /// it, <unk> (" ⁇ ") is a word of its own. -1 for ids that spell no word: <pad>, <sos>, <eos> and
  /// what follows it, and "▁" pieces with no word after them.
  std::vector<int64_t> word_indices(std::span<const int64_t> ids) const;

  bool operator==(const SubwordModel& other) const { return bytes_ == other.bytes_; }

 private:
  class Processor;
  SubwordModel(std::string bytes, std::string_view origin);
  /// miniflow's ids of SentencePiece's `ids`.
  std::vector<int64_t> from_sentencepiece(std::span<const int> ids) const;

  std::string bytes_;
  std::shared_ptr<const Processor> processor_;
  // miniflow's ids are the four specials, then SentencePiece's other pieces in its order.
  std::vector<int> to_sentencepiece_;  // by miniflow id; -1 for a special SentencePiece lacks
  std::vector<int64_t> from_sentencepiece_;  // by SentencePiece id
  std::vector<std::string> pieces_;          // by miniflow id
  bool byte_fallback_ = false;
  std::vector<int64_t> control_character_ids_;
};

}  // namespace mf::text
