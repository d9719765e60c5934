#include "text/files.h"

#include "core/error.h"

#include <cerrno>
#include <random>
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
    fail("{} '{}' cannot be read ({})", what, path.string(), std::generic_category().message(open_errno));
  }
  return in;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content, std::string_view op) {
  // rename() within one directory replaces the target atomically on POSIX filesystems, so the
  // temporary goes beside the target; the random suffix keeps concurrent writers apart.
  std::random_device entropy;
  std::filesystem::path temp = path;
  temp += fmt::format(".tmp-{:08x}{:08x}", entropy(), entropy());
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  if (!out)
    fail("{}: cannot create a temporary file beside '{}' ({})", op, path.string(),
         std::generic_category().message(errno));
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  std::error_code ec;
  if (!out) {
    std::filesystem::remove(temp, ec);
    fail("{}: writing '{}' failed", op, temp.string());
  }
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    fail("{}: cannot replace '{}' ({})", op, path.string(), ec.message());
  }
}

}  // namespace mf::detail
