#include "core/atomic_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <system_error>
#include <vector>

namespace mf {
namespace {

// This host's name as temporary file names spell it. Process ids identify a writer only on the host
// that ran it, so a temporary file is only ever judged stale on its own host (file systems can be shared).
const std::string& host_name() {
  static const std::string name = [] {
    std::array<char, 256> buffer{};
    if (::gethostname(buffer.data(), buffer.size() - 1) != 0) return std::string("localhost");
    return std::string(buffer.data());
  }();
  return name;
}

// Deletes the temporary files of `target` (TARGET.tmp.HOST.PID.N) that writers on this host left when
// they were killed mid-save: those whose process no longer exists. A live writer's file, or another
// host's, is never touched. Best effort: a file that cannot be listed or removed is left alone.
void remove_stale_temp_files(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string prefix = target.filename().string() + ".tmp." + host_name() + ".";
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::vector<fs::path> stale;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    pid_t pid = 0;
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size();
    auto [next, parse_error] = std::from_chars(first, last, pid);
    if (parse_error != std::errc() || next == last || *next != '.' || pid <= 0 || pid == ::getpid()) continue;
    // Exactly PID.N: a host named HOST.<digits> writes names that start with this prefix too.
    uint64_t counter = 0;
    if (auto [end, counter_error] = std::from_chars(next + 1, last, counter);
        counter_error != std::errc() || end != last)
      continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(it->path());  // EPERM: alive, not ours
  }
  for (const fs::path& path : stale) fs::remove(path, error);
}

}  // namespace

// The temporary file's name holds the host and process id, so that a later write can recognise it as
// stale when this process is killed before it could clean up.
AtomicFile::AtomicFile(const std::filesystem::path& target, std::string_view what)
    : target_(target.string()), what_(what) {
  remove_stale_temp_files(target);
  static std::atomic<uint64_t> counter{0};
  // O_EXCL makes the name ours; a clash (a file left by a crashed process) just moves on.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    path_ = fmt::format("{}.tmp.{}.{}.{}", target_, host_name(), ::getpid(), counter++);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 100)) fail_io("creating", errno);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_io("writing", errno);
    done += static_cast<size_t>(n);
  }
}

void AtomicFile::write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail_io("syncing", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io("closing", errno);
  if (::rename(path_.c_str(), target_.c_str()) != 0) fail_io("renaming", errno);
  committed_ = true;
  // The rename is durable only once the directory is: the new file is already in place either way.
  std::filesystem::path dir = std::filesystem::path(target_).parent_path();
  if (int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void AtomicFile::fail_io(std::string_view action, int err) const {
  fail("cannot write {} '{}': {} temporary file '{}' failed: {}", what_, target_, action, path_, errno_text(err));
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content, std::string_view what) {
  AtomicFile file(path, what);
  file.write(content);
  file.commit();
}

}  // namespace mf
