// Files written in full or not at all, for every file miniflow writes (checkpoints, vocabularies,
// translations, charts, training states): the bytes go to a temporary file beside the target
// (TARGET.tmp.HOST.PID.N, unique per writer), which is fsync'ed and renamed over the target, and the
// directory is fsync'ed. On any failure the temporary file is removed and whatever was at the target
// is left untouched. A process killed mid-write leaves its temporary file, which readers never look at
// and the next write to the same target on the same host deletes once no process with that id runs.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace mf {

/// One atomic write in progress: write() appends, commit() makes the bytes durable and puts them in
/// place. Destroyed without commit() (an exception in between), it deletes its temporary file.
class AtomicFile {
 public:
  /// `what` names the file in errors: "cannot write <what> '<target>': ...".
  AtomicFile(const std::filesystem::path& target, std::string_view what);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  /// Appends all of `bytes`. Throws mf::Error naming the target and the system's reason.
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);

  /// fsync, rename over the target, fsync the directory (best effort: some file systems refuse it).
  void commit();

 private:
  [[noreturn]] void fail_io(std::string_view action, int err) const;

  std::string target_, what_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `content` to `path` through an AtomicFile; `what` names the file in errors.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, std::string_view what);

}  // namespace mf
