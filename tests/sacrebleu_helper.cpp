// The C++ side of tests/interop_sacrebleu.py, which holds miniflow's scores against Python's sacrebleu:
//   sacrebleu_helper tokenize FILE    prints the 13a tokenization of each line of FILE
//   sacrebleu_helper score HYP REF    prints sacrebleu's summary lines for the hypotheses in HYP against the
//                                     references in REF: BLEU cased, lowercased and with tok:none, then chrF
//                                     cased and lowercased
// Lines are split on '\n' only, as the script splits them, so a '\r' stays part of its line.
#include "miniflow.h"

#include <fmt/core.h>

#include <fstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> read_lines(const char* path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) mf::fail("cannot open '{}'", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(std::move(line));
  return lines;
}

int run(int argc, char** argv) {
  const std::string mode = argc >= 2 ? argv[1] : "";
  if (mode == "tokenize" && argc == 3) {
    for (const std::string& line : read_lines(argv[2])) fmt::print("{}\n", mf::text::tokenize_13a(line));
    return 0;
  }
  if (mode == "score" && argc == 4) {
    using mf::text::BleuTokenization;
    const std::vector<std::string> hypotheses = read_lines(argv[2]), references = read_lines(argv[3]);
    fmt::print("{}\n", mf::text::corpus_sacrebleu(hypotheses, references).str());
    fmt::print("{}\n", mf::text::corpus_sacrebleu(hypotheses, references, {.lowercase = true}).str());
    fmt::print("{}\n",
               mf::text::corpus_sacrebleu(hypotheses, references, {.tokenization = BleuTokenization::None}).str());
    fmt::print("{}\n", mf::text::corpus_chrf(hypotheses, references).str());
    fmt::print("{}\n", mf::text::corpus_chrf(hypotheses, references, {.lowercase = true}).str());
    return 0;
  }
  fmt::print(stderr, "usage: sacrebleu_helper tokenize FILE | sacrebleu_helper score HYPOTHESES REFERENCES\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "sacrebleu_helper: {}\n", error.what());
    return 1;
  }
}
