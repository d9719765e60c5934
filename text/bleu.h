// Corpus-level BLEU-4 (Papineni et al., 2002) with one reference per sentence, computed the way
// sacrebleu computes it: on already-tokenized text it equals sacrebleu's
// corpus_bleu(hyps, [refs], tokenize="none") on the space-joined tokens. text/sacrebleu.h scores
// detokenized text as sacrebleu's defaults do (13a tokenization, exp smoothing) through these counts.
//
//   p_n  = (clipped n-gram matches summed over all sentences) / (hypothesis n-grams summed), n = 1..4
//   BP   = exp(1 - r/c) if c < r, else 1   (c, r: total hypothesis and reference lengths)
//   BLEU = 100 * BP * (p_1 p_2 p_3 p_4)^(1/4)
//
// "Clipped" means a hypothesis n-gram counts at most as often as it occurs in its reference.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace mf::text {

enum class BleuSmoothing : uint8_t {
  /// No smoothing: BLEU is 0 as soon as one order has no match (sacrebleu smooth_method="none").
  None,
  /// For n = 2..4 only, add one to both the match count and the n-gram total before dividing
  /// (sacrebleu smooth_method="add-k", smooth_value=1), so sentences without a 4-gram match still
  /// score; unigram precision stays unsmoothed. An order the hypothesis is too short to have then
  /// counts 1/1.
  AddOne,
  /// sacrebleu's default, smooth_method="exp" (mteval-v13a's NIST smoothing): the k-th order without
  /// a match, counting from the lowest, gets precision 1 / (2^k * n-gram total) instead of 0.
  Exp,
};

/// sacrebleu's name of a smoothing in its signature: "none", "add-k[1.00]", "exp".
std::string smoothing_name(BleuSmoothing smoothing);

struct BleuScore {
  double score = 0;                    // 0..100
  std::array<double, 4> precisions{};  // p_1..p_4 in percent, after smoothing
  std::array<int64_t, 4> matches{};    // clipped matches per order, summed over the corpus (unsmoothed)
  std::array<int64_t, 4> totals{};     // hypothesis n-grams per order, summed over the corpus (unsmoothed)
  double brevity_penalty = 0;          // 0 when c = 0 < r, as in sacrebleu
  int64_t hypothesis_length = 0;       // c
  int64_t reference_length = 0;        // r
  /// sacrebleu's signature of how the text was scored ("nrefs:1|case:mixed|eff:no|tok:13a|..."), set by
  /// the scorers of text/sacrebleu.h; empty for corpus_bleu on tokens this library split itself.
  std::string signature;

  /// sacrebleu's summary line: "BLEU = 76.73 100.0/85.7/83.3/80.0 (BP = 0.882 ratio = 0.889 hyp_len = 8
  /// ref_len = 9)", with the signature after the name when there is one ("BLEU|nrefs:1|...|version:... = 76.73
  /// ...", as sacrebleu's text output prints it).
  std::string str() const;
};

/// Corpus BLEU of tokenized hypotheses against their references (hypotheses[i] translates the
/// source of references[i]). Throws mf::Error when the two lists differ in length.
BleuScore corpus_bleu(const std::vector<std::vector<std::string>>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      BleuSmoothing smoothing = BleuSmoothing::None);

/// The score, precisions and brevity penalty given the sufficient statistics of `counts` (matches,
/// totals and the two lengths; its other fields are ignored), as sacrebleu's compute_bleu: the BLEU
/// of a corpus read in parts (one per rank of a data-parallel job) is that of their summed counts.
BleuScore bleu_from_counts(const BleuScore& counts, BleuSmoothing smoothing = BleuSmoothing::None);

/// BLEU of one sentence: corpus_bleu over a corpus of one pair. Unsmoothed, any hypothesis without a
/// 4-gram match scores 0, so per-sentence use usually wants BleuSmoothing::AddOne.
BleuScore sentence_bleu(const std::vector<std::string>& hypothesis, const std::vector<std::string>& reference,
                        BleuSmoothing smoothing = BleuSmoothing::None);

}  // namespace mf::text
