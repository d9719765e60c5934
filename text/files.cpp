#include "text/files.h"

#include "core/error.h"

#include <cerrno>
#include <system_error>

namespace mf::detail {

std::ifstream open_input(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  // Opening a directory succeeds on Linux and only reading fails, so check before.
  if (std::filesystem::is_directory(path, ec)) fail("{} '{}' is a directory", what, path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int open_errno = errno;
    if (!std::filesystem::exists(path, ec)) fail("{} '{}' does not exist", what, path.string());
    fail("{} '{}' cannot be read ({})", what, path.string(), errno_text(open_errno));
  }
  return in;
}

}  // namespace mf::detail
