#include "text/tokenizer.h"

#include <array>

namespace mf::text {
namespace {

struct Decoded {
  char32_t code_point;
  size_t length;  // 0: the byte at this position starts no well-formed sequence
};

// Decodes one code point following the well-formed byte sequences of Unicode Table 3-7, which
// rule out overlongs (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points past U+10FFFF.
Decoded decode_at(std::string_view text, size_t pos) {
  auto byte = [&](size_t k) -> unsigned {
    return pos + k < text.size() ? static_cast<unsigned char>(text[pos + k]) : 0x100;  // 0x100: past the end
  };
  const unsigned lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  char32_t code_point = 0;
  unsigned lo = 0x80, hi = 0xBF;  // range allowed for the next continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {0, 0};
  }
  for (size_t k = 1; k < length; ++k) {
    const unsigned b = byte(k);
    if (b < lo || b > hi) return {0, 0};
    code_point = (code_point << 6) | (b & 0x3F);
    lo = 0x80;
    hi = 0xBF;
  }
  return {code_point, length};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

struct Range {
  char32_t first, last;
};

template <size_t N>
constexpr bool in_ranges(const std::array<Range, N>& ranges, char32_t cp) {
  for (const Range& r : ranges)
    if (cp >= r.first && cp <= r.last) return true;
  return false;
}

constexpr std::array<Range, 12> kSpaces{{
    {0x0009, 0x000D}, {0x0020, 0x0020}, {0x0085, 0x0085}, {0x00A0, 0x00A0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
    // Not White_Space, but invisible: left in, they would glue themselves onto words.
    {0x200B, 0x200B}, {0xFEFF, 0xFEFF},
}};

constexpr std::array<Range, 20> kPunctuation{{
    {0x0021, 0x002F}, {0x003A, 0x0040}, {0x005B, 0x0060}, {0x007B, 0x007E},  // ASCII
    {0x00A1, 0x00A5}, {0x00A7, 0x00A7}, {0x00AB, 0x00AB}, {0x00B6, 0x00B7},  // ¡ ¢ £ ¤ ¥ § « ¶ ·
    {0x00BB, 0x00BB}, {0x00BF, 0x00BF},                                      // » ¿
    {0x2010, 0x2027}, {0x2030, 0x205E},                                      // General Punctuation
    {0x20A0, 0x20C0},                                                        // currency signs (€ ...)
    {0x3001, 0x3003}, {0x3008, 0x3011}, {0x3014, 0x301F},                    // CJK
    {0xFF01, 0xFF0F}, {0xFF1A, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65},  // fullwidth
}};

// Simple (one code point to one code point) lowercase mappings of UnicodeData.txt for the blocks
// European corpora need.
char32_t to_lower(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;  // À..Þ, not ×
  if (cp < 0x100) return cp;
  // Latin Extended-A pairs upper/lower case alternately, with the parity switching twice.
  if (cp == 0x130) return 'i';  // İ
  if (cp <= 0x137) return cp % 2 == 0 ? cp + 1 : cp;
  if (cp >= 0x139 && cp <= 0x148) return cp % 2 == 1 ? cp + 1 : cp;
  if (cp >= 0x14A && cp <= 0x177) return cp % 2 == 0 ? cp + 1 : cp;
  if (cp == 0x178) return 0xFF;  // Ÿ
  if (cp >= 0x179 && cp <= 0x17E) return cp % 2 == 1 ? cp + 1 : cp;
  // Greek
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 32;
  // Cyrillic
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  return cp;
}

}  // namespace

std::vector<std::string> Tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  std::string word;
  auto end_word = [&] {
    if (!word.empty()) tokens.push_back(std::move(word));
    word.clear();
  };
  for (size_t pos = 0; pos < text.size();) {
    auto [cp, length] = decode_at(text, pos);
    if (length == 0) {
      cp = 0xFFFD;
      length = 1;
    }
    pos += length;
    if (in_ranges(kSpaces, cp)) {
      end_word();
      continue;
    }
    if (options_.lowercase) cp = to_lower(cp);
    if (options_.split_punctuation && in_ranges(kPunctuation, cp)) {
      end_word();
      append_utf8(tokens.emplace_back(), cp);
      continue;
    }
    append_utf8(word, cp);
  }
  end_word();
  return tokens;
}

std::string Tokenizer::detokenize(const std::vector<std::string>& tokens) {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) text += ' ';
    text += tokens[i];
  }
  return text;
}

size_t find_invalid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = decode_at(text, pos).length;
    if (length == 0) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

}  // namespace mf::text
