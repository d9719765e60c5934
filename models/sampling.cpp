#include "models/sampling.h"

#include "core/graph.h"
#include "models/generation.h"
#include "models/output_rules.h"
#include "nn/kv_cache.h"
#include "ops/functional.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

namespace mf::generation {

namespace {

bool is_stop(const GenerateOptions& options, int64_t token) {
  return std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
}

void check_sampling(const SamplingOptions& options) {
  if (!options.do_sample) return;
  MF_CHECK(std::isfinite(options.temperature) && options.temperature > 0,
           "generation: temperature must be positive and finite, got {}", options.temperature);
  MF_CHECK(options.top_k >= 0, "generation: top_k must be >= 0, got {}", options.top_k);
  MF_CHECK(options.top_p > 0 && options.top_p <= 1, "generation: top_p must be in (0, 1], got {}", options.top_p);
}

Tensor choose(const Tensor& logits, const SamplingOptions& options) {
  if (!options.do_sample) return logits.argmax(-1);
  constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();
  Tensor scores = logits.to(DType::Float32) / options.temperature;  // [B, V]
  int64_t vocabulary = scores.size(1);
  if (options.top_k > 0 && options.top_k < vocabulary) {
    Tensor kth = std::get<0>(topk(scores, options.top_k, -1)).narrow(1, options.top_k - 1, 1);  // [B, 1]
    scores = scores.masked_fill(scores < kth, kNegativeInfinity);
  }
  if (options.top_p < 1) {
    auto [sorted, order] = sort(softmax(scores, -1), -1, true);  // [B, V], largest first
    // A token goes when the tokens ranked above it already reach top_p (so the first always stays).
    Tensor above = cumsum(sorted, -1) - sorted;
    Tensor dropped_sorted = (above >= options.top_p).to(DType::Float32);
    Tensor dropped = scatter_add(zeros_like(dropped_sorted), -1, order, dropped_sorted) > 0.5;  // back to token order
    scores = scores.masked_fill(dropped, kNegativeInfinity);
  }
  return multinomial(softmax(scores, -1), 1, false, options.generator).view({scores.size(0)});
}

bool penalizes_repeats(const GenerateOptions& options) { return options.repetition_penalty != 1.0; }

/// `scores` ([B, V]) with repetition_penalty applied to each token of the row's `sequence` ([B, T]
/// int64 on the scores' device): divided by it where positive, multiplied where negative.
Tensor penalize_repeats(const Tensor& scores, const Tensor& sequence, double penalty) {
  const Tensor held = scatter_add(zeros_like(scores), 1, sequence, ones({sequence.size(0), sequence.size(1)},
                                                                        scores.dtype(), scores.device())) > 0.5;
  return where(held, where(scores < 0.0, scores * penalty, scores / penalty), scores);
}

/// The model's logits [rows, fed, V], checked, and the cache moved past the fed positions.
Tensor run_model(const LanguageModel& model, const Tensor& fed, nn::KVCache* cache) {
  Tensor logits = model(fed);
  MF_CHECK(logits.defined() && logits.dim() == 3 && logits.size(0) == fed.size(0) && logits.size(1) == fed.size(1),
           "generate: the model returned {} for tokens {}; expected logits [B, T, V] = [{}, {}, V]",
           logits.defined() ? shape_str(logits.shape()) : "an undefined tensor", shape_str(fed.shape()), fed.size(0),
           fed.size(1));
  if (cache != nullptr) cache->advance(fed.size(1));
  return logits;
}

/// What the model is fed without the cache: the whole sequence, or its last context_length tokens.
Tensor uncached_window(const Tensor& sequence, int64_t context_length) {
  const int64_t length = sequence.size(1), window = context_length > 0 ? context_length : length;
  return sequence.narrow(1, std::max<int64_t>(length - window, 0), std::min(window, length));
}

/// Each row of `prompt` ([B, T] int64), on the host.
std::vector<std::vector<int64_t>> host_rows(const Tensor& prompt) {
  const std::vector<int64_t> values = prompt.to(Device::cpu()).to_vector<int64_t>();
  const auto width = static_cast<std::ptrdiff_t>(prompt.size(1));
  std::vector<std::vector<int64_t>> rows;
  for (auto row = values.begin(); row != values.end(); row += width) rows.emplace_back(row, row + width);
  return rows;
}

/// Each row of `prompt` `times` times in a row: [B * times, T].
Tensor repeat_rows(const Tensor& prompt, int64_t times) {
  std::vector<int64_t> index;
  for (int64_t r = 0; r < prompt.size(0); ++r) index.insert(index.end(), static_cast<size_t>(times), r);
  return index_select(prompt, 0, from_vector(index, {static_cast<int64_t>(index.size())}, prompt.device()));
}

/// `logits` ([B, V]) with `banned` set to -infinity in every row, and the tokens `rules` rule out next
/// in every row that has not ended (ended[b] < 0; row b holds prompts[b] and then generated[b], both
/// empty when no rule is on): a copy.
Tensor without_ruled_out(const Tensor& logits, const std::vector<int64_t>& banned, const OutputRules& rules,
                         const std::vector<std::vector<int64_t>>& prompts,
                         const std::vector<std::vector<int64_t>>& generated, const std::vector<int64_t>& ended) {
  const int64_t vocab = logits.size(1);
  for (int64_t token : banned)
    MF_CHECK(token >= 0 && token < vocab, "generate: banned token id {} is outside the model's vocabulary of {} tokens",
             token, vocab);
  std::vector<std::vector<int64_t>> row_bans(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (ended[b] >= 0) continue;  // it repeats its stop token whatever the model says
    for (int64_t token : rules.ruled_out_next(generated[b], prompts[b]))
      if (token >= 0 && token < vocab) row_bans[b].push_back(token);  // one outside the logits is never chosen
  }
  check_tokens_left("generate", vocab, banned, row_bans);
  Tensor scores = logits.clone();
  rule_out(scores, banned, row_bans);
  return scores;
}

/// A decoder-only model as beam search's IncrementalDecoder. Its first step feeds the prompts (the
/// search's start token is not the model's); later steps append each row's token to its sequence and
/// feed that token (with the cache) or the sequence (without). select_rows reorders the sequences and
/// the cache's rows alike.
class LanguageModelDecoder final : public IncrementalDecoder {
 public:
  LanguageModelDecoder(const LanguageModel& model, Tensor prompt, const GenerateOptions& options)
      : model_(model), sequences_(std::move(prompt)), options_(options) {}

