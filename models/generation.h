// Decoding for sequence-to-sequence models: greedy search and batched beam search over any model
// that implements IncrementalDecoder (one new token per row per call, with a per-row key/value cache).
//
// Everything lives in namespace mf::generation. The searches keep their bookkeeping (hypotheses,
// scores) on the host in float64; the model only ever sees [N] token tensors and row selections, and
// only the top few scores of each row are copied back from its device per step.
// N = rows the decoder holds now, V = vocabulary size, B = sentences (batch_size).
#pragma once

#include "core/tensor.h"
#include "models/sampling.h"
#include "text/special_tokens.h"

#include <cstdint>
#include <vector>

namespace mf::generation {

/// What a model implements to be decoded. An implementation starts holding one row per sentence
/// (batch_size rows, e.g. the encoder output of each source sentence) and an empty target prefix;
/// each step() extends every row's prefix by one token. Row order is whatever the last select_rows
/// made it; the searches keep track of which row belongs to which hypothesis.
class IncrementalDecoder {
 public:
  /// What step() returns.
  enum class Scores {
    LogProbs,  ///< the next token's log-probabilities
    Logits,    ///< logits, whose log_softmax along V gives those: the searches then normalise only the
               ///< tokens they rank first (log_softmax_topk), never writing [N, V] log-probabilities
    Probabilities,  ///< the probabilities themselves (an ensemble's mean): the searches rank them and take
                    ///< the log of those they keep only; a probability that underflowed to 0 ranks last
  };

  virtual ~IncrementalDecoder() = default;

  /// Feeds one new token per row (`tokens`: [N] int64 on the CPU, N = the rows held now; the first
  /// call feeds SOS) and returns the next token's scores (see scores()), [N, V] float32 or float64 on
  /// any device, extending each row's key/value cache by one position. The result is the search's to
  /// change (a banned token's column may be overwritten in place): return a tensor the decoder keeps no
  /// use for.
  virtual Tensor step(const Tensor& tokens) = 0;

  /// What step() returns: log-probabilities unless the decoder says otherwise.
  virtual Scores scores() const { return Scores::LogProbs; }

  /// The token ids step()'s columns stand for, ascending, where the decoder scores only part of the
  /// vocabulary (a shortlist): every other token has probability 0. Null (the default): column j is
  /// token j, the whole vocabulary.
  virtual const std::vector<int64_t>* scored_ids() const { return nullptr; }

