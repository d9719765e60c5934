// Decoder-only generation (GPT-style): a prompt extended token by token, greedy, sampled with
// temperature, top-k and top-p, or by beam search, batched, seeded, with stop tokens, and with a
// key/value cache (nn::KVCache) so that each step feeds only the newest token. Hugging Face's
// generate() is the model for its options.
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace mf::generation {

/// How the next token is chosen from a row's logits.
struct SamplingOptions {
  /// Draw the token from the distribution; false takes the most probable one (greedy; the lowest id
  /// on a tie), and the options below do not apply.
  bool do_sample = true;
  /// Logits are divided by it before anything else; > 0. Below 1 sharpens the distribution.
  double temperature = 1.0;
  /// Keep only the k most probable tokens (ties at the k-th value stay in); 0 keeps all.
  int64_t top_k = 0;
  /// Keep the most probable tokens whose probabilities, added from the largest, first reach top_p
  /// (nucleus sampling; the most probable token always stays); in (0, 1], 1 keeps all.
  double top_p = 1.0;
  /// The random stream (the default generator when null).
  Generator* generator = nullptr;
};

/// The next token of each row of `logits` ([B, V], any float dtype and device): [B] int64 on the
/// logits' device. Runs with autograd off. Throws mf::Error for options out of range or logits that
/// are not [B, V] floats.
Tensor sample_next(const Tensor& logits, const SamplingOptions& options = {});

struct GenerateOptions {
  /// At most this many tokens are added to each row; >= 0.
  int64_t max_new_tokens = 64;
  /// How each token is chosen.
  SamplingOptions sampling;
  /// Beam search over this many hypotheses per row (Hugging Face's num_beams), through
  /// generation::beam_search: each row's result is its best hypothesis, ranked by summed
  /// log-probability over the length penalty. 1 chooses each token as `sampling` says; above 1 needs
  /// sampling.do_sample = false and at most one stop token (the hypotheses' EOS; without one every
  /// hypothesis runs max_new_tokens).
  int64_t num_beams = 1;
  /// Beam search's length penalty alpha (generation::length_penalty, GNMT's; 0 ranks by the plain sum).
  double length_penalty = 0.6;
  /// Sequences per prompt row (Hugging Face's num_return_sequences), consecutive in the result: with
  /// sampling, independent draws (the row repeated); with beam search, its best hypotheses, best first
  /// (at most num_beams). Greedy search, which has one answer, takes 1 only.
  int64_t num_return_sequences = 1;
  /// A row ends at the first of these it generates; later positions of an ended row repeat that token.
  /// Generation stops once every row has ended.
  std::vector<int64_t> stop_tokens = {};
  /// Tokens never generated (Hugging Face's suppress_tokens), each in the model's vocabulary.
  std::vector<int64_t> banned_ids = {};
  /// Hugging Face's repetition_penalty (CTRL's, Keskar et al. 2019): the score of each token the row
  /// already holds, its prompt included, is divided by it where positive and multiplied by it where
  /// negative: the logits in greedy search and sampling (before temperature), the log-probabilities in
  /// beam search. Above 1 discourages repeats; 1: off; must be positive and finite.
  double repetition_penalty = 1.0;
  /// The stop tokens are banned until a row holds this many new tokens (Hugging Face's min_new_tokens);
  /// 0: no minimum.
  int64_t min_new_tokens = 0;
  /// n > 0: no row holds the same n tokens in a row twice, its prompt included (Hugging Face's
  /// no_repeat_ngram_size): a token that would complete an n-gram the row already holds is banned at that
  /// step. 0: off. Banned tokens leave the others' logits (and, in beam search, log-probabilities) as the
  /// model gives them; a row left with no token to take is an error.
  int64_t no_repeat_ngram_size = 0;
  /// Keep each attention layer's keys and values between steps (nn::KVCache), feeding only the newest
  /// token. Off, every step feeds the whole sequence (the last context_length tokens of it): the cost
  /// the cache saves.
  bool use_cache = true;
  /// The most positions the model takes (its position table); 0 for no limit. With the cache the
  /// prompt plus max_new_tokens must fit; without it, longer sequences feed their last context_length
  /// tokens.
  int64_t context_length = 0;
};

/// A decoder-only model: tokens [B, T] int64 -> logits [B, T, V]. With a cache in use it is fed only
/// the new positions, and numbers them from nn::cache_position().
using LanguageModel = std::function<Tensor(const Tensor& tokens)>;

/// Extends every row of `prompt` ([B, T] int64, T >= 1, rows of equal length) by up to max_new_tokens
/// tokens chosen by sample_next from the model's logits at the last position, or by beam search
/// (num_beams): [B * num_return_sequences, T + n] int64 on the prompt's device, n <= max_new_tokens, a
/// row that ended early repeating its stop token. The same generator state gives the same tokens, with or without the
/// cache, on any thread count. Runs with autograd off. Throws mf::Error for bad options, a bad
/// prompt, a model whose logits are not [B, fed, V], or a row the rules leave no token to take.
Tensor generate(const LanguageModel& model, const Tensor& prompt, const GenerateOptions& options = {});

/// Prompts of any lengths (each at least one token): rows of equal length are generated together, one
/// generate() call per length, shortest first, and each result is its prompt followed by its new
/// tokens up to and including its stop token (no repeats). Results come back in the prompts' order,
/// num_return_sequences per prompt.
std::vector<std::vector<int64_t>> generate(const LanguageModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options = {}, Device device = Device::cpu());

}  // namespace mf::generation
