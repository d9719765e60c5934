#include "models/decoding.h"

#include "core/graph.h"
#include "core/parallel.h"
#include "nn/layers.h"
#include "ops/functional.h"
#include "text/batching.h"

#include <algorithm>
#include <atomic>

namespace mf::models {
namespace {

/// Greedy search's [B, L] result (<sos>, the tokens, <pad>) as one hypothesis per row.
std::vector<std::vector<generation::Hypothesis>> greedy_hypotheses(const generation::GreedyResult& result) {
  const int64_t rows = result.tokens.size(0), width = result.tokens.size(1);
  const std::vector<int64_t> ids = result.tokens.to_vector<int64_t>();
  std::vector<std::vector<generation::Hypothesis>> out;
  for (int64_t row = 0; row < rows; ++row) {
    auto first = ids.begin() + row * width + 1;  // after <sos>
    double log_prob = result.log_probs[static_cast<size_t>(row)];
    out.push_back({{.tokens = std::vector<int64_t>(first, first + result.lengths[static_cast<size_t>(row)]),
                    .log_prob = log_prob,
                    .score = log_prob}});
  }
  return out;
}

/// log((exp(x_1) + ... + exp(x_M)) / M) element by element, shifted by the largest x so that no term
/// underflows where the largest does not.
Tensor log_mean_exp(const std::vector<Tensor>& log_probs) {
  if (log_probs.size() == 1) return log_probs.front();
  const Tensor stacked = stack(log_probs, 0);         // [M, ...]
  const Tensor top = amax(stacked, {0}, true);         // [1, ...]
  const Tensor summed = sum(exp(stacked - top), {0});  // [...]
  return top.squeeze(0) + log(summed) - std::log(static_cast<double>(log_probs.size()));
}

}  // namespace

int64_t shortest_max_len(const Ensemble& models) {
  int64_t max_len = models.front()->config().max_len;
  for (const Transformer* model : models) max_len = std::min(max_len, model->config().max_len);
  return max_len;
}

void check_ensemble(const char* op, const Ensemble& models) {
  MF_CHECK(!models.empty(), "{}: no model given", op);
  const Transformer& first = *models.front();
  for (size_t m = 1; m < models.size(); ++m) {
    const Transformer& member = *models[m];
    MF_CHECK(member.config().tgt_vocab == first.config().tgt_vocab,
             "{}: ensemble member {} has a target vocabulary of {} tokens, member 0 of {}", op, m,
             member.config().tgt_vocab, first.config().tgt_vocab);
    MF_CHECK(member.config().pad_id == first.config().pad_id, "{}: ensemble member {} pads with id {}, member 0 with {}",
             op, m, member.config().pad_id, first.config().pad_id);
    MF_CHECK(member.device() == first.device(), "{}: ensemble member {} is on {}, member 0 on {}", op, m,
             member.device().str(), first.device().str());
  }
}

EnsembleDecoder::EnsembleDecoder(const Ensemble& models, const Tensor& src, const std::vector<int64_t>& output_ids) {
  check_ensemble("EnsembleDecoder", models);
  for (Transformer* model : models)
    members_.push_back(std::make_unique<TransformerDecoder>(*model, src, output_ids));
}

Tensor EnsembleDecoder::step(const Tensor& tokens) {
  Tensor total;
  for (const auto& member : members_) {
    Tensor probabilities = softmax(member->step(tokens), 1);
    total = total.defined() ? total.add_(probabilities) : probabilities;
  }
  return total.mul_(1.0 / static_cast<double>(members_.size()));
}

void EnsembleDecoder::select_rows(const Tensor& index) {
  for (const auto& member : members_) member->select_rows(index);
}

Tensor pad_sources(const std::vector<std::vector<int64_t>>& sources, std::span<const int64_t> rows, int64_t max_len,
                   Device device) {
  const int64_t limit = max_len - 1;  // room for <eos>
  int64_t longest = 0;
  for (int64_t i : rows) {
    MF_CHECK(i >= 0 && i < static_cast<int64_t>(sources.size()), "pad_sources: row {} is out of range for {} sources",
             i, sources.size());
    longest = std::max(longest, std::min<int64_t>(static_cast<int64_t>(sources[i].size()), limit));
  }
  const int64_t width = longest + 1;
  std::vector<int64_t> flat(rows.size() * static_cast<size_t>(width), text::kPadId);
  for (size_t row = 0; row < rows.size(); ++row) {
    const std::vector<int64_t>& ids = sources[static_cast<size_t>(rows[row])];
    const auto kept = static_cast<std::ptrdiff_t>(std::min<int64_t>(static_cast<int64_t>(ids.size()), limit));
    auto out = flat.begin() + static_cast<std::ptrdiff_t>(row) * width;
    out = std::copy(ids.begin(), ids.begin() + kept, out);
    *out = text::kEosId;
  }
  return from_vector(flat, {static_cast<int64_t>(rows.size()), width}, device);
}

int64_t output_budget(int64_t source_length, int64_t max_len) {
  return std::min(max_len - 1, source_length * 3 / 2 + 10);
}

std::vector<std::vector<generation::Hypothesis>> decode_sources(Transformer& model,
                                                                const std::vector<std::vector<int64_t>>& sources,
                                                                const DecodingOptions& options) {
  return decode_sources(Ensemble{&model}, sources, options);
}

namespace {

/// The target ids decoding `batch` of `sources` scores under options.shortlist (DecodingOptions), or
/// none (the whole vocabulary) without one.
std::vector<int64_t> shortlisted_ids(const DecodingOptions& options, const TransformerConfig& config,
                                     const std::vector<std::vector<int64_t>>& sources, const text::Batch& batch) {
  if (!options.shortlist) return {};
  std::vector<std::vector<int64_t>> batch_sources;
  for (int64_t i : batch) batch_sources.push_back(sources[static_cast<size_t>(i)]);
  const int64_t first = std::min(options.shortlist_first, config.tgt_vocab);
  std::vector<int64_t> ids =
      options.shortlist->shortlist(batch_sources, first, options.shortlist_best, config.shared_embeddings);
  ids.push_back(text::kEosId);
  if (!options.target_prefixes.empty())
    for (int64_t i : batch) {
      const std::vector<int64_t>& prefix = options.target_prefixes[static_cast<size_t>(i)];
      ids.insert(ids.end(), prefix.begin(), prefix.end());
    }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

std::vector<std::vector<generation::Hypothesis>> decode_sources(const Ensemble& models,
                                                                const std::vector<std::vector<int64_t>>& sources,
                                                                const DecodingOptions& options) {
  check_ensemble("decode_sources", models);
  MF_CHECK(options.batch_tokens >= 0,
           "decode_sources: batch_tokens must be 0 (by the weights' precision and the search) or positive, got {}",
           options.batch_tokens);
  MF_CHECK(options.batch_sentences >= 0, "decode_sources: batch_sentences must be 0 (no cap) or positive, got {}",
           options.batch_sentences);
  MF_CHECK(options.workers >= 0, "decode_sources: workers must be 0 (one per intra-op thread) or positive, got {}",
           options.workers);
  MF_CHECK(!options.sampling.do_sample || (options.beam_size == 1 && options.nbest == 1),
           "decode_sources: sampling draws one translation per sentence: it needs beam_size 1 and nbest 1, got {} "
           "and {}", options.beam_size, options.nbest);
  MF_CHECK(options.target_prefixes.empty() || options.target_prefixes.size() == sources.size(),
           "decode_sources: target_prefixes holds {} prefixes for {} sources", options.target_prefixes.size(),
           sources.size());
  Transformer& model = *models.front();
  const int64_t max_len = shortest_max_len(models);
  std::vector<int64_t> lengths;  // as padded: truncated to max_len - 1, then <eos>
  for (const std::vector<int64_t>& ids : sources)
    lengths.push_back(std::min<int64_t>(static_cast<int64_t>(ids.size()), max_len - 1) + 1);

  std::vector<std::vector<generation::Hypothesis>> out(sources.size());
  const int64_t batch_tokens = options.batch_tokens > 0
                                   ? options.batch_tokens
                                   : default_batch_tokens(nn::is_quantized_int8(model), options.beam_size);
  const int64_t source_tokens = std::max<int64_t>(1, batch_tokens / std::max<int64_t>(1, options.beam_size));
  // Batches of the shortest sources first: they hold the most sentences, so each step's
  // [sentences, vocabulary] logits are largest there, and the caching allocator's blocks from them
  // serve the later, smaller batches. Taken longest first, every batch would need larger blocks than
  // any before it, fresh pages the kernel must clear (14% of a 1-thread int8 run on Zen 3).
  std::vector<text::Batch> batches = text::sorted_batches(lengths, source_tokens, options.batch_sentences);
  std::reverse(batches.begin(), batches.end());
  // Workers share the models: a layer that records attention writes to itself, so then one decodes.
  const bool records_attention =
      std::any_of(models.begin(), models.end(), [](const Transformer* m) { return m->records_attention(); });
  const int64_t wanted_workers =
      records_attention ? 1
                        : std::min<int64_t>(options.workers == 0 ? intra_op_threads() : options.workers,
                                            model.device().is_cpu() ? intra_op_threads() : 1);
  // Sampled batches draw from streams by batch index, so sampling keeps one worker's batches (and the
  // samples do not depend on the workers); greedy and beam search give each sentence the same output in
  // any batch.
  if (!options.sampling.do_sample) batches = text::split_for_workers(std::move(batches), wanted_workers);
  // Sampling: batch b draws from the counters [first + b * kBatchBlocks, ...) of the stream's seed.
  constexpr uint64_t kBatchBlocks = uint64_t{1} << 32;
  Generator& stream = options.sampling.generator ? *options.sampling.generator : default_generator();
  const uint64_t first_block = options.sampling.do_sample ? stream.reserve(batches.size() * kBatchBlocks) : 0;
  auto decode_batch = [&](size_t index) {
    const text::Batch& batch = batches[index];
    const Tensor src = pad_sources(sources, batch, max_len, model.device());  // [B, S]
    // Each sentence gets its own source's budget, not its longest batchmate's: a translation must not
    // depend on the sentences decoded beside it (nor on batch_tokens and batch_sentences).
    std::vector<int64_t> budgets;
    std::vector<std::vector<int64_t>> prefixes;
    for (int64_t i : batch) {
      int64_t budget = output_budget(lengths[static_cast<size_t>(i)], max_len);
      if (!options.target_prefixes.empty()) {
        const std::vector<int64_t>& prefix = options.target_prefixes[static_cast<size_t>(i)];
        budget = std::min(max_len - 1, std::max(budget, static_cast<int64_t>(prefix.size()) + 1));
        prefixes.push_back(prefix);
      }
      budgets.push_back(budget);
    }
    const std::vector<int64_t> output_ids = shortlisted_ids(options, model.config(), sources, batch);
    std::unique_ptr<generation::IncrementalDecoder> decoder;
    if (models.size() == 1)
      decoder = std::make_unique<TransformerDecoder>(model, src, output_ids);
    else
      decoder = std::make_unique<EnsembleDecoder>(models, src, output_ids);
    std::vector<std::vector<generation::Hypothesis>> decoded;
    if (options.beam_size == 1 && options.nbest == 1) {
      Generator batch_stream(stream.seed());
      batch_stream.set_offset(first_block + index * kBatchBlocks);
      generation::SamplingOptions sampling = options.sampling;
      sampling.generator = &batch_stream;
      decoded = greedy_hypotheses(generation::greedy_decode(*decoder, src.size(0),
                                                            {.max_new_tokens = options.max_new_tokens,
                                                             .pad_id = model.config().pad_id,
                                                             .banned_ids = options.banned_ids,
                                                             .min_new_tokens = options.min_new_tokens,
                                                             .no_repeat_ngram_size = options.no_repeat_ngram_size,
                                                             .sentence_max_new_tokens = std::move(budgets),
                                                             .prefixes = std::move(prefixes),
                                                             .sampling = sampling}));
    } else {
      decoded = generation::beam_search(*decoder, src.size(0),
                                        {.beam_size = options.beam_size,
                                         .max_new_tokens = options.max_new_tokens,
                                         .length_penalty = options.length_penalty,
                                         .nbest = options.nbest,
                                         .banned_ids = options.banned_ids,
                                         .min_new_tokens = options.min_new_tokens,
                                         .no_repeat_ngram_size = options.no_repeat_ngram_size,
                                         .stop = options.stop,
                                         .sentence_max_new_tokens = std::move(budgets),
                                         .prefixes = std::move(prefixes)});
    }
    for (size_t row = 0; row < batch.size(); ++row) out[static_cast<size_t>(batch[row])] = std::move(decoded[row]);
  };

  const int64_t workers = std::min(wanted_workers, static_cast<int64_t>(batches.size()));
  if (workers <= 1) {
    NoGradGuard no_grad;
    for (size_t b = 0; b < batches.size(); ++b) decode_batch(b);
    return out;
  }
  // Each worker, a chunk of the intra-op pool (whose ops inside a chunk run serially), takes the next
  // batch not yet taken: the batches' decoder steps are too small to split well over threads, so whole
  // batches side by side keep the cores busier (CTranslate2's inter_threads, Marian's --cpu-threads).
  // Grad mode and autocast are per thread: the workers compute as the caller would. The pool rethrows
  // the first worker's error once every worker has stopped.
  const bool autocast = is_autocast_enabled(DeviceType::CPU);
  std::atomic<size_t> next_batch{0};
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {  // one worker per chunk: workers <= threads
    NoGradGuard no_grad;
    AutocastGuard same_autocast(DeviceType::CPU, DType::BFloat16, autocast);
    try {
      for (size_t b = next_batch++; b < batches.size(); b = next_batch++) decode_batch(b);
    } catch (...) {
      next_batch = batches.size();  // the others stop after their current batch
      throw;
    }
  });
  return out;
}

Tensor target_log_probs(Transformer& model, const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out) {
  MF_CHECK(tgt_in.dim() == 2 && tgt_out.shape() == tgt_in.shape(),
           "target_log_probs: tgt_in and tgt_out must be [B, T] of one shape, got {} and {}", shape_str(tgt_in.shape()),
           shape_str(tgt_out.shape()));
  const Tensor logits = model.forward(src, tgt_in);  // [B, T, V]
  const Tensor chosen = gather(log_softmax(logits, -1), -1, tgt_out.unsqueeze(-1)).squeeze(-1);
  return chosen.masked_fill(tgt_out.eq(static_cast<double>(model.config().pad_id)), 0.0);
}

std::vector<TargetScore> score_targets(Transformer& model, const std::vector<std::vector<int64_t>>& sources,
                                       const std::vector<std::vector<int64_t>>& targets,
                                       const ScoringOptions& options) {
  return score_targets(Ensemble{&model}, sources, targets, options);
}

namespace {

/// How many of `ids` forced decoding keeps: at most max_len - 1, leaving room for <sos> or <eos>.
int64_t kept_length(const std::vector<int64_t>& ids, int64_t max_len) {
  return std::min<int64_t>(static_cast<int64_t>(ids.size()), max_len - 1);
}

/// One padded batch of (source, target) pairs for forced decoding: the pairs at `rows`, each cut to
/// its first max_len - 1 ids.
struct ForcedBatch {
  std::span<const int64_t> rows;  // indices of the pairs, in the batch's row order
  Tensor src, tgt_in, tgt_out;    // [B, S], [B, T], [B, T]: pad_sources; <sos> + target; target + <eos>
};

/// Calls `each(batch)` for the pairs in length-sorted batches under `options` (source plus target ids,
/// <eos> and <sos> included), every pair cut to `max_len` - 1 ids on each side. `op` names the caller in
/// errors: lists of different sizes, a <pad> inside a target, options out of range.
template <typename Each>
void for_each_forced_batch(const char* op, const std::vector<std::vector<int64_t>>& sources,
                           const std::vector<std::vector<int64_t>>& targets, const ScoringOptions& options,
                           int64_t max_len, Device device, Each each) {
  MF_CHECK(sources.size() == targets.size(), "{}: {} sources but {} targets", op, sources.size(), targets.size());
  MF_CHECK(options.batch_tokens > 0, "{}: batch_tokens must be positive, got {}", op, options.batch_tokens);
  MF_CHECK(options.batch_sentences >= 0, "{}: batch_sentences must be 0 (no cap) or positive, got {}", op,
           options.batch_sentences);
  auto kept = [&](const std::vector<int64_t>& ids) { return kept_length(ids, max_len); };
  std::vector<int64_t> lengths;  // source + <eos>, then <sos> + target
  for (size_t i = 0; i < sources.size(); ++i) {
    // A <pad> inside a target would be masked out of the decoder's attention and of the sum.
    const auto pad = std::find(targets[i].begin(), targets[i].end(), text::kPadId);
    MF_CHECK(pad == targets[i].end(), "{}: target {} holds <pad> (id {}) at position {}", op, i, text::kPadId,
             pad - targets[i].begin());
    lengths.push_back(kept(sources[i]) + kept(targets[i]) + 2);
  }
  NoGradGuard no_grad;
  for (const text::Batch& batch : text::sorted_batches(lengths, options.batch_tokens, options.batch_sentences)) {
    int64_t width = 0;  // the longest target + <eos>
    for (int64_t i : batch) width = std::max(width, kept(targets[static_cast<size_t>(i)]) + 1);
    std::vector<int64_t> tgt_in(batch.size() * static_cast<size_t>(width), text::kPadId), tgt_out = tgt_in;
    for (size_t row = 0; row < batch.size(); ++row) {
      const std::vector<int64_t>& ids = targets[static_cast<size_t>(batch[row])];
      const auto n = static_cast<std::ptrdiff_t>(kept(ids));
      const auto start = static_cast<std::ptrdiff_t>(row) * width;
      tgt_in[static_cast<size_t>(start)] = text::kSosId;
      std::copy(ids.begin(), ids.begin() + n, tgt_in.begin() + start + 1);
      *std::copy(ids.begin(), ids.begin() + n, tgt_out.begin() + start) = text::kEosId;
    }
    const Shape shape{static_cast<int64_t>(batch.size()), width};
    each(ForcedBatch{.rows = batch,
                     .src = pad_sources(sources, batch, max_len, device),
                     .tgt_in = from_vector(tgt_in, shape, device),
                     .tgt_out = from_vector(tgt_out, shape, device)});
  }
}

}  // namespace

std::vector<TargetScore> score_targets(const Ensemble& models, const std::vector<std::vector<int64_t>>& sources,
                                       const std::vector<std::vector<int64_t>>& targets,
                                       const ScoringOptions& options) {
  check_ensemble("score_targets", models);
  const int64_t max_len = shortest_max_len(models);
  std::vector<TargetScore> out(sources.size());
  for_each_forced_batch("score_targets", sources, targets, options, max_len, models.front()->device(),
                        [&](const ForcedBatch& batch) {
    std::vector<Tensor> member_log_probs;  // [B, T] each
    for (Transformer* member : models)
      member_log_probs.push_back(target_log_probs(*member, batch.src, batch.tgt_in, batch.tgt_out));
    const std::vector<double> log_probs = log_mean_exp(member_log_probs).to(Device::cpu()).to_vector<double>();
    const int64_t width = batch.tgt_out.size(1);
    for (size_t row = 0; row < batch.rows.size(); ++row) {
      const auto pair = static_cast<size_t>(batch.rows[row]);
      TargetScore& score = out[pair];
      const auto first = log_probs.begin() + static_cast<std::ptrdiff_t>(row) * width;
      score.token_log_probs.assign(first, first + kept_length(targets[pair], max_len) + 1);
      for (double p : score.token_log_probs) score.log_prob += p;
    }
  });
  return out;
}

std::vector<Tensor> target_cross_attention(Transformer& model, const std::vector<std::vector<int64_t>>& sources,
                                           const std::vector<std::vector<int64_t>>& targets, int64_t layer,
                                           const ScoringOptions& options) {
  const int64_t layers = model.config().decoder_layers;
  MF_CHECK(layer == -1 || (layer >= 1 && layer <= layers),
           "target_cross_attention: layer must be 1 to the decoder's {} layers or -1 (the last), got {}", layers,
           layer);
  const int64_t max_len = model.config().max_len;
  std::vector<Tensor> out(sources.size());
  for_each_forced_batch("target_cross_attention", sources, targets, options, max_len, model.device(),
                        [&](const ForcedBatch& batch) {
    // [B, T, S]: the rows past a target's <eos> and the columns past a source's <eos> read padding.
    const Tensor attention = model.cross_attention(batch.src, batch.tgt_in, layer == -1 ? layers : layer)
                                 .mean({1})
                                 .to(Device::cpu())
                                 .to(DType::Float64);
    for (size_t row = 0; row < batch.rows.size(); ++row) {
      const auto pair = static_cast<size_t>(batch.rows[row]);
      out[pair] = attention.select(0, static_cast<int64_t>(row))
                      .narrow(0, 0, kept_length(targets[pair], max_len) + 1)
                      .narrow(1, 0, kept_length(sources[pair], max_len) + 1)
                      .contiguous();
    }
  });
  return out;
}

}  // namespace mf::models
