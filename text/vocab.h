// Token <-> id mapping, with the special tokens a sequence-to-sequence model needs at fixed ids.
#pragma once

#include "text/special_tokens.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mf::text {

/// How often each token occurs (fill with count_tokens).
using TokenCounts = std::unordered_map<std::string, int64_t>;

/// Adds one count per token occurrence in `sentences` to `counts`; call once per side for a vocabulary
/// shared by source and target.
void count_tokens(const std::vector<std::vector<std::string>>& sentences, TokenCounts& counts);

struct VocabOptions {
  /// Tokens seen fewer times are left out (and encode to <unk>).
  int64_t min_freq = 1;
  /// Most tokens kept, the four specials included, so it is the embedding's row count; 0: no limit.
  int64_t max_size = 0;
};

/// What encode adds around the tokens: a decoder input starts with <sos>, sequences end with <eos>.
struct EncodeOptions {
  bool add_sos = false;
  bool add_eos = false;
};

class Vocab {
 public:
  /// A vocabulary holding only the four specials.
  Vocab();

  /// The specials, then the tokens counted at least min_freq times, most frequent first and ties in
  /// byte (= code point) order, so equal counts always give the same ids. Tokens spelled like a
  /// special are skipped. Throws mf::Error for min_freq < 1, max_size < 0 or 1..3, and for a token
  /// that is empty or not valid UTF-8.
  static Vocab build(const TokenCounts& counts, const VocabOptions& options = {});

  /// Number of tokens, specials included.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /// All tokens, indexed by id.
  const std::vector<std::string>& tokens() const { return tokens_; }
  /// True when `token` has an id of its own.
  bool contains(std::string_view token) const { return ids_.find(token) != ids_.end(); }
  /// The id of `token`, or kUnkId when it is not in the vocabulary.
  int64_t id(std::string_view token) const;
  /// The token with id `id`; throws mf::Error when it is out of range.
  const std::string& token(int64_t id) const;

  /// Ids of `tokens` (unknown ones become kUnkId), with <sos>/<eos> added as asked.
  std::vector<int64_t> encode(const std::vector<std::string>& tokens, EncodeOptions options = {}) const;
  /// Tokens of `ids` up to the first <eos>, skipping <pad> and <sos> (model output back to text).
  /// Throws mf::Error for an id out of range.
  std::vector<std::string> decode(std::span<const int64_t> ids) const;

  /// The vocabulary as JSON: {"format": "miniflow-vocab", "version": 1, "tokens": [...]}.
  std::string to_json() const;
  /// Parses to_json's output. Throws mf::Error naming `origin` for invalid JSON, a wrong format or
  /// version, specials missing from ids 0..3, and empty, invalid or duplicate tokens.
  static Vocab from_json(std::string_view json, std::string_view origin = "JSON string");

  /// Writes to_json() to `path` atomically (core/atomic_file.h).
  void save(const std::filesystem::path& path) const;
  /// Reads a file written by save; errors name the file.
  static Vocab load(const std::filesystem::path& path);

  bool operator==(const Vocab& other) const { return tokens_ == other.tokens_; }

 private:
  // Transparent hashing lets id() look up a string_view without building a std::string.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };

  explicit Vocab(std::vector<std::string> tokens);  // tokens must be validated already

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> ids_;
};

}  // namespace mf::text
