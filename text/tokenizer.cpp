#include "text/tokenizer.h"

#include "text/utf8.h"

#include <array>

namespace mf::text {
namespace {

using detail::append_utf8;
using detail::decode_utf8_at;
using detail::next_code_point;
using detail::lowercase_code_point;

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

}  // namespace

std::vector<std::string> Tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  std::string word;
  auto end_word = [&] {
    if (!word.empty()) tokens.push_back(std::move(word));
    word.clear();
  };
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = next_code_point(text, pos);
    if (in_ranges(kSpaces, cp)) {
      end_word();
      continue;
    }
    if (options_.lowercase) cp = lowercase_code_point(cp);
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
    const size_t length = decode_utf8_at(text, pos).length;
    if (length == 0) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

}  // namespace mf::text
