// A lexical translation table and the output shortlists it gives (Marian's --shortlist, CTranslate2's
// vocabulary map): t(target unit | source unit) learned from a parallel corpus's ids by IBM Model 1
// (Brown et al. 1993, "The Mathematics of Statistical Machine Translation"), or by fast_align's
// reparameterization of IBM Model 2 (Dyer, Chahuneau and Smith 2013, "A Simple, Fast, and Effective
// Reparameterization of IBM Model 2"), which Marian's recipes align with, kept as each source unit's
// most probable translations. Decoding a batch then scores only the target units its sources'
// translations, the most frequent target units and (with one vocabulary for both sides) the sources' own units
// hold, instead of the whole vocabulary: an approximation, usually BLEU-neutral, that makes the output
// projection a fraction of its size.
#pragma once

#include "text/codec.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

namespace mf::text {

/// What one expectation-maximization pass of Lexicon::train found, for LexiconOptions::on_pass: what
/// fast_align and GIZA++ print after each pass.
struct LexiconPass {
  int64_t pass = 0;  // from 1
  /// The mean over the corpus's target units of ln p(unit | its source sentence) under the table and
  /// tension the pass started from (the alignment prior times t, summed over the source positions and
  /// NULL; t starts uniform over the target units the corpus holds). Plain EM never lowers it from one
  /// pass to the next, re-estimating the tension included; variational Bayes may.
  double log_likelihood = 0;
  /// The tension the next pass starts from (re-estimated with optimize_tension); 0 for IBM Model 1.
  double diagonal_tension = 0;

  /// exp(-log_likelihood): the perplexity of the target units.
  double perplexity() const { return std::exp(-log_likelihood); }
};

struct LexiconOptions {
  /// Expectation-maximization passes over the corpus; at least 1.
  int64_t iterations = 5;
  /// A source NULL every target unit may also come from (IBM Model 1's empty word), so that units no
  /// source unit explains (articles, punctuation) do not crowd the translations of the others.
  bool null_word = true;
  /// fast_align's preference for the diagonal (its -d): the unit at target position i of m comes from
  /// source position j of n with a weight proportional to exp(-tension |i/m - j/n|), so that a unit is
  /// credited mostly to the source units across from it. 0: IBM Model 1, every position alike.
  double diagonal_tension = 0;
  /// With a diagonal_tension: the tension re-estimated after each pass (fast_align's -o), by Newton's
  /// method on the expected log-likelihood of the pass's alignments; the tension given is the start.
  bool optimize_tension = false;
  /// With a diagonal_tension and null_word: the prior probability that a target unit comes from NULL
  /// (fast_align's -p0), in [0, 1).
  double null_probability = 0.08;
  /// Variational Bayes under a symmetric Dirichlet prior of this concentration on each t(. | source)
  /// (fast_align's -v with its -a): counts well below one unit are driven to nothing, so each unit keeps
  /// fewer, likelier translations; its t then sums to less than 1. 0: maximum likelihood (plain EM).
  double dirichlet_alpha = 0;
  /// Translations kept per source unit, the most probable first; at least 1.
  int64_t keep = 100;
  /// Translations less probable than this are dropped, in (0, 1].
  double min_probability = 1e-3;
  /// Called after each pass, or not at all when empty.
  std::function<void(const LexiconPass&)> on_pass;
};

/// One entry of a source unit's translations.
struct LexicalEntry {
  int64_t target;
  double probability;  // t(target | source)
  bool operator==(const LexicalEntry&) const = default;
};

class Lexicon {
 public:
  /// IBM Model 1 (or, with options.diagonal_tension, fast_align's Model 2) trained on sources[i]
  /// translating to targets[i] (ids without specials; pairs with an empty side are skipped), starting
  /// from uniform t. `targets_by_frequency` ranks the target vocabulary for shortlist()'s `first`
  /// (TextCodec::ids_by_frequency); empty: id order. Throws mf::Error for options out of range,
  /// different pair counts, a negative id, or a ranking holding a negative id or an id twice.
  static Lexicon train(const std::vector<std::vector<int64_t>>& sources,
                       const std::vector<std::vector<int64_t>>& targets, const LexiconOptions& options = {},
                       std::vector<int64_t> targets_by_frequency = {});

  /// The kept translations of `source`, most probable first (ties: lower target id first); empty for a
  /// source unit the corpus did not hold.
  std::span<const LexicalEntry> translations(int64_t source) const;

  /// The target ids decoding `sources` (a batch's source ids) may produce under Marian's shortlist
  /// rule: the target vocabulary's `first` most frequent ids (the specials, then its most frequent
  /// units: the first of the ranking train() or load() was given, so not SentencePiece's byte pieces,
  /// which come first in its ids), each source unit's `best` most probable translations, and, with
  /// `shared_vocabulary`, the source ids themselves (names and numbers copied through). Ascending, each
  /// once. Throws mf::Error for first or best below 0.
  std::vector<int64_t> shortlist(std::span<const std::vector<int64_t>> sources, int64_t first, int64_t best,
                                 bool shared_vocabulary) const;

  /// Writes Marian's lex.s2t text: a line "target source probability" per kept translation, units as the
  /// codecs spell them, atomically. Throws mf::Error for a unit holding white space, or an id outside
  /// its codec.
  void save(const std::filesystem::path& path, const TextCodec& source, const TextCodec& target) const;
  /// Reads a file in save()'s format, looking each unit up in the codecs (the target codec's
  /// ids_by_frequency ranks the target vocabulary); errors name the file, the line and what is wrong (a
  /// unit neither codec holds, a malformed line or probability).
  static Lexicon load(const std::filesystem::path& path, const TextCodec& source, const TextCodec& target);

  /// Source units with at least one translation.
  int64_t sources() const;

  bool operator==(const Lexicon&) const = default;

 private:
  std::vector<std::vector<LexicalEntry>> translations_;  // by source id
  std::vector<int64_t> targets_by_frequency_;            // empty: id order
};

}  // namespace mf::text
