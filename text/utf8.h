// UTF-8 helpers shared by the text pipeline's tokenizers (internal, not installed).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mf::text::detail {

struct DecodedCodePoint {
  char32_t code_point;
  size_t length;  // 0: the byte at this position starts no well-formed sequence
};

/// Decodes the code point starting at byte `pos` of `text`, following the well-formed byte
/// sequences of Unicode Table 3-7 (no overlongs, surrogates or code points past U+10FFFF).
DecodedCodePoint decode_utf8_at(std::string_view text, size_t pos);

/// The code point at byte `pos` of `text`, advancing `pos` past it; a byte that starts no well-formed
/// sequence reads as U+FFFD and advances by one (the tokenizers never throw on bad input).
char32_t next_code_point(std::string_view text, size_t& pos);
/// Appends the UTF-8 encoding of `code_point` to `out`.
void append_utf8(std::string& out, char32_t code_point);

/// Simple (one code point to one code point) lowercase mapping of UnicodeData.txt for ASCII, Latin-1
/// Supplement, Latin Extended-A, Greek and Cyrillic; other code points map to themselves.
char32_t lowercase_code_point(char32_t code_point);

}  // namespace mf::text::detail
