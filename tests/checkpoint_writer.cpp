// Helper of tests/kill_mid_save.sh, which kills this program while it saves.
//   checkpoint_writer write PATH MB        saves version 1, 2, 3, ... to PATH with nn::save_tensors (each a
//                                          tensor of MB megabytes filled with the version number, and the
//                                          version in the metadata), printing "saved N" after each save
//                                          returned; runs until killed.
//   checkpoint_writer check PATH MB        loads PATH and prints its version; exit 1 (with the reason) when
//                                          the file is not one complete version.
//   checkpoint_writer write-text PATH MB   the same with a text file of MB megabytes (mf::write_file_atomic,
//                                          as vocabularies, translations and charts are written): lines
//                                          "version N", then "end of version N".
//   checkpoint_writer check-text PATH MB   prints the text file's version; exit 1 unless it is one whole version.
#include "miniflow.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace {

int64_t elements(const std::string& megabytes) { return std::stoll(megabytes) * (1 << 20) / 4; }

[[noreturn]] void write_forever(const std::string& path, int64_t n) {
  mf::Tensor data = mf::Tensor::empty({n});
  for (int64_t version = 1;; ++version) {
    data.fill_(static_cast<double>(version));
    mf::nn::save_tensors(path, {{"data", data}}, {{"version", std::to_string(version)}});
    fmt::print("saved {}\n", version);
    std::fflush(stdout);
  }
}

int check(const std::string& path, int64_t n) {
  mf::nn::TensorFile file = mf::nn::load_tensors(path);  // throws on a truncated or malformed file
  const std::string& version = file.metadata.at("version");
  MF_CHECK(file.tensors.size() == 1 && file.tensors[0].name == "data", "'{}': expected one tensor named data", path);
  const mf::Tensor& data = file.tensors[0].tensor;
  MF_CHECK(data.numel() == n, "'{}': data has {} elements, expected {}", path, data.numel(), n);
  const double expected = std::stod(version);
  // Every element must be the version's: a mix would mean two saves' bytes in one file.
  MF_CHECK(data.min().item<double>() == expected && data.max().item<double>() == expected,
           "'{}': data holds values in [{}, {}], but the metadata says version {}", path, data.min().item<double>(),
           data.max().item<double>(), version);
  fmt::print("{}\n", version);
  return 0;
}

constexpr int64_t kTextLineBytes = 32;  // lines padded to one length, so that MB fixes the line count

// MB megabytes of lines "version N", then "end of version N": a torn write differs in length or lines.
std::string text_version(int64_t version, int64_t megabytes) {
  const std::string line = fmt::format("{:<31}\n", fmt::format("version {}", version));
  const int64_t lines = megabytes * (1 << 20) / kTextLineBytes;
  std::string text;
  text.reserve(static_cast<size_t>(lines * kTextLineBytes + 32));
  for (int64_t i = 0; i < lines; ++i) text += line;
  return text + fmt::format("end of version {}\n", version);
}

[[noreturn]] void write_text_forever(const std::string& path, int64_t megabytes) {
  for (int64_t version = 1;; ++version) {
    mf::write_file_atomic(path, text_version(version, megabytes), "text file");
    fmt::print("saved {}\n", version);
    std::fflush(stdout);
  }
}

int check_text(const std::string& path, int64_t megabytes) {
  std::ifstream in(path, std::ios::binary);
  MF_CHECK(in, "'{}' cannot be read", path);
  std::string first;
  std::getline(in, first);
  int64_t version = 0;
  MF_CHECK(std::sscanf(first.c_str(), "version %ld", &version) == 1, "'{}' starts with '{}'", path, first);
  // The whole file must be exactly that version's text: a torn write would differ in length or lines.
  std::string text = first + "\n" + std::string(std::istreambuf_iterator<char>(in), {});
  MF_CHECK(text == text_version(version, megabytes), "'{}' is not one whole version ({} bytes, starting as version {})",
           path, text.size(), version);
  fmt::print("{}\n", version);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fmt::print(stderr, "usage: checkpoint_writer write|check|write-text|check-text PATH MB\n");
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "write") write_forever(argv[2], elements(argv[3]));
    if (mode == "check") return check(argv[2], elements(argv[3]));
    if (mode == "write-text") write_text_forever(argv[2], std::stoll(argv[3]));
    if (mode == "check-text") return check_text(argv[2], std::stoll(argv[3]));
    fmt::print(stderr, "checkpoint_writer: unknown mode '{}'\n", mode);
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "checkpoint_writer: {}\n", error.what());
    return 1;
  }
}
