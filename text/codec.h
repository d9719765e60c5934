// One side's text to a model's ids and back, either by words (Tokenizer + Vocab: the toy corpus and
// older checkpoints) or by subwords (a SentencePiece model). A translation model holds one per side,
// or one for both when the vocabulary is shared.
#pragma once

#include "text/subword.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mf::text {

class TextCodec {
 public:
  /// Words: `tokenizer` splits (and maybe lowercases) the text, `vocab` maps each word (unknown ones
  /// to <unk>); decode gives the tokens joined by spaces ("a man , walking .").
  TextCodec(Vocab vocab, TokenizerOptions tokenizer);
  /// Subwords: SentencePiece's pieces; decode gives the text back cased and untokenized.
  explicit TextCodec(SubwordModel model);

  /// Ids of `text`, without <sos>/<eos>.
  std::vector<int64_t> encode(std::string_view text) const;
  /// Text of `ids` up to the first <eos>, skipping <pad> and <sos>.
  std::string decode(std::span<const int64_t> ids) const;
  /// The units the model sees for `text`: words (as tokenized) or pieces ("▁walk", "ing").
  std::vector<std::string> units(std::string_view text) const;
  /// Per id, the 0-based index of the word of decode(ids) it belongs to, words being what spaces
  /// separate there (a word vocabulary: each id but the specials is a word; subwords: SubwordModel::
  /// word_indices); -1 for ids that print nothing (<pad>, <sos>, <eos> and what follows it).
  std::vector<int64_t> word_indices(std::span<const int64_t> ids) const;
  /// The unit of `id` (a word, a piece or a special's text).
  const std::string& unit(int64_t id) const;
  /// Number of ids, the four specials included: the embedding's row count.
  int64_t size() const;
  /// True when no text encodes to <unk> (a subword model with byte fallback), so no output needs it.
  bool spells_everything() const;
  /// Every id once, the most frequent units first: a word vocabulary's id order (Vocab::build's),
  /// SubwordModel::ids_by_frequency for subwords (byte pieces last).
  std::vector<int64_t> ids_by_frequency() const;
  /// SubwordModel::control_character_ids; none for words, which hold no line break (the tokenizer
  /// splits at White_Space) and only characters of the text the vocabulary was built from.
  std::vector<int64_t> control_character_ids() const;

  /// The word vocabulary and tokenizer, or null for a subword codec.
  const Vocab* words() const;
  const TokenizerOptions* tokenizer() const;
  /// The SentencePiece model, or null for a word codec.
  const SubwordModel* subwords() const;
  /// "words (9795, lowercased)" or "subwords (SentencePiece, 8000)", for logs and errors.
  std::string describe() const;

  /// The codec as JSON: {"kind": "words", "vocab": {...}, "lowercase": ..., "split_punctuation": ...}
  /// or {"kind": "sentencepiece", "model": "<the .model file's bytes in base64>"}.
  std::string to_json() const;
  /// Parses to_json's output; errors name `origin` and what is malformed (a corrupt subword model
  /// included).
  static TextCodec from_json(std::string_view json, std::string_view origin);

  bool operator==(const TextCodec& other) const;

 private:
  struct Words {
    Vocab vocab;
    Tokenizer tokenizer;
  };
  std::variant<Words, SubwordModel> codec_;
};

}  // namespace mf::text
