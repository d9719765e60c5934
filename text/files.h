// File helpers shared by the text pipeline's readers (internal, not installed). Writers use
// core/atomic_file.h.
#pragma once

#include <filesystem>
#include <fstream>
#include <string_view>

namespace mf::detail {

/// Opens `path` for binary reading, or throws mf::Error "<what> '<path>' does not exist" (or "is a
/// directory", or "cannot be read (Permission denied)").
std::ifstream open_input(const std::filesystem::path& path, std::string_view what);

}  // namespace mf::detail