  /// Keeps and reorders the cached rows: row i of the new cache is row index[i] of the old (`index`:
  /// [N'] int64 on the CPU, each in [0, N)). Rows may repeat (a beam forks) and may be left out (a
  /// finished sentence), so N' may be larger or smaller than N. Per-row state that never changes
  /// (encoder output, source mask) must follow the same selection.
  virtual void select_rows(const Tensor& index) = 0;
};

struct GreedyOptions {
  /// At most this many tokens are generated per sentence, EOS included; at least 1.
  int64_t max_new_tokens = 64;
  /// The special tokens' ids; the defaults are those of every text::Vocab.
  int64_t sos_id = text::kSosId;
  int64_t eos_id = text::kEosId;
  int64_t pad_id = text::kPadId;
  /// Tokens never generated: say <pad> and <sos>, which no output holds (fairseq bans <pad>), and <unk>
  /// for a subword model that spells every input (CTranslate2's disable_unk), so that an undertrained
  /// model cannot print them either.
  std::vector<int64_t> banned_ids;
  /// EOS is banned until a sentence holds this many tokens (its prefix included): fairseq's --min-len,
  /// CTranslate2's min_decoding_length, Hugging Face's min_new_tokens. 0: no minimum. A sentence whose
  /// limit comes first ends there without EOS.
  int64_t min_new_tokens = 0;
  /// n > 0: no output holds the same n tokens in a row twice (fairseq's, CTranslate2's and Hugging
  /// Face's no_repeat_ngram_size): a token that would complete an n-gram the sentence already holds is
  /// banned at that step. 0: off. As with banned_ids, the other tokens keep the model's log-probabilities;
  /// a row left with no token to take gets one at -infinity.
  int64_t no_repeat_ngram_size = 0;
  /// Per sentence, a tighter limit than max_new_tokens, or empty for none (see sentence_limits).
  std::vector<int64_t> sentence_max_new_tokens;
  /// Per sentence, the tokens its output must begin with, or empty for none (see check_prefixes).
  std::vector<std::vector<int64_t>> prefixes;
  /// do_sample: each token is drawn by sample_next (temperature, top-k, top-p) from the model's
  /// distribution, the banned tokens left out, instead of taken by argmax (fairseq's --sampling, used
  /// to back-translate); the log-probabilities summed stay the model's own. Off by default.
  SamplingOptions sampling{.do_sample = false};
};

struct GreedyResult {
  /// [B, L] int64: SOS, then the generated tokens, then PAD after EOS or the sentence's limit (the
  /// layout of PyTorch's usual greedy loop). L = 1 + the longest generation, at most 1 + max_new_tokens.
  Tensor tokens;
  /// Per sentence, the sum of the log-probabilities of its generated tokens (EOS included).
  std::vector<double> log_probs;
  /// Per sentence, how many tokens it generated (EOS included): where its PAD begins in `tokens`.
  std::vector<int64_t> lengths;
};

/// Argmax decoding of `batch_size` sentences together: every step feeds each unfinished sentence's
/// last token and appends the most probable next one (the lowest token id on a tie, as torch.argmax).
/// A sentence is finished after EOS or after its limit of tokens (sentence_limits); finished sentences
/// are dropped from the decoder with select_rows (only when a row finishes, so no copy otherwise), so
/// later steps cost only the live rows, and decoding stops as soon as every sentence is finished. Runs
/// with autograd off. On return the decoder's cache is in no particular state. Throws mf::Error for
/// batch_size or max_new_tokens below 1, a negative min_new_tokens or no_repeat_ngram_size, a negative
/// special token or one outside the vocabulary, a sentence left with no token to take (banned_ids and
/// the rules ruling out all), and a decoder whose step returns the wrong shape or NaN.
GreedyResult greedy_decode(IncrementalDecoder& decoder, int64_t batch_size, const GreedyOptions& options = {});

/// When beam search ends a sentence, besides running out of live hypotheses or of max_new_tokens.
enum class BeamStop : uint8_t {
  /// Once no live hypothesis could still enter the beam_size best (the bound in beam_search's doc
  /// comment): the search's exact result, at the cost of steps that rarely change it (with a length
  /// penalty above 0, a live hypothesis can long stay within reach).
  Exact,
  /// Once beam_size hypotheses have finished: fairseq's rule (Hugging Face's early_stopping=True).
  /// Faster, but improbable hypotheses that ended early count too, so with a small vocabulary the
  /// search can stop before the best one has finished.
  BeamFinished,
};

struct BeamOptions {
  /// Live hypotheses per sentence, and how many finished ones decide that a sentence is done; >= 1.
  int64_t beam_size = 4;
  /// At most this many tokens are generated per hypothesis, EOS included; at least 1.
  int64_t max_new_tokens = 64;
  /// alpha of the length penalty (see length_penalty): 0 ranks by the plain sum of log-probabilities;
  /// larger values favour longer hypotheses. 0.6 is the GNMT / Marian choice.
  double length_penalty = 0.6;
  /// Hypotheses returned per sentence, 1 <= nbest <= beam_size.
  int64_t nbest = 1;
  /// The special tokens' ids; the defaults are those of every text::Vocab. eos_id -1: none, every
  /// hypothesis runs to its limit (a language model asked for a fixed number of tokens).
  int64_t sos_id = text::kSosId;
  int64_t eos_id = text::kEosId;
  /// Tokens never generated (GreedyOptions::banned_ids).
  std::vector<int64_t> banned_ids;
  /// EOS banned until a hypothesis holds this many tokens (GreedyOptions::min_new_tokens).
  int64_t min_new_tokens = 0;
  /// No n-gram twice in a hypothesis (GreedyOptions::no_repeat_ngram_size); 0: off.
  int64_t no_repeat_ngram_size = 0;
  /// Per sentence, tokens that no_repeat_ngram_size counts as coming before its output, or empty for
  /// none: a decoder-only model's prompt, whose n-grams Hugging Face's generate() counts too.
  std::vector<std::vector<int64_t>> preceding_tokens;
  BeamStop stop = BeamStop::Exact;
  /// Per sentence, a tighter limit than max_new_tokens, or empty for none (see sentence_limits).
  std::vector<int64_t> sentence_max_new_tokens;
  /// Per sentence, the tokens its hypotheses must begin with, or empty for none (see check_prefixes).
  std::vector<std::vector<int64_t>> prefixes;
};

/// One finished hypothesis of beam search.
struct Hypothesis {
  /// The generated tokens, SOS left out; the last is EOS unless max_new_tokens ran out first.
  std::vector<int64_t> tokens;
  /// Sum of the log-probabilities of `tokens`.
  double log_prob = 0;
  /// What hypotheses are ranked by: log_prob / length_penalty(tokens.size(), alpha).
  double score = 0;
};

/// The most tokens each of `batch_size` sentences may take: max_new_tokens, or min(max_new_tokens,
/// sentence_max_new_tokens[s]) where that list is given. Batched decoding (models::decode_sources)
/// gives each sentence the budget of its own source this way, so that a translation does not depend on
/// the sentences batched with it. Throws mf::Error (naming `op`) for a list that is not one entry per
/// sentence or holds a limit below 1.
std::vector<int64_t> sentence_limits(const char* op, int64_t batch_size, int64_t max_new_tokens,
                                     const std::vector<int64_t>& sentence_max_new_tokens);

/// Checks the forced prefixes both searches take (CTranslate2's target_prefix, for interactive translation
/// and for completing a given start): none, or one list per sentence, each empty or of tokens that are
/// not `eos_id` and shorter than the sentence's limit (`limits`, from sentence_limits), which counts them.
/// A sentence's first tokens are its prefix, fed to the decoder one step each and never searched (beam
/// search keeps one hypothesis until the prefix ends); the hypotheses returned hold the prefix, and
/// their log_prob counts its tokens' log-probabilities too, so that scoring the whole output (forced
/// decoding) gives it back. Throws mf::Error naming `op` and the sentence.
void check_prefixes(const char* op, const std::vector<std::vector<int64_t>>& prefixes, const std::vector<int64_t>& limits,
                    int64_t eos_id);

/// GNMT's length penalty (Wu et al. 2016, eq. 14): ((5 + length) / 6)^alpha, with length the number of
/// generated tokens, EOS included. It is 1 for length 1 whatever alpha, so one-token hypotheses keep
/// their plain log-probability.
double length_penalty(int64_t length, double alpha);

/// Batched beam search: the live hypotheses of all sentences are the rows of one step() call (up to
/// batch_size * beam_size rows). The first step runs on the decoder's batch_size rows and select_rows
/// then forks each sentence into its beams.
///
/// Each step, for every sentence, the candidates (each live hypothesis extended by each token) are
/// ranked by their summed log-probability (ties: earlier hypothesis, then lower token id). Walking
/// them best first, a candidate ending in EOS becomes a finished hypothesis when it ranks among the
/// first beam_size (fairseq's rule: an EOS further down would not have survived the beam anyway),
/// and the first beam_size candidates not ending in EOS become the next live hypotheses. A row holds
/// one EOS, so only its beam_size + 1 best tokens can be among those; only they leave the device.
///
/// Stopping: with BeamStop::Exact (the default) a sentence is done when it has at least beam_size
/// finished hypotheses and the beam_size-th best of their scores is at least the best score any live
/// hypothesis could still reach. Log-probabilities are <= 0, so a live hypothesis with sum S and
/// length t can at best end with sum S at some length L in (t, max], max the sentence's limit
/// (sentence_limits), i.e. at best max(S / lp(t + 1), S / lp(max)) (S / lp(L) is monotonic in L);
/// continuing could therefore not change the sentence's beam_size best, unlike the common heuristic
/// S / lp(t) that stops too soon when alpha > 0. With BeamStop::BeamFinished it is done once it has
/// beam_size finished hypotheses. Either way a sentence is also done when it has no live hypotheses
/// left; at its limit the live hypotheses are finished as they stand, without EOS. A done sentence's
/// rows are dropped with select_rows, and the search ends when all are done. A sentence's hypotheses
/// sit in consecutive rows, each in its parent's row where it can, so that select_rows leaves most
/// rows where they are.
///
/// Returns per sentence its best min(nbest, number found) finished hypotheses, best score first (ties
/// keep the order they were found in). With length_penalty 0 and beam_size 1 the result is exactly
/// greedy_decode's (tokens and log-probabilities). Runs with autograd off; on return the decoder's
/// cache is in no particular state. Throws mf::Error for beam_size, nbest, batch_size or
/// max_new_tokens out of range, a non-finite length_penalty, a negative min_new_tokens or
/// no_repeat_ngram_size, preceding_tokens not one list per sentence, a negative special token or one
/// outside the vocabulary, a hypothesis left with no token to take, and a decoder whose step returns the
/// wrong shape or NaN.
std::vector<std::vector<Hypothesis>> beam_search(IncrementalDecoder& decoder, int64_t batch_size,
                                                 const BeamOptions& options = {});

}  // namespace mf::generation
