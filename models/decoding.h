// Decoding many source sentences with a Transformer, as translate, the training loop's validation and
// the benchmarks do: sentences sorted by length and batched under a token budget (so each batch pads
// little and its decoder steps are large GEMMs), greedy or beam search per batch, results put back in
// input order.
#pragma once

#include "models/generation.h"
#include "models/transformer.h"
#include "text/lexicon.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace mf::models {

/// decode_sources' token budgets for DecodingOptions::batch_tokens 0: kBatchTokens for beam search with
/// float32 weights, kSmallBatchTokens for greedy search and for int8 weights. The key/value caches are
/// read at every step, so they weigh more where the products are cheap (int8) and where a batch holds
/// many sources (greedy search over the full budget holds four times beam 4's source tokens, and their
/// cross-attention keys and values); float32 beam search lost at half the budget. Measured on Zen 3, 4
/// and 5 in BENCHMARKS.md.
inline constexpr int64_t kBatchTokens = 4096, kSmallBatchTokens = 2048;

/// The budget DecodingOptions::batch_tokens 0 stands for.
inline int64_t default_batch_tokens(bool int8_weights, int64_t beam_size) {
  return int8_weights || beam_size <= 1 ? kSmallBatchTokens : kBatchTokens;
}

struct DecodingOptions {
  /// 1: greedy search (generation::greedy_decode); more: beam search with this many beams.
  int64_t beam_size = 1;
  /// At most this many tokens are generated per sentence, <eos> included; each sentence is further
  /// held to output_budget of its own source.
  int64_t max_new_tokens = 1024;
  /// Beam search's length penalty alpha (generation::length_penalty); greedy search ignores it.
  double length_penalty = 0.6;
  /// Hypotheses returned per sentence, 1 <= nbest <= beam_size.
  int64_t nbest = 1;
  /// Source tokens per batch times beam_size, padding and <eos> included (sentences times the longest
  /// times the rows each sentence holds in the decoder): larger batches make every decoder step one
  /// larger GEMM per weight, at the cost of memory for the key/value caches. A sentence longer than
  /// that on its own gets a batch of its own. 0: default_batch_tokens() for the weights and beam_size.
  int64_t batch_tokens = 0;
  /// At most this many sentences per batch (0: no cap), as fairseq's --max-sentences: short sources
  /// would otherwise fill the token budget with hundreds of sentences, whose [sentences, vocabulary]
  /// logits and caches outgrow the caches of the CPU for no larger GEMM rate.
  int64_t batch_sentences = 256;
  /// Batches decoded at once on the CPU, each on one of the intra-op threads (mf::set_num_threads),
  /// which runs its ops alone (CTranslate2's inter_threads, Marian's --cpu-threads): 1 decodes one
  /// batch at a time with its ops split over the threads, the lowest latency for a single batch; 0
  /// takes one worker per thread. Never more workers than threads or batches; CUDA decodes one batch
  /// at a time. Several workers get the batches cut smaller (text::split_for_workers: at least two
  /// each, the last ones halved) so that they finish together; sampling keeps one worker's batches.
  int64_t workers = 1;
  /// Tokens never generated (generation::GreedyOptions::banned_ids).
  std::vector<int64_t> banned_ids;
  /// <eos> banned until a translation holds this many tokens (generation::GreedyOptions::min_new_tokens).
  int64_t min_new_tokens = 0;
  /// No n tokens in a row twice in a translation (generation::GreedyOptions::no_repeat_ngram_size); 0: off.
  int64_t no_repeat_ngram_size = 0;
  /// When beam search ends a sentence (generation::BeamStop).
  generation::BeamStop stop = generation::BeamStop::Exact;
  /// do_sample (with beam_size 1): every token drawn from the model's distribution (generation::
  /// GreedyOptions::sampling), as fairseq's --sampling back-translates. Each batch draws from a stream
  /// of its own (the generator's seed, or the default generator's, at counters reserved from it for
  /// the whole call), so the samples depend on the generator and the batching, not on the workers.
  generation::SamplingOptions sampling{.do_sample = false};
  /// Per source, the ids (no <sos>) its translations must begin with, or empty for none (CTranslate2's
  /// target_prefix): forced as generation::check_prefixes says, the hypotheses holding them. A
  /// sentence's budget (output_budget) grows to its prefix plus one token where the prefix is longer,
  /// within the model's max_len - 1 and max_new_tokens.
  std::vector<std::vector<int64_t>> target_prefixes;
  /// A lexical shortlist (Marian's --shortlist, CTranslate2's vocabulary map), or null for the whole
  /// vocabulary: each batch scores only the target ids text::Lexicon::shortlist gives its sources
  /// (shortlist_first, shortlist_best, and the sources' own ids where the model shares one embedding
  /// between the sides), <eos> and its target prefixes' ids; every other id gets probability 0. Faster
  /// (the output projection shrinks to those ids), and approximate: measure it on your data.
  const text::Lexicon* shortlist = nullptr;
  int64_t shortlist_first = 100;
  int64_t shortlist_best = 100;
};

