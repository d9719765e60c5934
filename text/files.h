// File helpers shared by the text pipeline's readers and writers (internal, not installed).
#pragma once

#include <filesystem>
#include <fstream>
#include <string_view>

namespace mf::detail {

/// Opens `path` for binary reading, or throws mf::Error "<what> '<path>' does not exist" (or "is a
/// directory", or "cannot be read (Permission denied)").
std::ifstream open_input(const std::filesystem::path& path, std::string_view what);

/// Writes `content` to `path` atomically: a reader sees the old file or the new one, never half of
/// it. Throws mf::Error whose message starts with `op`.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, std::string_view op);

}  // namespace mf::detail
