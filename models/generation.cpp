// Greedy and beam search over an IncrementalDecoder. The search state lives on the host: per step
// the decoder gets [N] tokens and gives [N, V] log-probabilities or logits, of which only each row's
// top k (k = 1 greedy, beam_size + 1 beam) or drawn token, as log-probabilities, is copied back.
#include "models/generation.h"

#include "core/graph.h"
#include "models/output_rules.h"
#include "ops/functional.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace mf::generation {

namespace {

/// A row's k most probable next tokens, row-major: values/ids [rows * k], best first; and where a row's
/// next token is forced (a prefix), that token's log-probability (forced[row]; empty when none is).
struct TopTokens {
  int64_t k = 0;
  std::vector<double> values;
  std::vector<int64_t> ids;
  std::vector<double> forced;
};

/// Token ids and the columns of a decoder's scores (IncrementalDecoder::scored_ids): the searches
/// rank columns and hand out tokens.
class Columns {
 public:
  explicit Columns(const IncrementalDecoder& decoder) : scored_(decoder.scored_ids()) {}
  bool whole_vocabulary() const { return scored_ == nullptr; }
  /// The column of `token`, or -1 where the decoder does not score it.
  int64_t of_token(int64_t token) const {
    if (!scored_) return token;
    const auto it = std::lower_bound(scored_->begin(), scored_->end(), token);
    return it != scored_->end() && *it == token ? it - scored_->begin() : -1;
  }
  /// The columns of `tokens` that are scored: the others can never be taken, so need no ban.
  std::vector<int64_t> of_tokens(const std::vector<int64_t>& tokens) const {
    if (!scored_) return tokens;
    std::vector<int64_t> columns;
    for (int64_t token : tokens)
      if (int64_t column = of_token(token); column >= 0) columns.push_back(column);
    return columns;
  }
  std::vector<std::vector<int64_t>> of_tokens(const std::vector<std::vector<int64_t>>& lists) const {
    std::vector<std::vector<int64_t>> out;
    for (const std::vector<int64_t>& tokens : lists) out.push_back(of_tokens(tokens));
    return out;
  }
  /// The column of each forced token (-1, none, stays); a forced token the decoder does not score is an
  /// error.
  std::vector<int64_t> of_forced(const char* op, const std::vector<int64_t>& forced) const {
    if (!scored_) return forced;
    std::vector<int64_t> columns;
    for (int64_t token : forced) {
      columns.push_back(token < 0 ? -1 : of_token(token));
      MF_CHECK(token < 0 || columns.back() >= 0, "{}: prefix token id {} is not one of the {} ids the decoder scores",
               op, token, scored_->size());
    }
    return columns;
  }
  /// The token of each column in `ids`, in place (-1, no token, stays).
  void to_tokens(std::vector<int64_t>& ids) const {
    if (scored_)
      for (int64_t& id : ids)
        if (id >= 0) id = (*scored_)[static_cast<size_t>(id)];
  }

 private:
  const std::vector<int64_t>* scored_;
};

const std::vector<int64_t> kNone;

/// How many banned tokens step_top first makes room for among a row's best (see there).
constexpr int64_t kBansRankedFirst = 4;

/// Checks what the settings of both searches share.
void check_common(const char* op, int64_t batch_size, int64_t max_new_tokens, const std::vector<int64_t>& specials) {
  MF_CHECK(batch_size >= 1, "{}: batch_size must be at least 1, got {}", op, batch_size);
  MF_CHECK(max_new_tokens >= 1, "{}: max_new_tokens must be at least 1, got {}", op, max_new_tokens);
  for (int64_t token : specials) MF_CHECK(token >= 0, "{}: special token ids must be >= 0, got {}", op, token);
}

/// A 1-D int64 CPU tensor: the tokens and row indices the decoder is given.
Tensor int64_vector(const std::vector<int64_t>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())});
}

