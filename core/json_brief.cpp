#include "core/json_brief.h"

#include <fmt/format.h>

#include <algorithm>

namespace mf::detail {

std::string clip_utf8(std::string text, size_t max) {
  if (text.size() <= max) return text;
  size_t end = max;  // text[end] is the first byte dropped; back off if it continues a sequence
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "...";
}

std::string brief_json(const nlohmann::json& value) {
  const bool flat =
      std::all_of(value.begin(), value.end(), [](const nlohmann::json& item) { return item.is_primitive(); });
  if (!value.is_primitive() && !flat) return fmt::format("a JSON {} of size {}", value.type_name(), value.size());
  return clip_utf8(value.dump(), 60);
}

bool nests_deeper_than(const nlohmann::json& value, int levels) {
  if (!value.is_structured()) return false;
  if (levels == 0) return true;
  return std::any_of(value.begin(), value.end(),
                     [&](const nlohmann::json& item) { return nests_deeper_than(item, levels - 1); });
}

}  // namespace mf::detail