  Tensor step(const Tensor& tokens) override {
    Tensor fed = sequences_;
    if (started_) {
      Tensor column = tokens.view({tokens.size(0), 1}).to(sequences_.device());
      sequences_ = cat({sequences_, column}, 1);
      fed = options_.use_cache ? column : uncached_window(sequences_, options_.context_length);
    }
    started_ = true;
    Tensor logits;
    if (options_.use_cache) {
      nn::KVCache::Use use(cache_);
      logits = run_model(model_, fed, &cache_).select(1, -1);
    } else {
      logits = run_model(model_, fed, nullptr).select(1, -1);
    }
    if (!penalizes_repeats(options_)) return logits;
    return penalize_repeats(logits.log_softmax(1), sequences_, options_.repetition_penalty);
  }

  /// Logits, or with repetition_penalty the log-probabilities it changed (Hugging Face's beam search
  /// penalizes after log_softmax).
  Scores scores() const override { return penalizes_repeats(options_) ? Scores::LogProbs : Scores::Logits; }

  void select_rows(const Tensor& index) override {
    sequences_ = index_select(sequences_, 0, index.to(sequences_.device()));
    cache_.select_rows(index);
  }

 private:
  const LanguageModel& model_;
  Tensor sequences_;  // [rows, T + tokens fed so far]
  const GenerateOptions& options_;
  nn::KVCache cache_;
  bool started_ = false;
};

/// generate() by beam search: each row's best hypothesis after its prompt, rows that ended early
/// padded with their stop token.
Tensor generate_by_beam_search(const LanguageModel& model, const Tensor& prompt, const GenerateOptions& options) {
  MF_CHECK(!options.sampling.do_sample, "generate: num_beams {} searches; set sampling.do_sample = false (beam "
           "sampling is not there)", options.num_beams);
  MF_CHECK(options.stop_tokens.size() <= 1, "generate: beam search takes at most one stop token, got {}",
           options.stop_tokens.size());
  const int64_t rows = prompt.size(0), returned = options.num_return_sequences;
  if (options.max_new_tokens == 0) return repeat_rows(prompt, returned);
  LanguageModelDecoder decoder(model, prompt, options);
  const int64_t stop = options.stop_tokens.empty() ? -1 : options.stop_tokens[0];
  std::vector<std::vector<int64_t>> prompts = host_rows(prompt);
  BeamOptions beam{.beam_size = options.num_beams, .max_new_tokens = options.max_new_tokens,
                   .length_penalty = options.length_penalty, .nbest = returned, .sos_id = 0, .eos_id = stop,
                   .banned_ids = options.banned_ids, .min_new_tokens = options.min_new_tokens,
                   .no_repeat_ngram_size = options.no_repeat_ngram_size};
  if (options.no_repeat_ngram_size > 0) beam.preceding_tokens = prompts;
  std::vector<std::vector<Hypothesis>> best = beam_search(decoder, rows, beam);
  int64_t longest = 0;
  for (size_t r = 0; r < best.size(); ++r) {
    MF_CHECK(static_cast<int64_t>(best[r].size()) == returned,
             "generate: beam search found {} hypotheses for row {}, fewer than num_return_sequences {}",
             best[r].size(), r, returned);
    for (const Hypothesis& hypothesis : best[r]) longest = std::max<int64_t>(longest, hypothesis.tokens.size());
  }
  std::vector<int64_t> out;
  for (size_t r = 0; r < best.size(); ++r)
    for (const Hypothesis& hypothesis : best[r]) {
      out.insert(out.end(), prompts[r].begin(), prompts[r].end());
      out.insert(out.end(), hypothesis.tokens.begin(), hypothesis.tokens.end());
      out.insert(out.end(), static_cast<size_t>(longest) - hypothesis.tokens.size(), hypothesis.tokens.back());
    }
  return from_vector(out, {rows * returned, prompt.size(1) + longest}, prompt.device());
}

}  // namespace

Tensor sample_next(const Tensor& logits, const SamplingOptions& options) {
  check_sampling(options);
  MF_CHECK(logits.defined() && logits.dim() == 2 && is_floating(logits.dtype()) && logits.size(1) > 0,
           "sample_next: logits must be [B, V] floats, got {} {}", logits.defined() ? dtype_name(logits.dtype()) : "",
           logits.defined() ? shape_str(logits.shape()) : "undefined");
  NoGradGuard no_grad;
  return choose(logits, options);
}

Tensor generate(const LanguageModel& model, const Tensor& prompt, const GenerateOptions& options) {
  check_sampling(options.sampling);
  MF_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.dtype() == DType::Int64 && prompt.size(0) > 0 &&
               prompt.size(1) > 0,
           "generate: the prompt must be [B, T] int64 with B, T >= 1, got {} {}",
           prompt.defined() ? dtype_name(prompt.dtype()) : "", prompt.defined() ? shape_str(prompt.shape()) : "undefined");
  MF_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", options.max_new_tokens);
  MF_CHECK(options.context_length >= 0, "generate: context_length must be >= 0, got {}", options.context_length);
  int64_t rows = prompt.size(0);
  MF_CHECK(!options.use_cache || options.context_length == 0 ||
               prompt.size(1) + options.max_new_tokens <= options.context_length,
           "generate: with the key/value cache, the prompt ({} tokens) and max_new_tokens ({}) must fit in "
           "context_length {}",
           prompt.size(1), options.max_new_tokens, options.context_length);
  MF_CHECK(options.num_beams >= 1, "generate: num_beams must be >= 1, got {}", options.num_beams);
  const int64_t returned = options.num_return_sequences;
  MF_CHECK(returned >= 1, "generate: num_return_sequences must be >= 1, got {}", returned);
  MF_CHECK(returned == 1 || options.sampling.do_sample || options.num_beams > 1,
           "generate: greedy search has one answer per prompt; num_return_sequences {} needs sampling or beam "
           "search", returned);
  MF_CHECK(options.num_beams == 1 || returned <= options.num_beams,
           "generate: num_return_sequences {} is more than num_beams {}", returned, options.num_beams);
  MF_CHECK(std::isfinite(options.repetition_penalty) && options.repetition_penalty > 0,
           "generate: repetition_penalty must be positive and finite (1: off), got {}", options.repetition_penalty);
  const OutputRules rules("generate", options.stop_tokens, options.min_new_tokens, options.no_repeat_ngram_size);
  NoGradGuard no_grad;
  if (options.num_beams > 1) return generate_by_beam_search(model, prompt, options);
  if (returned > 1) {  // independent draws: each row sampled `returned` times
    GenerateOptions once = options;
    once.num_return_sequences = 1;
    return generate(model, repeat_rows(prompt, returned), once);
  }
  nn::KVCache cache;
  std::optional<nn::KVCache::Use> use;
  if (options.use_cache) use.emplace(cache);