/// Runs one decoder step on `tokens` and checks its result: [rows, V], V the same every step and
/// larger than every special token and every `banned` one.
Tensor checked_step(const char* op, IncrementalDecoder& decoder, const std::vector<int64_t>& tokens, int64_t& vocab,
                    const std::vector<int64_t>& specials, const std::vector<int64_t>& banned) {
  const auto rows = static_cast<int64_t>(tokens.size());
  Tensor scores = decoder.step(int64_vector(tokens));  // [N, V]
  MF_CHECK(scores.defined() && scores.dim() == 2 && scores.size(0) == rows && is_floating(scores.dtype()),
           "{}: decoder.step was fed {} tokens and must return float scores [{}, V], got {}", op, rows, rows,
           scores.defined() ? fmt::format("{} {}", dtype_name(scores.dtype()), shape_str(scores.shape()))
                            : std::string("an undefined tensor"));
  if (vocab < 0) {
    vocab = scores.size(1);
    for (int64_t token : specials)
      MF_CHECK(token < vocab, "{}: special token id {} is outside the decoder's vocabulary of {} tokens", op, token,
               vocab);
  }
  MF_CHECK(scores.size(1) == vocab, "{}: decoder.step returned {} scores per row, but {} on the first step", op,
           scores.size(1), vocab);
  for (int64_t token : banned)
    MF_CHECK(token >= 0 && token < vocab, "{}: banned token id {} is outside the decoder's vocabulary of {} tokens", op,
             token, vocab);
  return scores;
}

/// The log-probabilities of a step's `scores`, [N, V] (a new tensor the caller may change).
Tensor full_log_probs(const Tensor& scores, IncrementalDecoder::Scores kind) {
  switch (kind) {
    case IncrementalDecoder::Scores::Logits: return scores.log_softmax(1);
    case IncrementalDecoder::Scores::Probabilities: return log(scores);
    case IncrementalDecoder::Scores::LogProbs: break;
  }
  return scores.clone();
}

/// The log-probability of forced[row] in each row of a step's `scores` (of `kind`) where forced[row] >=
/// 0, 0 in the other rows; empty when no row is forced.
std::vector<double> forced_log_probs(const char* op, const Tensor& scores, IncrementalDecoder::Scores kind,
                                     const std::vector<int64_t>& forced) {
  if (std::all_of(forced.begin(), forced.end(), [](int64_t token) { return token < 0; })) return {};
  const int64_t vocab = scores.size(1);
  std::vector<int64_t> ids;
  for (int64_t token : forced) {
    MF_CHECK(token < vocab, "{}: prefix token id {} is outside the decoder's vocabulary of {} tokens", op, token, vocab);
    ids.push_back(std::max<int64_t>(token, 0));
  }
  const bool probabilities = kind == IncrementalDecoder::Scores::Probabilities;
  const Tensor log_probs = kind == IncrementalDecoder::Scores::Logits ? scores.log_softmax(1) : scores;
  const Tensor index = from_vector(ids, {static_cast<int64_t>(ids.size()), 1}).to(scores.device());
  std::vector<double> values = gather(log_probs, 1, index).to(Device::cpu()).to_vector<double>();
  for (size_t row = 0; row < forced.size(); ++row) {
    if (forced[row] < 0) values[row] = 0;
    else if (probabilities) values[row] = std::log(values[row]);
    MF_CHECK(!std::isnan(values[row]), "{}: decoder.step returned NaN scores", op);
  }
  return values;
}

/// Whether `token` is banned in `row`: one of `banned` (every row's) or of row_bans[row] (empty: none).
bool is_banned(int64_t token, size_t row, const std::vector<int64_t>& banned,
               const std::vector<std::vector<int64_t>>& row_bans) {
  auto holds = [token](const std::vector<int64_t>& list) {
    return std::find(list.begin(), list.end(), token) != list.end();
  };
  return holds(banned) || (!row_bans.empty() && holds(row_bans[row]));
}

