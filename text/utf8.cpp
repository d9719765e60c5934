#include "text/utf8.h"

namespace mf::text::detail {

// The well-formed sequences of Unicode Table 3-7 rule out overlongs (E0 80..9F, F0 80..8F), surrogates
// (ED A0..BF) and code points past U+10FFFF.
DecodedCodePoint decode_utf8_at(std::string_view text, size_t pos) {
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

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto [code_point, length] = decode_utf8_at(text, pos);
  if (length == 0) {
    ++pos;
    return 0xFFFD;
  }
  pos += length;
  return code_point;
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

char32_t lowercase_code_point(char32_t cp) {
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

}  // namespace mf::text::detail
