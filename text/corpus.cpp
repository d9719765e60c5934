#include "text/corpus.h"

#include "core/error.h"
#include "text/files.h"

#include <fstream>

namespace mf::text {
namespace {

enum class Side : uint8_t { None, Source, Target };

std::string_view without_carriage_return(std::string_view line) {
  return line.ends_with('\r') ? line.substr(0, line.size() - 1) : line;
}

// Shared by the file and in-memory readers, which differ only in how errors name a pair.
class CorpusBuilder {
 public:
  explicit CorpusBuilder(const CorpusOptions& options) : options_(options), tokenizer_(options.tokenizer) {
    MF_CHECK(options.max_length >= 0, "corpus: max_length must be 0 (no limit) or positive, got {}",
             options.max_length);
  }

  // Tokenizes, truncates and appends one pair; returns the side that came out empty (leaving the
  // corpus untouched) or Side::None.
  Side add(std::string_view source_text, std::string_view target_text) {
    std::vector<std::string> source = tokenizer_.tokenize(source_text);
    if (source.empty()) return Side::Source;
    std::vector<std::string> target = tokenizer_.tokenize(target_text);
    if (target.empty()) return Side::Target;
    if (truncate(source)) ++corpus_.stats.truncated_sources;
    if (truncate(target)) ++corpus_.stats.truncated_targets;
    corpus_.sources.push_back(std::move(source));
    corpus_.targets.push_back(std::move(target));
    corpus_.source_text.emplace_back(without_carriage_return(source_text));
    corpus_.target_text.emplace_back(without_carriage_return(target_text));
    ++corpus_.stats.pairs;
    return Side::None;
  }

  // Counts a pair with an empty side as skipped, or throws `message` when skipping is off.
  void empty_pair(const std::string& message) {
    if (!options_.skip_empty) fail("{} (set CorpusOptions::skip_empty to drop such pairs)", message);
    ++corpus_.stats.skipped_empty;
  }

  Corpus finish() { return std::move(corpus_); }

 private:
  bool truncate(std::vector<std::string>& tokens) const {
    if (options_.max_length == 0 || static_cast<int64_t>(tokens.size()) <= options_.max_length) return false;
    tokens.resize(static_cast<size_t>(options_.max_length));
    return true;
  }

  const CorpusOptions& options_;
  Tokenizer tokenizer_;
  Corpus corpus_;
};

// Lines left in `in` (a last line without a newline counts too).
int64_t count_remaining_lines(std::istream& in) {
  int64_t count = 0;
  for (std::string line; std::getline(in, line);) ++count;
  return count;
}

}  // namespace

Corpus read_parallel_corpus(const std::filesystem::path& source_path, const std::filesystem::path& target_path,
                            const CorpusOptions& options) {
  std::ifstream source_in = detail::open_input(source_path, "read_parallel_corpus: source file");
  std::ifstream target_in = detail::open_input(target_path, "read_parallel_corpus: target file");
  return read_parallel_corpus(source_in, target_in, source_path.string(), target_path.string(), options);
}

Corpus read_parallel_corpus(std::istream& source_in, std::istream& target_in, std::string_view source_name,
                            std::string_view target_name, const CorpusOptions& options) {
  CorpusBuilder builder(options);
  std::string source_line, target_line;
  for (int64_t line = 1;; ++line) {
    const bool has_source = static_cast<bool>(std::getline(source_in, source_line));
    const bool has_target = static_cast<bool>(std::getline(target_in, target_line));
    MF_CHECK(!source_in.bad(), "read_parallel_corpus: reading source file '{}' failed", source_name);
    MF_CHECK(!target_in.bad(), "read_parallel_corpus: reading target file '{}' failed", target_name);
    if (!has_source && !has_target) break;
    if (has_source != has_target) {
      // Finish counting the longer file so the message can give both totals.
      const int64_t last = line - 1;
      const int64_t longer = line + count_remaining_lines(has_source ? source_in : target_in);
      fail("read_parallel_corpus: source file '{}' has {} lines but target file '{}' has {}; '{}' ends after line {}",
           source_name, has_source ? longer : last, target_name, has_source ? last : longer,
           has_source ? target_name : source_name, last);
    }
    const Side empty = builder.add(source_line, target_line);
    if (empty != Side::None) {
      builder.empty_pair(fmt::format("read_parallel_corpus: line {} of {} file '{}' is blank", line,
                                     empty == Side::Source ? "source" : "target",
                                     empty == Side::Source ? source_name : target_name));
    }
  }
  return builder.finish();
}

Corpus make_corpus(const std::vector<std::pair<std::string, std::string>>& pairs, const CorpusOptions& options) {
  CorpusBuilder builder(options);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const Side empty = builder.add(pairs[i].first, pairs[i].second);
    if (empty != Side::None)
      builder.empty_pair(fmt::format("make_corpus: pair {} has a blank {} sentence", i + 1,
                                     empty == Side::Source ? "source" : "target"));
  }
  return builder.finish();
}

}  // namespace mf::text