/// One decoder step (checked_step) and each row's k best tokens (ties go to the lower id, as topk and
/// torch.argmax do), never one of `banned` nor of the row's row_bans (empty: none), no NaN among them;
/// and the forced tokens' log-probabilities (forced_log_probs). Throws mf::Error where a row has no
/// token left (check_tokens_left); a row with fewer than k left fills its list with id -1 at -infinity.
TopTokens step_top(const char* op, IncrementalDecoder& decoder, const std::vector<int64_t>& tokens, int64_t k,
                   int64_t& vocab, const std::vector<int64_t>& specials, const std::vector<int64_t>& banned_tokens,
                   const std::vector<std::vector<int64_t>>& row_ban_tokens, const std::vector<int64_t>& forced_tokens) {
  const auto rows = static_cast<int64_t>(tokens.size());
  // Ranked by column, handed out as tokens.
  const Columns columns(decoder);
  const std::vector<int64_t> banned = columns.of_tokens(banned_tokens);
  const std::vector<std::vector<int64_t>> row_bans = columns.of_tokens(row_ban_tokens);
  const std::vector<int64_t> forced = columns.of_forced(op, forced_tokens);
  Tensor scores = checked_step(op, decoder, tokens, vocab, columns.whole_vocabulary() ? specials : kNone, banned);
  IncrementalDecoder::Scores kind = decoder.scores();
  TopTokens top{.k = std::min(k, vocab), .forced = forced_log_probs(op, scores, kind, forced)};
  // Banned tokens are ranked with the rest (as many more per row as the row with the most bans has)
  // and then passed over, so that the others keep the log-probabilities the model gives them; only
  // where too few tokens are left to rank are they ranked last instead. Room for a few bans is
  // ranked first, and for all of them only where a row finds fewer than k tokens it may take: a
  // trained model rarely ranks a banned token high, and ranking dozens more (a subword model's
  // control bytes) slows beam 4 by a tenth.
  size_t most_row_bans = 0;
  for (const std::vector<int64_t>& bans : row_bans) most_row_bans = std::max(most_row_bans, bans.size());
  const auto bans = static_cast<int64_t>(banned.size() + most_row_bans);
  const bool pass_over = bans > 0 && top.k + bans <= vocab;
  if (bans > 0 && !pass_over) {
    check_tokens_left(op, vocab, banned, row_bans);
    scores = full_log_probs(scores, kind);
    kind = IncrementalDecoder::Scores::LogProbs;
    rule_out(scores, banned, row_bans);
  }
  std::vector<double> ranked_values;
  std::vector<int64_t> ranked_ids;
  auto rank = [&](int64_t ranked) {
    auto [values, ids] = kind == IncrementalDecoder::Scores::Logits ? log_softmax_topk(scores, ranked, 1)
                                                                    : topk(scores, ranked, 1);  // [N, ranked] each
    ranked_values = values.to_vector<double>();
    if (kind == IncrementalDecoder::Scores::Probabilities)
      for (double& value : ranked_values) value = std::log(value);
    ranked_ids = ids.to_vector<int64_t>();
  };
  // Each row's k best it may take, as far as `ranked` reaches; false where a row runs out (only while
  // room for fewer than all the bans was ranked).
  auto take_best = [&](int64_t ranked) {
    top.values.clear();
    top.ids.clear();
    for (size_t row = 0; row < static_cast<size_t>(rows); ++row) {
      const size_t end = (row + 1) * static_cast<size_t>(ranked);
      int64_t kept = 0;
      for (size_t at = row * static_cast<size_t>(ranked); kept < top.k; ++at) {
        if (at == end) return false;
        const bool ruled_out = bans > 0 && is_banned(ranked_ids[at], row, banned, row_bans);
        if (pass_over && ruled_out) continue;
        top.values.push_back(ruled_out ? -std::numeric_limits<double>::infinity() : ranked_values[at]);
        top.ids.push_back(ruled_out ? -1 : ranked_ids[at]);
        ++kept;
      }
    }
    return true;
  };
  const int64_t ranked_first = top.k + (pass_over ? std::min(bans, kBansRankedFirst) : 0);
  rank(ranked_first);
  if (!take_best(ranked_first)) {
    rank(top.k + bans);
    take_best(top.k + bans);
  }
  for (double v : top.values) MF_CHECK(!std::isnan(v), "{}: decoder.step returned NaN scores", op);
  columns.to_tokens(top.ids);
  return top;
}

