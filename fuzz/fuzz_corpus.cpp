// Fuzz target: a parallel corpus -> read_parallel_corpus (and so the tokenizer).
//
// Input layout: byte 0 chooses the options (bit 0 lowercase, bit 1 split_punctuation, bit 2
// skip_empty, bits 3-7 max_length 0..31); the rest is the source file's text, a NUL byte, then the
// target file's text (no NUL: the target is empty). tests/fuzz_corpus/corpus/ holds examples.
//
// Promises checked on what loads: the sides have one sentence per pair, sentences are non-empty and
// within max_length, tokens are non-empty valid UTF-8 without spaces, and tokenizing the
// detokenized sentence gives the same tokens back.
#include "fuzz/fuzz.h"
#include "miniflow.h"

#include <sstream>

namespace {

void check_sentence(const std::vector<std::string>& tokens, const mf::text::CorpusOptions& options) {
  mf::fuzz::require(!tokens.empty(), "no sentence is empty");
  mf::fuzz::require(options.max_length == 0 || static_cast<int64_t>(tokens.size()) <= options.max_length,
                    "sentences are cut to max_length");
  for (const std::string& token : tokens) {
    mf::fuzz::require(!token.empty(), "no token is empty");
    mf::fuzz::require(mf::text::find_invalid_utf8(token) == std::string::npos, "tokens are valid UTF-8");
    mf::fuzz::require(token.find_first_of(" \t\n\r\f\v") == std::string::npos, "tokens hold no whitespace");
  }
  mf::text::Tokenizer tokenizer(options.tokenizer);
  mf::fuzz::require(tokenizer.tokenize(mf::text::Tokenizer::detokenize(tokens)) == tokens,
                    "tokenize(detokenize(tokens)) == tokens");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const mf::text::CorpusOptions options{.tokenizer = {.lowercase = (flags & 1) != 0, .split_punctuation = (flags & 2) != 0},
                                  .max_length = flags >> 3,
                                  .skip_empty = (flags & 4) != 0};
  const std::string_view text = mf::fuzz::as_text(data + 1, size - 1);
  const size_t nul = text.find('\0');
  std::istringstream source(std::string(text.substr(0, nul)));
  std::istringstream target(nul == std::string_view::npos ? std::string() : std::string(text.substr(nul + 1)));
  mf::fuzz::expect_only_mf_errors([&] {
    mf::text::Corpus corpus = mf::text::read_parallel_corpus(source, target, "source.txt", "target.txt", options);
    mf::fuzz::require(corpus.sources.size() == corpus.targets.size() &&
                          static_cast<int64_t>(corpus.sources.size()) == corpus.stats.pairs,
                      "one source and one target per pair");
    for (size_t i = 0; i < corpus.sources.size(); ++i) {
      check_sentence(corpus.sources[i], options);
      check_sentence(corpus.targets[i], options);
    }
  });
  return 0;
}
