// The rules on what a search may output, shared by the translation searches (models/generation.h) and
// decoder-only generate() (models/sampling.h): tokens banned outright, and per hypothesis the tokens
// min_new_tokens and no_repeat_ngram_size rule out next. Internal to the models library: not installed.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <vector>

namespace mf::generation {

/// min_new_tokens and no_repeat_ngram_size (fairseq's --min-len and --no-repeat-ngram-size, CTranslate2's
/// min_decoding_length and no_repeat_ngram_size, Hugging Face's min_new_tokens and no_repeat_ngram_size),
/// checked once.
class OutputRules {
 public:
  /// `end_ids`: the tokens that end an output (EOS, or generate()'s stop tokens), banned while a
  /// hypothesis holds fewer than min_new_tokens. Throws mf::Error naming `op` for a negative
  /// min_new_tokens or no_repeat_ngram_size.
  OutputRules(const char* op, std::vector<int64_t> end_ids, int64_t min_new_tokens, int64_t no_repeat_ngram_size);

  /// Whether any rule is on: if not, no row has tokens ruled out.
  bool active() const { return min_new_tokens_ > 0 || n_ > 0; }

  /// The tokens a hypothesis holding `tokens` (its forced prefix included) may not take next: the end
  /// tokens while it holds fewer than min_new_tokens, and with no_repeat_ngram_size n > 0 each token
  /// that would complete an n-gram already in `preceding` followed by `tokens` (fairseq's
  /// NGramRepeatBlock; `preceding` is a decoder-only model's prompt, whose n-grams Hugging Face counts
  /// too, and empty for a translation).
  std::vector<int64_t> ruled_out_next(const std::vector<int64_t>& tokens,
                                      const std::vector<int64_t>& preceding = {}) const;

 private:
  std::vector<int64_t> end_ids_;
  int64_t min_new_tokens_, n_;
};

/// Sets the banned tokens' scores in `scores` [N, V] to -infinity: `banned` in every row, row_bans[row]
/// (empty: none) in its row. Every id must be in [0, V).
void rule_out(Tensor& scores, const std::vector<int64_t>& banned, const std::vector<std::vector<int64_t>>& row_bans);

/// Checks that every row has a token left to take: `banned` and its row_bans (empty: none) leave at least
/// one of the `vocab`. Throws mf::Error naming `op` otherwise.
void check_tokens_left(const char* op, int64_t vocab, const std::vector<int64_t>& banned,
                       const std::vector<std::vector<int64_t>>& row_bans);

}  // namespace mf::generation