/// One decoder step (checked_step) and a token per row drawn by sample_next from the model's
/// distribution without the `banned` tokens and the row's row_bans (empty: none), with its
/// log-probability under the model (before temperature, top-k or top-p); and the forced tokens'
/// log-probabilities (forced_log_probs).
TopTokens step_sample(const char* op, IncrementalDecoder& decoder, const std::vector<int64_t>& tokens, int64_t& vocab,
                      const std::vector<int64_t>& specials, const std::vector<int64_t>& banned_tokens,
                      const std::vector<std::vector<int64_t>>& row_ban_tokens, const SamplingOptions& sampling,
                      const std::vector<int64_t>& forced_tokens) {
  const Columns columns(decoder);  // drawn by column, handed out as tokens
  const std::vector<int64_t> banned = columns.of_tokens(banned_tokens);
  const std::vector<std::vector<int64_t>> row_bans = columns.of_tokens(row_ban_tokens);
  const std::vector<int64_t> forced = columns.of_forced(op, forced_tokens);
  Tensor scores = checked_step(op, decoder, tokens, vocab, columns.whole_vocabulary() ? specials : kNone, banned);
  Tensor log_probs = full_log_probs(scores, decoder.scores());
  std::vector<double> forced_values = forced_log_probs(op, log_probs, IncrementalDecoder::Scores::LogProbs, forced);
  check_tokens_left(op, vocab, banned, row_bans);
  rule_out(log_probs, banned, row_bans);
  const Tensor ids = sample_next(log_probs, sampling);  // [N]
  TopTokens top{.k = 1,
                .values = gather(log_probs, 1, ids.unsqueeze(1)).to(Device::cpu()).to_vector<double>(),
                .ids = ids.to(Device::cpu()).to_vector<int64_t>(),
                .forced = std::move(forced_values)};
  for (double v : top.values) MF_CHECK(!std::isnan(v), "{}: decoder.step returned NaN scores", op);
  columns.to_tokens(top.ids);
  return top;
}

/// The token sentence `s` must take next, having generated `length` tokens: the next of its prefix, or -1.
int64_t forced_token(const std::vector<std::vector<int64_t>>& prefixes, int64_t s, size_t length) {
  if (prefixes.empty()) return -1;
  const std::vector<int64_t>& prefix = prefixes[static_cast<size_t>(s)];
  return length < prefix.size() ? prefix[length] : -1;
}

/// Applies `index` to the decoder's rows unless it keeps every row in place.
void select_if_changed(IncrementalDecoder& decoder, const std::vector<int64_t>& index, size_t rows) {
  bool identity = index.size() == rows;
  for (size_t i = 0; identity && i < index.size(); ++i) identity = index[i] == static_cast<int64_t>(i);
  if (!identity) decoder.select_rows(int64_vector(index));
}

/// A hypothesis still being extended.
struct Live {
  int64_t sentence;
  std::vector<int64_t> tokens;
  double log_prob;
};

/// One way to extend live[hypothesis], ranked by log_prob.
struct Candidate {
  double log_prob;
  int64_t hypothesis;
  int64_t token;
};

/// A finished hypothesis, scored with the length penalty.
Hypothesis finish(std::vector<int64_t> tokens, double log_prob, double alpha) {
  double score = log_prob / length_penalty(static_cast<int64_t>(tokens.size()), alpha);
  return {.tokens = std::move(tokens), .log_prob = log_prob, .score = score};
}

/// The decoder row of each hypothesis in `next` (grouped by sentence), given its parent's row. A
/// sentence's hypotheses take the rows its group spans in `next`: each the row its parent held, where
/// that row is among them and no better hypothesis took it, so that reordering the decoder's caches
/// leaves that row where it is; the others the rows left over, in order. Which row a hypothesis sits
/// in changes nothing it computes: rows are independent.
std::vector<int64_t> rows_at_parents(const std::vector<Live>& next, const std::vector<int64_t>& parent_rows) {
  std::vector<int64_t> rows(next.size(), -1);
  std::vector<bool> taken(next.size(), false);
  for (size_t first = 0, end = 0; first < next.size(); first = end) {
    while (end < next.size() && next[end].sentence == next[first].sentence) ++end;
    for (size_t i = first; i < end; ++i) {
      const auto parent = static_cast<size_t>(parent_rows[i]);
      if (parent >= first && parent < end && !taken[parent]) {
        rows[i] = parent_rows[i];
        taken[parent] = true;
      }
    }
    size_t free_row = first;
    for (size_t i = first; i < end; ++i) {
      if (rows[i] >= 0) continue;
      while (taken[free_row]) ++free_row;
      rows[i] = static_cast<int64_t>(free_row);
      taken[free_row] = true;
    }
  }
  return rows;
}

