// Parallel corpora: pairs of sentences, one a translation of the other, tokenized and length-capped.
#pragma once

#include "text/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mf::text {

struct CorpusOptions {
  TokenizerOptions tokenizer = {};
  /// Sentences longer than this many tokens keep their first max_length tokens; 0: no limit.
  int64_t max_length = 0;
  /// Drop pairs where either side has no tokens (counted in CorpusStats::skipped_empty) instead of
  /// throwing mf::Error.
  bool skip_empty = false;
};

struct CorpusStats {
  int64_t pairs = 0;              // pairs kept
  int64_t skipped_empty = 0;      // pairs dropped for an empty side (only with skip_empty)
  int64_t truncated_sources = 0;  // source sentences cut to max_length
  int64_t truncated_targets = 0;  // target sentences cut to max_length
};

/// Tokenized sentence pairs: sources[i] translates to targets[i]; source_text[i] and target_text[i] are
/// the lines as read (a trailing '\r' dropped, not truncated), for subword models, which split raw text.
struct Corpus {
  std::vector<std::vector<std::string>> sources;
  std::vector<std::vector<std::string>> targets;
  std::vector<std::string> source_text, target_text;
  CorpusStats stats;
};

/// Reads two line-aligned UTF-8 text files, line i of one translating line i of the other, and
/// tokenizes every line. Throws mf::Error, naming the file, when a file is missing or unreadable,
/// when the line counts differ (both counts and the line where the shorter file ends), and, unless
/// skip_empty is set, for a blank line (file and line number).
Corpus read_parallel_corpus(const std::filesystem::path& source_path, const std::filesystem::path& target_path,
                            const CorpusOptions& options = {});

/// The same for two open streams (read to their end); `source_name` and `target_name` stand for the
/// files in error messages.
Corpus read_parallel_corpus(std::istream& source, std::istream& target, std::string_view source_name,
                            std::string_view target_name, const CorpusOptions& options = {});

/// The same for a corpus held in memory as (source, target) pairs, e.g. one built into a program;
/// errors name the pair by its 1-based number.
Corpus make_corpus(const std::vector<std::pair<std::string, std::string>>& pairs, const CorpusOptions& options = {});

}  // namespace mf::text