/// Most tokens decoding generates for a source of `source_length` ids (<eos> included): 1.5 times that
/// plus 10, as fairseq's default max_len_a/b (a translation rarely runs longer, and a model that has not
/// learned to stop would otherwise run to max_len), within the model's max_len - 1. Each sentence has
/// its own, whatever it is batched with; translate and the training loop's validation share it.
int64_t output_budget(int64_t source_length, int64_t max_len);

/// The sources at `rows`, each truncated to max_len - 1 ids and ended with <eos>, padded with <pad>
/// (text::kPadId): [rows, longest + 1] int64 on `device`, as the encoder takes them.
Tensor pad_sources(const std::vector<std::vector<int64_t>>& sources, std::span<const int64_t> rows, int64_t max_len,
                   Device device);

/// Several models decoding and scoring as one, as fairseq's and Marian's ensembles do: each next
/// token's probability is the mean of the members' (fairseq's EnsembleModel), computed from their
/// log-probabilities in log space. The members must share the target vocabulary's size, the padding
/// id and the device (check_ensemble); their architectures may differ. Sources are cut to the shortest
/// member's max_len - 1.
using Ensemble = std::vector<Transformer*>;

/// Checks that `models` can decode as one (named `op` in errors): at least one, every member with the
/// first's target vocabulary size, padding id and device.
void check_ensemble(const char* op, const Ensemble& models);

/// The shortest max_len of a non-empty ensemble's members: decoding and scoring cut sources and targets
/// to fit every one.
int64_t shortest_max_len(const Ensemble& models);

/// Incremental decoding of an ensemble: one TransformerDecoder per member, stepped and reordered
/// together; step() returns the members' mean probabilities, of which the searches take the log of
/// only those they keep (a mean taken in log space cost the two-model ensemble a third of its time:
/// BENCHMARKS.md).
class EnsembleDecoder : public generation::IncrementalDecoder {
 public:
  /// Starts one row per source sentence (src [B, S] int64) in every member (check_ensemble), each
  /// scoring `output_ids` only where given (TransformerDecoder's).
  EnsembleDecoder(const Ensemble& models, const Tensor& src, const std::vector<int64_t>& output_ids = {});
  /// tokens [N] -> (p_1 + ... + p_M) / M for the next token [N, V] ([N, K] for K output_ids), p_m member
  /// m's probabilities.
  Tensor step(const Tensor& tokens) override;
  Scores scores() const override { return Scores::Probabilities; }
  const std::vector<int64_t>* scored_ids() const override { return members_.front()->scored_ids(); }
  void select_rows(const Tensor& index) override;

 private:
  std::vector<std::unique_ptr<TransformerDecoder>> members_;
};

