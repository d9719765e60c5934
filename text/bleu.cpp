#include "text/bleu.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace mf::text {
namespace {

constexpr int kMaxOrder = 4;

using NGramCounts = std::unordered_map<std::string, int64_t>;

// Keys prefix each token with its length, so no token content can make two n-grams collide.
NGramCounts count_ngrams(const std::vector<std::string>& tokens, size_t n) {
  NGramCounts counts;
  for (size_t start = 0; start + n <= tokens.size(); ++start) {
    std::string key;
    for (size_t k = start; k < start + n; ++k) {
      const auto size = static_cast<uint32_t>(tokens[k].size());
      key.append(reinterpret_cast<const char*>(&size), sizeof(size));
      key += tokens[k];
    }
    ++counts[key];
  }
  return counts;
}

}  // namespace

std::string smoothing_name(BleuSmoothing smoothing) {
  switch (smoothing) {
    case BleuSmoothing::None: return "none";
    case BleuSmoothing::AddOne: return "add-k[1.00]";
    case BleuSmoothing::Exp: return "exp";
  }
  fail("smoothing_name: unknown BleuSmoothing {}", static_cast<int>(smoothing));
}

std::string BleuScore::str() const {
  const double ratio = reference_length > 0 ? static_cast<double>(hypothesis_length) / reference_length : 0.0;
  return fmt::format("BLEU{}{} = {:.2f} {:.1f}/{:.1f}/{:.1f}/{:.1f} (BP = {:.3f} ratio = {:.3f} hyp_len = {} "
                     "ref_len = {})",
                     signature.empty() ? "" : "|", signature, score, precisions[0], precisions[1], precisions[2],
                     precisions[3], brevity_penalty, ratio, hypothesis_length, reference_length);
}

BleuScore corpus_bleu(const std::vector<std::vector<std::string>>& hypotheses,
                      const std::vector<std::vector<std::string>>& references, BleuSmoothing smoothing) {
  MF_CHECK(hypotheses.size() == references.size(),
           "corpus_bleu: {} hypotheses but {} references (one reference per hypothesis)", hypotheses.size(),
           references.size());
  BleuScore result;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const auto& hypothesis = hypotheses[i];
    const auto& reference = references[i];
    result.hypothesis_length += static_cast<int64_t>(hypothesis.size());
    result.reference_length += static_cast<int64_t>(reference.size());
    for (int order = 1; order <= kMaxOrder; ++order) {
      const auto n = static_cast<size_t>(order);
      if (hypothesis.size() < n) break;
      const NGramCounts reference_counts = count_ngrams(reference, n);
      for (const auto& [ngram, count] : count_ngrams(hypothesis, n)) {
        auto it = reference_counts.find(ngram);
        if (it != reference_counts.end()) result.matches[n - 1] += std::min(count, it->second);
      }
      result.totals[n - 1] += static_cast<int64_t>(hypothesis.size() - n + 1);
    }
  }
  return bleu_from_counts(result, smoothing);
}

BleuScore bleu_from_counts(const BleuScore& counts, BleuSmoothing smoothing) {
  BleuScore result;
  result.matches = counts.matches;
  result.totals = counts.totals;
  result.hypothesis_length = counts.hypothesis_length;
  result.reference_length = counts.reference_length;
  const double c = static_cast<double>(result.hypothesis_length);
  const double r = static_cast<double>(result.reference_length);
  result.brevity_penalty = c >= r ? 1.0 : c > 0 ? std::exp(1.0 - r / c) : 0.0;
  // sacrebleu stops here when nothing matched at all, leaving every precision at 0 even when smoothing.
  if (std::all_of(result.matches.begin(), result.matches.end(), [](int64_t m) { return m == 0; })) return result;

  double log_sum = 0;
  double exp_smoothing_divisor = 1;
  for (int n = 1; n <= kMaxOrder; ++n) {
    double matches = static_cast<double>(result.matches[n - 1]);
    double total = static_cast<double>(result.totals[n - 1]);
    if (smoothing == BleuSmoothing::AddOne && n > 1) {
      matches += 1;
      total += 1;
    }
    if (smoothing == BleuSmoothing::Exp && total > 0 && matches == 0) {
      exp_smoothing_divisor *= 2;
      result.precisions[n - 1] = 100.0 / (exp_smoothing_divisor * total);
      log_sum += std::log(result.precisions[n - 1]);
      continue;
    }
    // A zero precision makes the geometric mean, and so BLEU, zero.
    if (total == 0 || matches == 0) {
      log_sum = -std::numeric_limits<double>::infinity();
      continue;
    }
    result.precisions[n - 1] = 100.0 * matches / total;
    log_sum += std::log(result.precisions[n - 1]);
  }
  result.score = result.brevity_penalty * std::exp(log_sum / kMaxOrder);
  return result;
}

BleuScore sentence_bleu(const std::vector<std::string>& hypothesis, const std::vector<std::string>& reference,
                        BleuSmoothing smoothing) {
  return corpus_bleu({hypothesis}, {reference}, smoothing);
}

}  // namespace mf::text