  Tensor sequence = prompt, fed = prompt;
  std::vector<int64_t> ended(static_cast<size_t>(rows), -1);  // a row's stop token once it has one
  std::vector<std::vector<int64_t>> prompts, generated;  // per row on the host, for the rules only
  if (rules.active()) {
    prompts = host_rows(prompt);
    generated.resize(prompts.size());
  }
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    Tensor logits = run_model(model, fed, options.use_cache ? &cache : nullptr).select(1, -1);
    if (penalizes_repeats(options)) logits = penalize_repeats(logits, sequence, options.repetition_penalty);
    if (rules.active() || !options.banned_ids.empty())
      logits = without_ruled_out(logits, options.banned_ids, rules, prompts, generated, ended);
    std::vector<int64_t> next = choose(logits, options.sampling).to(Device::cpu()).to_vector<int64_t>();  // [B]
    bool all_ended = true;
    for (size_t b = 0; b < next.size(); ++b) {
      if (ended[b] >= 0) {
        next[b] = ended[b];
      } else if (is_stop(options, next[b])) {
        ended[b] = next[b];
      }
      if (rules.active()) generated[b].push_back(next[b]);
      all_ended = all_ended && ended[b] >= 0;
    }
    Tensor column = from_vector(next, {rows, 1}, prompt.device());
    sequence = cat({sequence, column}, 1);
    if (all_ended) break;
    fed = options.use_cache ? column : uncached_window(sequence, options.context_length);
  }
  return sequence;
}