/// The early-stopping rule of beam_search's doc comment, for one sentence whose live hypotheses
/// (length `length`) are live[begin, end) and whose limit is `limit` tokens.
bool sentence_done(const std::vector<Hypothesis>& finished, const std::vector<Live>& live, size_t begin, size_t end,
                   int64_t length, int64_t limit, const BeamOptions& options) {
  auto beam = static_cast<size_t>(options.beam_size);
  if (finished.size() < beam) return false;
  if (options.stop == BeamStop::BeamFinished) return true;
  std::vector<double> scores(finished.size());
  std::transform(finished.begin(), finished.end(), scores.begin(), [](const Hypothesis& h) { return h.score; });
  std::nth_element(scores.begin(), scores.begin() + static_cast<std::ptrdiff_t>(beam - 1), scores.end(),
                   std::greater<>());
  double kth_best = scores[beam - 1];
  double lp_next = length_penalty(length + 1, options.length_penalty);
  double lp_max = length_penalty(limit, options.length_penalty);
  for (size_t i = begin; i < end; ++i) {
    double bound = std::max(live[i].log_prob / lp_next, live[i].log_prob / lp_max);
    if (bound > kth_best) return false;
  }
  return true;
}

}  // namespace

std::vector<int64_t> sentence_limits(const char* op, int64_t batch_size, int64_t max_new_tokens,
                                     const std::vector<int64_t>& sentence_max_new_tokens) {
  if (sentence_max_new_tokens.empty()) return std::vector<int64_t>(static_cast<size_t>(batch_size), max_new_tokens);
  MF_CHECK(static_cast<int64_t>(sentence_max_new_tokens.size()) == batch_size,
           "{}: sentence_max_new_tokens holds {} limits for {} sentences", op, sentence_max_new_tokens.size(),
           batch_size);
  std::vector<int64_t> limits;
  for (int64_t limit : sentence_max_new_tokens) {
    MF_CHECK(limit >= 1, "{}: sentence_max_new_tokens must be at least 1, got {} for sentence {}", op, limit,
             limits.size());
    limits.push_back(std::min(limit, max_new_tokens));
  }
  return limits;
}

void check_prefixes(const char* op, const std::vector<std::vector<int64_t>>& prefixes, const std::vector<int64_t>& limits,
                    int64_t eos_id) {
  if (prefixes.empty()) return;
  MF_CHECK(prefixes.size() == limits.size(), "{}: prefixes holds {} lists for {} sentences", op, prefixes.size(),
           limits.size());
  for (size_t s = 0; s < prefixes.size(); ++s) {
    const auto length = static_cast<int64_t>(prefixes[s].size());
    MF_CHECK(length < limits[s],
             "{}: the prefix of sentence {} holds {} tokens, which leaves none to generate under its limit of {}", op,
             s, length, limits[s]);
    for (int64_t token : prefixes[s])
      MF_CHECK(token >= 0 && token != eos_id, "{}: the prefix of sentence {} holds token {}{}", op, s, token,
               token < 0 ? ", not a token id" : ", the end of sentence");
  }
}

