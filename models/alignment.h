// Word alignment from a translation model's cross-attention: which source words each target word was
// translated from, as Marian's --alignment and fairseq's --print-alignment report it. The attention
// over pieces (models::ScoringOptions::attention_layer) is gathered into words as the texts' spaces
// separate them (text::TextCodec::word_indices), so the indices refer to the words a reader sees.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <span>
#include <vector>

namespace mf::models {

/// A target word aligned to a source word, 0-based ("s-t" in the Pharaoh format Moses, fast_align and
/// Marian print).
struct AlignmentLink {
  int64_t source = 0, target = 0;
  bool operator==(const AlignmentLink&) const = default;
};

/// How strongly each target word attended to each source word.
struct WordAlignment {
  int64_t source_words = 0, target_words = 0;
  /// [target_words, source_words] row-major: a target word's row is the mean of its pieces' attention
  /// rows, a source word's weight the sum of its pieces' weights. What the rows gave to the source's
  /// <eos> is left out, so a row sums to at most 1.
  std::vector<double> weights;

  double weight(int64_t target, int64_t source) const {
    return weights[static_cast<size_t>(target * source_words + source)];
  }
  /// Each target word linked to the source word it weighs most (Marian's "hard"; the first of equals),
  /// by target word; nothing when the source has no words.
  std::vector<AlignmentLink> hard() const;
  /// Every pair weighing more than `threshold` (Marian's --alignment 0.x), by target word then source word.
  std::vector<AlignmentLink> above(double threshold) const;
};

/// Gathers `attention` [target pieces + <eos>, source pieces + <eos>] (TargetScore::attention) into
/// words: `source_words[j]` is the word of source piece j, `target_words[i]` that of target piece i
/// (text::TextCodec::word_indices; -1 for a piece of no word, which is left out). Pieces past the
/// attention's rows or columns (a pair cut to the model's max_len) are left out, and words with them.
WordAlignment word_alignment(const Tensor& attention, std::span<const int64_t> source_words,
                             std::span<const int64_t> target_words);

}  // namespace mf::models