std::vector<std::vector<int64_t>> generate(const LanguageModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options, Device device) {
  std::map<size_t, std::vector<size_t>> rows_of_length;
  for (size_t row = 0; row < prompts.size(); ++row) {
    MF_CHECK(!prompts[row].empty(), "generate: prompt {} is empty (each needs at least one token)", row);
    rows_of_length[prompts[row].size()].push_back(row);
  }
  const auto returned = static_cast<size_t>(std::max<int64_t>(options.num_return_sequences, 1));
  std::vector<std::vector<int64_t>> results(prompts.size() * returned);
  for (const auto& [length, rows] : rows_of_length) {
    std::vector<int64_t> batch;
    for (size_t row : rows) batch.insert(batch.end(), prompts[row].begin(), prompts[row].end());
    auto shape = Shape{static_cast<int64_t>(rows.size()), static_cast<int64_t>(length)};
    Tensor out = generate(model, from_vector(batch, shape, device), options).to(Device::cpu());
    std::vector<int64_t> tokens = out.to_vector<int64_t>();
    auto width = static_cast<size_t>(out.size(1));
    for (size_t k = 0; k < rows.size() * returned; ++k) {  // out's row k: sequence k % returned of rows[k / returned]
      std::vector<int64_t>& result = results[rows[k / returned] * returned + k % returned];
      result.assign(tokens.begin() + static_cast<std::ptrdiff_t>(k * width),
                    tokens.begin() + static_cast<std::ptrdiff_t>((k + 1) * width));
      // Cut after the first stop token among the new ones: what follows repeats it.
      for (size_t t = length; t < result.size(); ++t)
        if (is_stop(options, result[t])) {
          result.resize(t + 1);
          break;
        }
    }
  }
  return results;
}

}  // namespace mf::generation
