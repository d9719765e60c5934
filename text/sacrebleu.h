// Standard scores of detokenized text, as the sacreBLEU tool (Post, 2018) computes them, so miniflow's
// numbers can be compared with published ones: corpus BLEU with sacrebleu's 13a tokenization and exp
// smoothing, and chrF (Popović, 2015). The rules are those of sacrebleu 2.4.3 (its BLEU() and CHRF()
// defaults), and the tests/sacrebleu_interop test holds the scores against that Python package to 0.01.
//
// Both scorers take one reference per hypothesis, read lines as UTF-8 (each byte that is not part of
// well-formed UTF-8 counts as one U+FFFD, as Python's errors="replace"), and split words on the
// characters Python's str.split() splits on. The lowercase options lowercase as Python's str.lower()
// does for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic letters, except that İ becomes i (Python:
// i + U+0307) and a word-final Σ becomes σ (Python: ς); other scripts keep their case.
//
// Data-parallel validation scores a shard per rank: sum the counts of the ranks' results (matches,
// totals and lengths for BLEU; the per-order statistics for chrF) and pass the sums to
// sacrebleu_from_counts / chrf_from_counts, which give the score of the whole corpus.
#pragma once

#include "text/bleu.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mf::text {

/// The sacrebleu version whose rules these scorers follow. Signatures name it as
/// "version:2.4.3-miniflow": sacrebleu's rules as miniflow implements them, not sacrebleu itself.
inline constexpr std::string_view kSacrebleuRulesVersion = "2.4.3";

enum class BleuTokenization : uint8_t {
  /// sacrebleu's default "13a", the tokenization of WMT's mteval-v13a.pl (see tokenize_13a).
  Mteval13a,
  /// "none": the line is only split on whitespace (for text tokenized already).
  None,
};

/// sacrebleu's 13a tokenization of one line, its tokens joined by single spaces:
///  1. "<skipped>" is removed, then "-\n" (a hyphen ending a line joins it to the next), then each "\n"
///     becomes a space; then the entities &quot; &amp; &lt; &gt; become " & < >, in that order.
///  2. Each of the ASCII symbols  ! " # $ % & ( ) * + / : ; < = > ? @ [ \ ] ^ _ ` { | } ~  becomes a token
///     of its own (apostrophes and hyphens stay inside words).
///  3. A period or comma is split from what precedes it unless that is a digit, and from what follows it
///     unless that is a digit, the line's start and end counting as spaces (3.5 and 1,000 stay whole; "end."
///     and ",5" split); a hyphen after a digit is split off ("1-2" becomes "1 - 2"; "well-known" stays).
std::string tokenize_13a(std::string_view line);

struct SacreBleuOptions {
  BleuTokenization tokenization = BleuTokenization::Mteval13a;
  bool lowercase = false;  // sacrebleu --lowercase; cased ("case:mixed") by default
  BleuSmoothing smoothing = BleuSmoothing::Exp;
};

/// The words BLEU counts in `line`: lowercased if asked, trailing whitespace removed, tokenized, split.
std::vector<std::string> sacrebleu_words(std::string_view line, const SacreBleuOptions& options = {});

/// sacrebleu's BLEU signature for these options and one reference:
/// "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow".
std::string sacrebleu_signature(const SacreBleuOptions& options = {});

/// Corpus BLEU of detokenized hypotheses against their references (hypotheses[i] translates the
/// source of references[i]), as sacrebleu.corpus_bleu(hypotheses, [references]) with these options;
/// the result carries its signature. Throws mf::Error when the two lists differ in length.
BleuScore corpus_sacrebleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                           const SacreBleuOptions& options = {});

/// bleu_from_counts with the options' smoothing, signed with their signature: the BLEU of a corpus whose
/// parts' counts (from corpus_sacrebleu with the same options) were summed.
BleuScore sacrebleu_from_counts(const BleuScore& counts, const SacreBleuOptions& options = {});

/// chrF's statistics for one character n-gram order, summed over sentences.
struct ChrfOrderCounts {
  int64_t hypothesis = 0;  // hypothesis n-grams (0 for a sentence whose reference has none of this order)
  int64_t reference = 0;   // reference n-grams
  int64_t matches = 0;     // hypothesis n-grams also in the reference, clipped to the reference's count

  friend bool operator==(const ChrfOrderCounts&, const ChrfOrderCounts&) = default;
};

inline constexpr int kChrfCharOrder = 6;

struct ChrfScore {
  double score = 0;  // 0..100
  std::array<ChrfOrderCounts, kChrfCharOrder> counts{};  // orders 1..6
  std::string signature;                                  // "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|..."

  /// sacrebleu's line: "chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3-miniflow = 58.42".
  std::string str() const;
};

struct ChrfOptions {
  bool lowercase = false;  // sacrebleu chrF's --chrf-lowercase; cased by default
};

/// Corpus chrF as sacrebleu's default CHRF(): character n-grams of orders 1..6 of each line with its
/// whitespace removed, no word n-grams, beta 2. Each order's counts are summed over the corpus; the
/// score is the F-beta of the precisions and recalls averaged over the orders that both sides have.
/// Throws mf::Error when the two lists differ in length.
ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      const ChrfOptions& options = {});

/// The chrF score and signature given the summed `counts` (its other fields are ignored).
ChrfScore chrf_from_counts(const ChrfScore& counts, const ChrfOptions& options = {});

}  // namespace mf::text
