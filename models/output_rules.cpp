#include "models/output_rules.h"

#include "core/error.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace mf::generation {

OutputRules::OutputRules(const char* op, std::vector<int64_t> end_ids, int64_t min_new_tokens,
                         int64_t no_repeat_ngram_size)
    : end_ids_(std::move(end_ids)), min_new_tokens_(min_new_tokens), n_(no_repeat_ngram_size) {
  MF_CHECK(min_new_tokens >= 0, "{}: min_new_tokens must be at least 0, got {}", op, min_new_tokens);
  MF_CHECK(n_ >= 0, "{}: no_repeat_ngram_size must be at least 0 (0: off), got {}", op, n_);
}

std::vector<int64_t> OutputRules::ruled_out_next(const std::vector<int64_t>& tokens,
                                                 const std::vector<int64_t>& preceding) const {
  std::vector<int64_t> out;
  if (static_cast<int64_t>(tokens.size()) < min_new_tokens_) out = end_ids_;
  const auto n = static_cast<size_t>(n_);
  if (n == 0 || preceding.size() + tokens.size() < n) return out;
  std::vector<int64_t> joined;
  if (!preceding.empty()) {
    joined = preceding;
    joined.insert(joined.end(), tokens.begin(), tokens.end());
  }
  const std::vector<int64_t>& sequence = preceding.empty() ? tokens : joined;
  const auto tail = sequence.end() - static_cast<std::ptrdiff_t>(n - 1);  // the last n - 1 tokens
  for (auto start = sequence.begin(); start + static_cast<std::ptrdiff_t>(n) <= sequence.end(); ++start) {
    const int64_t completes = start[static_cast<std::ptrdiff_t>(n - 1)];
    if (std::equal(tail, sequence.end(), start) && std::find(out.begin(), out.end(), completes) == out.end())
      out.push_back(completes);
  }
  return out;
}

void rule_out(Tensor& scores, const std::vector<int64_t>& banned, const std::vector<std::vector<int64_t>>& row_bans) {
  constexpr double kNever = -std::numeric_limits<double>::infinity();
  for (int64_t token : banned) scores.narrow(1, token, 1).fill_(kNever);
  for (size_t row = 0; row < row_bans.size(); ++row) {
    Tensor row_scores = scores.select(0, static_cast<int64_t>(row));
    for (int64_t token : row_bans[row]) row_scores.narrow(0, token, 1).fill_(kNever);
  }
}

void check_tokens_left(const char* op, int64_t vocab, const std::vector<int64_t>& banned,
                       const std::vector<std::vector<int64_t>>& row_bans) {
  auto rules_out_all = [vocab, &banned](const std::vector<int64_t>& more) {
    if (static_cast<int64_t>(banned.size() + more.size()) < vocab) return false;
    std::vector<int64_t> distinct = banned;
    distinct.insert(distinct.end(), more.begin(), more.end());
    std::sort(distinct.begin(), distinct.end());
    return std::unique(distinct.begin(), distinct.end()) - distinct.begin() >= vocab;
  };
  MF_CHECK(!rules_out_all({}), "{}: banned_ids rule out every one of the {} tokens", op, vocab);
  for (const std::vector<int64_t>& bans : row_bans)
    MF_CHECK(!rules_out_all(bans),
             "{}: a hypothesis has no token left to take: banned_ids, min_new_tokens and no_repeat_ngram_size rule "
             "out every one of the {} tokens",
             op, vocab);
}

}  // namespace mf::generation
