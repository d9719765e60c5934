// Word-level tokenizer for UTF-8 text: splits on Unicode whitespace (White_Space, which includes
// tabs and the no-break spaces U+00A0 / U+202F, plus the invisible U+200B zero-width space and
// U+FEFF byte order mark), splits punctuation off into tokens of its own, and optionally lowercases.
//
// Invalid UTF-8 never throws: every byte that is not part of a well-formed sequence (stray
// continuation bytes, truncated or overlong sequences, surrogates, code points above U+10FFFF)
// becomes one U+FFFD REPLACEMENT CHARACTER inside its word. Real corpora contain the odd broken
// byte, and one word mapping to <unk> is better than losing a whole training run over it; the
// output is always valid UTF-8. Use find_invalid_utf8 to reject such input instead.
//
// There is no Unicode normalization: a decomposed "A" + U+0308 stays two code points.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mf::text {

struct TokenizerOptions {
  /// Lowercase ASCII, Latin-1 Supplement, Latin Extended-A, Greek and Cyrillic letters
  /// (Ä -> ä, É -> é, Ł -> ł; ß is lowercase already and stays).
  bool lowercase = true;
  /// Make each punctuation character its own token ("„Hallo“," -> „ Hallo “ ,). Covers ASCII
  /// punctuation and symbols, Latin-1 punctuation (¡ ¿ « » § ¶ ·), the General Punctuation block
  /// (– — ‘ ’ ‚ “ ” „ … ‹ › ...), currency signs, CJK and fullwidth punctuation.
  bool split_punctuation = true;
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerOptions options = {}) : options_(options) {}

  /// Splits `text` into tokens; never returns empty tokens. Invalid UTF-8 becomes U+FFFD.
  std::vector<std::string> tokenize(std::string_view text) const;

  /// Joins tokens with single spaces. Not an exact inverse of tokenize: punctuation stays spaced
  /// off ("hallo , welt !"), which is also the form BLEU is computed on.
  static std::string detokenize(const std::vector<std::string>& tokens);

  const TokenizerOptions& options() const { return options_; }

 private:
  TokenizerOptions options_;
};

/// Byte offset of the first byte that is not part of well-formed UTF-8 (an overlong, a surrogate, a
/// code point past U+10FFFF, a stray or missing continuation byte), or npos if there is none.
size_t find_invalid_utf8(std::string_view text);

}  // namespace mf::text