double length_penalty(int64_t length, double alpha) {
  return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

GreedyResult greedy_decode(IncrementalDecoder& decoder, int64_t batch_size, const GreedyOptions& options) {
  const char* op = "greedy_decode";
  const std::vector<int64_t> specials{options.sos_id, options.eos_id, options.pad_id};
  check_common(op, batch_size, options.max_new_tokens, specials);
  const std::vector<int64_t> limits =
      sentence_limits(op, batch_size, options.max_new_tokens, options.sentence_max_new_tokens);
  check_prefixes(op, options.prefixes, limits, options.eos_id);
  const OutputRules rules(op, {options.eos_id}, options.min_new_tokens, options.no_repeat_ngram_size);
  NoGradGuard no_grad;

  std::vector<std::vector<int64_t>> generated(static_cast<size_t>(batch_size));
  std::vector<double> log_probs(static_cast<size_t>(batch_size), 0.0);
  std::vector<int64_t> sentence_of_row(static_cast<size_t>(batch_size));  // the decoder's rows, in order
  std::iota(sentence_of_row.begin(), sentence_of_row.end(), 0);
  int64_t vocab = -1;
  for (int64_t step = 1; !sentence_of_row.empty(); ++step) {
    std::vector<int64_t> tokens, forced;
    std::vector<std::vector<int64_t>> row_bans;
    for (int64_t s : sentence_of_row) {
      tokens.push_back(generated[s].empty() ? options.sos_id : generated[s].back());
      forced.push_back(forced_token(options.prefixes, s, generated[s].size()));
      if (rules.active()) row_bans.push_back(rules.ruled_out_next(generated[s]));
    }
    TopTokens top = options.sampling.do_sample ? step_sample(op, decoder, tokens, vocab, specials, options.banned_ids,
                                                             row_bans, options.sampling, forced)
                                               : step_top(op, decoder, tokens, 1, vocab, specials, options.banned_ids,
                                                          row_bans, forced);
    std::vector<int64_t> keep;  // rows whose sentence goes on
    for (size_t row = 0; row < sentence_of_row.size(); ++row) {
      int64_t s = sentence_of_row[row];
      const bool is_forced = forced[row] >= 0;
      const int64_t token = is_forced ? forced[row] : top.ids[row];
      const bool possible = token >= 0 && (is_forced || top.values[row] > -std::numeric_limits<double>::infinity());
      MF_CHECK(possible, "{}: sentence {} has no token left to take: the model gives every token it may take "
               "probability 0", op, s);
      generated[s].push_back(token);
      log_probs[s] += is_forced ? top.forced[row] : top.values[row];
      if (token != options.eos_id && step < limits[s]) keep.push_back(static_cast<int64_t>(row));
    }
    if (keep.empty()) break;
    select_if_changed(decoder, keep, sentence_of_row.size());
    std::vector<int64_t> kept_sentences;
    for (int64_t row : keep) kept_sentences.push_back(sentence_of_row[row]);
    sentence_of_row = std::move(kept_sentences);
  }

  std::vector<int64_t> lengths;
  for (const auto& g : generated) lengths.push_back(static_cast<int64_t>(g.size()));
  const size_t width = 1 + static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<int64_t> matrix(static_cast<size_t>(batch_size) * width, options.pad_id);  // [B, L]
  for (size_t s = 0; s < generated.size(); ++s) {
    matrix[s * width] = options.sos_id;
    std::copy(generated[s].begin(), generated[s].end(), matrix.begin() + static_cast<std::ptrdiff_t>(s * width + 1));
  }
  return {.tokens = from_vector(matrix, {batch_size, static_cast<int64_t>(width)}),
          .log_probs = std::move(log_probs),
          .lengths = std::move(lengths)};
}

std::vector<std::vector<Hypothesis>> beam_search(IncrementalDecoder& decoder, int64_t batch_size,
                                                 const BeamOptions& options) {
  const char* op = "beam_search";
  MF_CHECK(options.eos_id >= -1, "{}: eos_id must be a token id, or -1 for none, got {}", op, options.eos_id);
  std::vector<int64_t> specials{options.sos_id};
  if (options.eos_id >= 0) specials.push_back(options.eos_id);
  check_common(op, batch_size, options.max_new_tokens, specials);
  MF_CHECK(options.beam_size >= 1, "{}: beam_size must be at least 1, got {}", op, options.beam_size);
  MF_CHECK(options.nbest >= 1 && options.nbest <= options.beam_size,
           "{}: nbest must be between 1 and beam_size ({}), got {}", op, options.beam_size, options.nbest);
  MF_CHECK(std::isfinite(options.length_penalty), "{}: length_penalty must be finite, got {}", op,
           options.length_penalty);
  const std::vector<int64_t> limits =
      sentence_limits(op, batch_size, options.max_new_tokens, options.sentence_max_new_tokens);
  check_prefixes(op, options.prefixes, limits, options.eos_id);
  const OutputRules rules(op, options.eos_id >= 0 ? std::vector<int64_t>{options.eos_id} : std::vector<int64_t>{},
                          options.min_new_tokens, options.no_repeat_ngram_size);
  MF_CHECK(options.preceding_tokens.empty() || options.preceding_tokens.size() == static_cast<size_t>(batch_size),
           "{}: preceding_tokens holds {} lists for {} sentences", op, options.preceding_tokens.size(), batch_size);
  NoGradGuard no_grad;

  const auto beam = static_cast<size_t>(options.beam_size);
  std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(batch_size));
  std::vector<Live> live;  // grouped by sentence, best first within a sentence
  for (int64_t s = 0; s < batch_size; ++s) live.push_back({.sentence = s, .tokens = {}, .log_prob = 0.0});
  std::vector<int64_t> live_rows(live.size());  // the decoder row of each live hypothesis
  std::iota(live_rows.begin(), live_rows.end(), int64_t{0});
  const std::vector<int64_t> nothing;
  auto preceding = [&](int64_t s) -> const std::vector<int64_t>& {
    return options.preceding_tokens.empty() ? nothing : options.preceding_tokens[static_cast<size_t>(s)];
  };
  int64_t vocab = -1;
  for (int64_t step = 1; !live.empty(); ++step) {
    std::vector<int64_t> tokens(live.size()), forced(live.size());
    std::vector<std::vector<int64_t>> row_bans(rules.active() ? live.size() : 0);
    for (size_t i = 0; i < live.size(); ++i) {
      const auto row = static_cast<size_t>(live_rows[i]);
      tokens[row] = live[i].tokens.empty() ? options.sos_id : live[i].tokens.back();
      forced[row] = forced_token(options.prefixes, live[i].sentence, live[i].tokens.size());
      if (rules.active()) row_bans[row] = rules.ruled_out_next(live[i].tokens, preceding(live[i].sentence));
    }
    TopTokens top = step_top(op, decoder, tokens, options.beam_size + 1, vocab, specials, options.banned_ids, row_bans,
                             forced);

    std::vector<Live> next;
    std::vector<int64_t> parent_rows;  // the decoder row of each hypothesis' parent in `next`
    for (size_t begin = 0, end = 0; begin < live.size(); begin = end) {
      const int64_t s = live[begin].sentence;
      while (end < live.size() && live[end].sentence == s) ++end;
      const int64_t limit = limits[static_cast<size_t>(s)];
      const bool last_step = step == limit;
      if (const auto row = static_cast<size_t>(live_rows[begin]); forced[row] >= 0) {
        // Still in its prefix (check_prefixes keeps it short of the limit): one hypothesis, extended.
        std::vector<int64_t> extended = live[begin].tokens;
        extended.push_back(forced[row]);
        next.push_back({.sentence = s, .tokens = std::move(extended), .log_prob = live[begin].log_prob + top.forced[row]});
        parent_rows.push_back(live_rows[begin]);
        continue;
      }
      std::vector<Candidate> candidates;
      for (size_t i = begin; i < end; ++i)
        for (int64_t j = 0; j < top.k; ++j) {
          size_t at = static_cast<size_t>(live_rows[i] * top.k + j);
          // A banned token, where the row had fewer than k left, or one the model gives probability 0 (a
          // score of -inf): no hypothesis.
          if (top.ids[at] < 0 || top.values[at] == -std::numeric_limits<double>::infinity()) continue;
          candidates.push_back({live[i].log_prob + top.values[at], static_cast<int64_t>(i), top.ids[at]});
        }
      MF_CHECK(!candidates.empty() || !finished[s].empty(),
               "{}: sentence {} has no token left to take: the model gives every token it may take probability 0",
               op, s);
      // Stable: equal sums keep the earlier hypothesis, then the lower token id (topk's order).
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const Candidate& a, const Candidate& b) { return a.log_prob > b.log_prob; });
      const size_t first_new = next.size();
      for (size_t rank = 0; rank < candidates.size() && next.size() - first_new < beam; ++rank) {
        const Candidate& c = candidates[rank];
        if (c.token == options.eos_id && rank >= beam) continue;
        std::vector<int64_t> extended = live[static_cast<size_t>(c.hypothesis)].tokens;
        extended.push_back(c.token);
        if (c.token == options.eos_id) {
          finished[s].push_back(finish(std::move(extended), c.log_prob, options.length_penalty));
        } else {
          next.push_back({.sentence = s, .tokens = std::move(extended), .log_prob = c.log_prob});
          parent_rows.push_back(live_rows[static_cast<size_t>(c.hypothesis)]);
        }
      }
      if (last_step) {
        for (size_t i = first_new; i < next.size(); ++i)
          finished[s].push_back(finish(std::move(next[i].tokens), next[i].log_prob, options.length_penalty));
      }
      if (last_step || sentence_done(finished[s], next, first_new, next.size(), step, limit, options)) {
        next.resize(first_new);
        parent_rows.resize(first_new);
      }
    }
    if (next.empty()) break;
    live_rows = rows_at_parents(next, parent_rows);
    std::vector<int64_t> sources(next.size());  // the decoder's row r continues from its row sources[r]
    for (size_t i = 0; i < next.size(); ++i) sources[static_cast<size_t>(live_rows[i])] = parent_rows[i];
    select_if_changed(decoder, sources, live.size());
    live = std::move(next);
  }

  for (auto& hyps : finished) {
    std::stable_sort(hyps.begin(), hyps.end(),
                     [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
    hyps.resize(std::min(hyps.size(), static_cast<size_t>(options.nbest)));
  }
  return finished;
}

}  // namespace mf::generation
