#include "models/alignment.h"

#include "core/error.h"

#include <algorithm>

namespace mf::models {
namespace {

/// The words wholly among the first `kept` of `words` (word indices by piece, rising; -1 for none): a
/// word whose pieces run past `kept` (cut by the model's length limit) is not counted.
int64_t whole_words(std::span<const int64_t> words, int64_t kept) {
  int64_t count = 0;
  for (int64_t i = 0; i < kept; ++i) count = std::max(count, words[static_cast<size_t>(i)] + 1);
  const bool last_cut = kept < static_cast<int64_t>(words.size()) && count > 0 &&
                        words[static_cast<size_t>(kept)] == count - 1;
  return last_cut ? count - 1 : count;
}

}  // namespace

std::vector<AlignmentLink> WordAlignment::hard() const {
  std::vector<AlignmentLink> links;
  if (source_words == 0) return links;
  for (int64_t t = 0; t < target_words; ++t) {
    const auto row = weights.begin() + t * source_words;
    links.push_back({.source = std::max_element(row, row + source_words) - row, .target = t});
  }
  return links;
}

std::vector<AlignmentLink> WordAlignment::above(double threshold) const {
  std::vector<AlignmentLink> links;
  for (int64_t t = 0; t < target_words; ++t)
    for (int64_t s = 0; s < source_words; ++s)
      if (weight(t, s) > threshold) links.push_back({.source = s, .target = t});
  return links;
}

WordAlignment word_alignment(const Tensor& attention, std::span<const int64_t> source_words,
                             std::span<const int64_t> target_words) {
  MF_CHECK(attention.dim() == 2 && attention.size(0) >= 1 && attention.size(1) >= 1,
           "word_alignment: attention must be [target pieces + <eos>, source pieces + <eos>], got {}",
           shape_str(attention.shape()));
  const int64_t rows = attention.size(0) - 1, columns = attention.size(1) - 1;  // <eos> left out
  MF_CHECK(static_cast<int64_t>(target_words.size()) >= rows && static_cast<int64_t>(source_words.size()) >= columns,
           "word_alignment: attention {} covers more pieces than the {} target and {} source word indices given",
           shape_str(attention.shape()), target_words.size(), source_words.size());
  WordAlignment out{.source_words = whole_words(source_words, columns),
                    .target_words = whole_words(target_words, rows)};
  out.weights.assign(static_cast<size_t>(out.target_words * out.source_words), 0.0);
  std::vector<int64_t> pieces_per_word(static_cast<size_t>(out.target_words), 0);
  const std::vector<double> values = attention.to(Device::cpu()).to(DType::Float64).contiguous().to_vector<double>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = target_words[static_cast<size_t>(i)];
    if (t < 0 || t >= out.target_words) continue;
    ++pieces_per_word[static_cast<size_t>(t)];
    for (int64_t j = 0; j < columns; ++j) {
      const int64_t s = source_words[static_cast<size_t>(j)];
      if (s >= 0 && s < out.source_words)
        out.weights[static_cast<size_t>(t * out.source_words + s)] +=
            values[static_cast<size_t>(i * (columns + 1) + j)];
    }
  }
  for (int64_t t = 0; t < out.target_words; ++t) {
    const auto pieces = static_cast<double>(std::max<int64_t>(pieces_per_word[static_cast<size_t>(t)], 1));
    for (int64_t s = 0; s < out.source_words; ++s) out.weights[static_cast<size_t>(t * out.source_words + s)] /= pieces;
  }
  return out;
}

}  // namespace mf::models