/// Decodes every source (token ids without <eos>; longer than the model's max_len - 1 truncated) and
/// returns, in input order, each source's best min(nbest, found) hypotheses, best first. Greedy search
/// gives one hypothesis whose score is its log-probability. Runs with autograd off, on the model's
/// device; put the model in eval() mode first. Throws mf::Error for options out of range.
std::vector<std::vector<generation::Hypothesis>> decode_sources(Transformer& model,
                                                                const std::vector<std::vector<int64_t>>& sources,
                                                                const DecodingOptions& options);
/// decode_sources with an ensemble's mean probabilities (one member: that model alone).
std::vector<std::vector<generation::Hypothesis>> decode_sources(const Ensemble& models,
                                                                const std::vector<std::vector<int64_t>>& sources,
                                                                const DecodingOptions& options);

/// Forced decoding of a padded batch: log p(tgt_out[b, t] | src[b], tgt_in[b, 0..t]) for every
/// target position, [B, T] in the model's dtype on its device, 0 where tgt_out is <pad>. src [B, S],
/// tgt_in [B, T] (<sos> + target, shifted) and tgt_out [B, T] (target + <eos>) as Transformer::forward
/// and Transformer::loss take them; the rows' sums are what the loss without label smoothing averages.
Tensor target_log_probs(Transformer& model, const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out);

/// How much a model believes a given translation (Marian's scorer, fairseq's --score-reference,
/// CTranslate2's score_batch).
struct TargetScore {
  /// The log-probability of the target and then <eos> after the source: the sum of token_log_probs.
  double log_prob = 0;
  /// log p of each target id given the source and the ids before it, then that of <eos>.
  std::vector<double> token_log_probs;
};

struct ScoringOptions {
  /// Source plus target tokens per batch, padding, <sos> and <eos> included (pairs are sorted by that
  /// length first); a pair longer than that on its own gets a batch of its own.
  int64_t batch_tokens = kSmallBatchTokens;
  /// At most this many pairs per batch (0: no cap).
  int64_t batch_sentences = 256;
};

/// Scores each target (ids without <sos> or <eos>) as the translation of the source beside it (ids
/// without <eos>): target_log_probs over length-sorted batches, results in input order. Sources and
/// targets longer than the model's max_len - 1 are cut to their first max_len - 1 ids, as decoding cuts
/// sources; a pair's score does not depend on its batchmates beyond float rounding. Runs with autograd
/// off, on the model's device; put the model in eval() mode first. Throws mf::Error when the lists'
/// sizes differ, a target holds <pad> or the options are out of range.
std::vector<TargetScore> score_targets(Transformer& model, const std::vector<std::vector<int64_t>>& sources,
                                       const std::vector<std::vector<int64_t>>& targets,
                                       const ScoringOptions& options = {});
/// score_targets under an ensemble: each token's log-probability is the log of the members' mean
/// probability, as the ensemble's decoding gives it (targets cut to the shortest member's max_len - 1).
std::vector<TargetScore> score_targets(const Ensemble& models, const std::vector<std::vector<int64_t>>& sources,
                                       const std::vector<std::vector<int64_t>>& targets,
                                       const ScoringOptions& options = {});

/// Where the model looked in each source as it read the target beside it: decoder layer `layer`'s
/// cross-attention (1 to decoder_layers, -1 the last), mean over its heads, [target ids + <eos>, source
/// ids + <eos>] float64 on the CPU per pair, in input order, row t the weights with which the model read
/// the source as it predicted token t (each row sums to 1). Pairs are batched and cut as score_targets
/// does; Transformer::cross_attention runs, so the layers above `layer` and the output projection do
/// not. Throws mf::Error as score_targets does, and for a layer out of range.
std::vector<Tensor> target_cross_attention(Transformer& model, const std::vector<std::vector<int64_t>>& sources,
                                           const std::vector<std::vector<int64_t>>& targets, int64_t layer = -1,
                                           const ScoringOptions& options = {});

}  // namespace mf::models
