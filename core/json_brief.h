// User JSON in error messages, kept short and safe (internal, not installed). A hostile file may
// nest a million levels deep, and nlohmann's dump() recurses once per level: dumping such a value
// into a message overflows the stack, so messages go through these instead.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace mf::detail {

/// Cuts `text` to at most `max` bytes (plus "...") without splitting a UTF-8 sequence.
std::string clip_utf8(std::string text, size_t max);

/// `value` as at most 60 bytes of JSON text when it is a primitive or holds only primitives,
/// otherwise "a JSON array of size 3" (never dumped recursively).
std::string brief_json(const nlohmann::json& value);

/// True when `value` nests containers more than `levels` deep ({"a": [1]} nests 2 deep); recurses at
/// most `levels` times, so it is safe on any input.
bool nests_deeper_than(const nlohmann::json& value, int levels);

}  // namespace mf::detail
