#include "train/train_loop.h"

#include "core/atomic_file.h"
#include "core/graph.h"
#include "core/json_brief.h"
#include "text/batching.h"
#include "text/bleu.h"
#include "text/sacrebleu.h"
#include "ops/functional.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/scheduler.h"
#include "train/svg.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>

namespace mf::train {
namespace {

using json = nlohmann::json;
constexpr const char* kProgressKey = "train_transformer.progress";

volatile std::sig_atomic_t g_interrupted = 0;
/// Ctrl-C (SIGINT), SIGTERM and SIGUSR1 ask the loop to save and stop; the same signal again ends the
/// process as usual. Under mpirun, Ctrl-C reaches mpirun alone, which sends SIGTERM to every rank
/// (and SIGKILL after odls_base_sigkill_timeout seconds); mpirun forwards SIGUSR1 to every rank.
constexpr std::array<int, 3> kStopSignals{SIGINT, SIGTERM, SIGUSR1};
extern "C" void on_stop_signal(int signal) {
  g_interrupted = 1;
  std::signal(signal, SIG_DFL);
}

/// Installs on_stop_signal for its scope, restoring the previous handlers however the loop ends.
class StopSignalScope {
 public:
  StopSignalScope() {
    g_interrupted = 0;
    for (size_t i = 0; i < kStopSignals.size(); ++i) previous_[i] = std::signal(kStopSignals[i], on_stop_signal);
  }
  ~StopSignalScope() {
    for (size_t i = 0; i < kStopSignals.size(); ++i) std::signal(kStopSignals[i], previous_[i]);
  }
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  std::array<void (*)(int), kStopSignals.size()> previous_{};
};

/// One finished epoch's numbers (NaN where there was no validation set).
struct EpochRecord {
  double train_loss = NAN, valid_loss = NAN, bleu = NAN, chrf = NAN;  // bleu, chrf: sacreBLEU's, cased
};

/// Where a run stands: the next batch to train and what the curves hold so far. Saved as JSON in
/// every checkpoint.
struct Progress {
  int64_t epoch = 0;   // 0-based epoch in progress
  int64_t batch = 0;   // batches of that epoch already trained
  double loss_sum = 0; // token-weighted training loss of those batches
  int64_t loss_tokens = 0;
  double curve_sum = 0; // the same since the last point of train_curve
  int64_t curve_tokens = 0;
  std::vector<std::pair<double, double>> train_curve;  // (fractional epoch, mean loss since the last point)
  std::vector<EpochRecord> epochs;
};

json settings_json(const OptimSettings& s) {
  return {{"seed", s.seed},         {"max_tokens", s.max_tokens},           {"batch_pool", s.batch_pool},
          {"warmup", s.warmup},     {"lr_factor", s.lr_factor},             {"label_smoothing", s.label_smoothing},
          {"clip", s.clip},         {"subword_alpha", s.subword_alpha},     {"subword_nbest", s.subword_nbest}};
}

/// JSON has no NaN: missing numbers are stored as null.
json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double null_as_nan(const json& v) { return v.is_null() ? NAN : v.get<double>(); }

std::string progress_json(const Progress& p, const OptimSettings& settings) {
  json epochs = json::array();
  for (const EpochRecord& e : p.epochs)
    epochs.push_back({number_or_null(e.train_loss), number_or_null(e.valid_loss), number_or_null(e.bleu),
                      number_or_null(e.chrf)});
  return json{{"epoch", p.epoch}, {"batch", p.batch}, {"loss_sum", p.loss_sum}, {"loss_tokens", p.loss_tokens},
              {"curve_sum", p.curve_sum}, {"curve_tokens", p.curve_tokens},
              {"train_curve", p.train_curve}, {"epochs", epochs}, {"settings", settings_json(settings)}}
      .dump();
}

/// Reads the progress saved in `path`, refusing one written with other optimisation settings (named
/// as `names` says).
Progress parse_progress(const SafetensorsMetadata& metadata, const std::filesystem::path& path,
                        const OptimSettings& settings, const SettingNames& names) {
  auto it = metadata.find(kProgressKey);
  MF_CHECK(it != metadata.end(),
           "checkpoint '{}' holds no training progress to resume (no '{}' entry): the training loop did not save it",
           path.string(), kProgressKey);
  try {
    json j = json::parse(it->second);
    json saved = j.at("settings"), given = settings_json(settings);
    // Written before these settings existed: their defaults then were the only behaviour.
    if (!saved.contains("batch_pool")) saved["batch_pool"] = 0;
    if (!saved.contains("subword_alpha")) saved["subword_alpha"] = 0.0;
    if (!saved.contains("subword_nbest")) saved["subword_nbest"] = -1;
    for (auto& [key, value] : given.items())
      MF_CHECK(saved.at(key) == value,
               "checkpoint '{}' was trained with {} {}, but this run has {}; resume with the same settings",
               path.string(), names("optim." + key), detail::brief_json(saved.at(key)), value.dump());
    Progress p;
    p.epoch = j.at("epoch").get<int64_t>();
    p.batch = j.at("batch").get<int64_t>();
    MF_CHECK(p.epoch >= 0 && p.batch >= 0, "checkpoint '{}' has corrupt training progress: epoch {} and batch {} "
             "must not be negative", path.string(), p.epoch, p.batch);
    p.loss_sum = j.at("loss_sum").get<double>();
    p.loss_tokens = j.at("loss_tokens").get<int64_t>();
    p.curve_sum = j.at("curve_sum").get<double>();
    p.curve_tokens = j.at("curve_tokens").get<int64_t>();
    p.train_curve = j.at("train_curve").get<std::vector<std::pair<double, double>>>();
    for (const json& e : j.at("epochs"))
      p.epochs.push_back({null_as_nan(e.at(0)), null_as_nan(e.at(1)), null_as_nan(e.at(2)),
                          e.size() > 3 ? null_as_nan(e.at(3)) : NAN});  // chrF since 2026-11-26
    return p;
  } catch (const json::exception& error) {
    fail("checkpoint '{}' has corrupt training progress: {}", path.string(), error.what());
  }
}

int64_t batch_tokens(const ParallelData& data, const text::Batch& batch) {
  int64_t tokens = 0;
  for (int64_t i : batch) tokens += static_cast<int64_t>(data.sources[i].size() + data.targets[i].size()) + 2;
  return tokens;
}

std::string format_duration(double seconds) {
  auto s = static_cast<int64_t>(std::max(0.0, seconds));
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

/// `values` summed over the group's ranks (unchanged without a group).
std::vector<double> sum_over_ranks(std::vector<double> values, distributed::ProcessGroup* group) {
  if (group == nullptr) return values;
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())}).to(group->device());
  group->all_reduce(t);
  return t.to(Device::cpu()).to_vector<double>();
}

/// Validation loss without label smoothing (so that exp(loss) is the perplexity). With a group, each
/// rank takes every world_size-th batch.
double validation_loss(models::Translator& translator, const ParallelData& data, int64_t max_tokens,
                       distributed::ProcessGroup* group) {
  models::Transformer& model = translator.model();
  NoGradGuard no_grad;
  double sum = 0, tokens = 0;
  std::vector<text::Batch> batches = text::make_batches(data.sources, data.targets, {.max_tokens = max_tokens}, 0);
  const size_t stride = group ? static_cast<size_t>(group->world_size()) : 1;
  for (size_t i = group ? static_cast<size_t>(group->rank()) : 0; i < batches.size(); i += stride) {
    models::TranslationBatch b = models::make_translation_batch(data.sources, data.targets, batches[i], model.device());
    Tensor loss = model.loss(model.forward(b.src, b.tgt_in), b.tgt_out, 0.0);
    sum += loss.item<double>() * static_cast<double>(b.target_tokens);
    tokens += static_cast<double>(b.target_tokens);
  }
  std::vector<double> totals = sum_over_ranks({sum, tokens}, group);
  return totals[0] / totals[1];
}

/// Target tokens of `batch` (<eos> included): the denominator of its mean loss.
int64_t target_tokens(const ParallelData& data, const text::Batch& batch) {
  int64_t tokens = 0;
  for (int64_t i : batch) tokens += static_cast<int64_t>(data.targets[i].size()) + 1;
  return tokens;
}

/// The seed of the dropout stream of share `share` of step `step`: a share draws the same masks
/// whichever rank trains it, so a run depends on the number of shares, not on the world size.
uint64_t share_seed(int64_t seed, int64_t step, int64_t share) {
  uint64_t x = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ull +
               static_cast<uint64_t>(share);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // SplitMix64's finaliser
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The loss chart above the BLEU and chrF chart, in one SVG.
std::string training_chart(const Progress& p) {
  Series train{"train loss", {}, {}}, valid{"valid loss", {}, {}}, epoch_train{"train loss (epoch)", {}, {}};
  Series bleu{"valid BLEU", {}, {}}, chrf{"valid chrF", {}, {}};
  for (auto [x, y] : p.train_curve) {
    train.x.push_back(x);
    train.y.push_back(y);
  }
  for (size_t e = 0; e < p.epochs.size(); ++e) {
    double x = static_cast<double>(e + 1);
    epoch_train.x.push_back(x);
    epoch_train.y.push_back(p.epochs[e].train_loss);
    valid.x.push_back(x);
    valid.y.push_back(p.epochs[e].valid_loss);
    bleu.x.push_back(x);
    bleu.y.push_back(p.epochs[e].bleu);
    chrf.x.push_back(x);
    chrf.y.push_back(p.epochs[e].chrf);
  }
  std::string top = line_chart_svg("Loss", "epoch", {train, epoch_train, valid});
  std::string bottom = line_chart_svg("Validation sacreBLEU and chrF (greedy, cased)", "epoch", {bleu, chrf});
  bottom.replace(bottom.find("<svg "), 5, "<svg y=\"420\" ");
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"840\">\n" + top + bottom + "</svg>\n";
}

/// Redraws one progress line on a terminal, or prints it every `log_every` steps otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(int64_t log_every) : tty_(isatty(fileno(stdout)) != 0), log_every_(log_every) {}
  void update(int64_t step, const std::string& text) {
    auto now = std::chrono::steady_clock::now();
    if (tty_) {
      if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;  // ~10 redraws a second
      last_draw_ = now;
      fmt::print("\r\033[K{}", text);
      std::fflush(stdout);
      drawn_ = true;
    } else if (step % log_every_ == 0) {
      fmt::print("{}\n", text);
      std::fflush(stdout);
    }
  }
  /// Ends a redrawn line before other output.
  void finish() {
    if (drawn_) fmt::print("\n");
    drawn_ = false;
  }

 private:
  bool tty_, drawn_ = false;
  int64_t log_every_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace

namespace {

/// The codecs of a fresh run: word vocabularies, or SentencePiece models learned from the training text.
std::pair<text::TextCodec, text::TextCodec> learn_codecs(const text::Corpus& train, const TrainingOptions& options) {
  if (options.units == TrainingOptions::Units::Words) {
    auto vocab_of = [&](const std::vector<std::vector<std::string>>& sentences) {
      text::TokenCounts counts;
      text::count_tokens(sentences, counts);
      return text::Vocab::build(counts, options.vocab);
    };
    return {text::TextCodec(vocab_of(train.sources), options.tokenizer),
            text::TextCodec(vocab_of(train.targets), options.tokenizer)};
  }
  if (!options.subword_model.empty()) {
    text::TextCodec both(text::SubwordModel::load(options.subword_model));
    return {both, both};
  }
  if (options.joint_subwords) {
    std::vector<std::string> text = train.source_text;
    text.insert(text.end(), train.target_text.begin(), train.target_text.end());
    text::TextCodec both(text::SubwordModel::train(text, options.subword));
    return {both, both};
  }
  return {text::TextCodec(text::SubwordModel::train(train.source_text, options.subword)),
          text::TextCodec(text::SubwordModel::train(train.target_text, options.subword))};
}

}  // namespace

models::Translator build_translator(const text::Corpus& train, const TrainingOptions& options) {
  auto [source, target] = learn_codecs(train, options);
  models::TransformerConfig config = options.model;
  config.src_vocab = source.size();
  config.tgt_vocab = target.size();
  config.shared_embeddings = source == target;
  return models::Translator(config, std::move(source), std::move(target));
}

namespace {

/// Cuts `ids` to max_length (0: no limit), counting each cut in `truncated` when given.
void truncate(std::vector<int64_t>& ids, int64_t max_length, int64_t* truncated) {
  if (max_length <= 0 || static_cast<int64_t>(ids.size()) <= max_length) return;
  ids.resize(static_cast<size_t>(max_length));
  if (truncated != nullptr) ++*truncated;
}

/// SentencePiece's seed for epoch `epoch`'s sampled segmentations of one side (0 source, 1 target):
/// share_seed's mix at negative steps, which dropout's streams never take.
uint32_t subword_sampling_seed(int64_t seed, int64_t epoch, int64_t side) {
  return static_cast<uint32_t>(share_seed(seed, -1 - epoch, side) >> 32);
}

/// `data`'s pairs encoded again with segmentations sampled for `epoch` (settings' subword sampling), cut
/// to max_length ids.
ParallelData sampled_pairs(const models::Translator& translator, const ParallelData& data,
                           const OptimSettings& settings, int64_t epoch, int64_t max_length) {
  const text::SubwordModel* source = translator.source().subwords();
  const text::SubwordModel* target = translator.target().subwords();
  MF_CHECK(source != nullptr && target != nullptr,
           "subword sampling needs subword vocabularies (SentencePiece) on both sides; this model has {} and {}",
           translator.source().describe(), translator.target().describe());
  MF_CHECK(data.source_text.size() == data.sources.size() && data.references.size() == data.targets.size(),
           "subword sampling needs the training pairs' lines (ParallelData::source_text and references, as "
           "encode_corpus keeps them): {} and {} lines for {} pairs", data.source_text.size(), data.references.size(),
           data.sources.size());
  const text::SubwordSampling sampling{.alpha = settings.subword_alpha, .nbest_size = settings.subword_nbest};
  ParallelData out;
  out.sources = source->sample_encode(data.source_text, sampling, subword_sampling_seed(settings.seed, epoch, 0));
  out.targets = target->sample_encode(data.references, sampling, subword_sampling_seed(settings.seed, epoch, 1));
  for (std::vector<int64_t>& ids : out.sources) truncate(ids, max_length, nullptr);
  for (std::vector<int64_t>& ids : out.targets) truncate(ids, max_length, nullptr);
  return out;
}

}  // namespace

ParallelData encode_corpus(const models::Translator& translator, const text::Corpus& corpus, int64_t max_length,
                           int64_t* truncated) {
  ParallelData data;
  const bool words = translator.source().words() != nullptr;
  auto encode = [&](const text::TextCodec& codec, const std::string& text) {
    std::vector<int64_t> ids = codec.encode(text);
    truncate(ids, max_length, truncated);
    return ids;
  };
  for (size_t i = 0; i < corpus.sources.size(); ++i) {
    if (words) {
      data.sources.push_back(translator.source().words()->encode(corpus.sources[i]));
      data.targets.push_back(translator.target().words()->encode(corpus.targets[i]));
    } else {
      data.sources.push_back(encode(translator.source(), corpus.source_text[i]));
      data.targets.push_back(encode(translator.target(), corpus.target_text[i]));
    }
  }
  data.references = corpus.target_text;
  if (!words) data.source_text = corpus.source_text;
  return data;
}

/// Translations (greedy, or beam search with `beam` > 1) of the first `limit` validation sentences (all for 0), scored as sacreBLEU and
/// chrF (cased, 13a) against their reference lines. With a group, each rank translates its shard and the
/// scores come from the counts summed over the ranks.
ValidationScores validation_scores(models::Translator& translator, const ParallelData& data, int64_t limit,
                                   distributed::ProcessGroup* group, int64_t beam) {
  size_t count = limit > 0 ? std::min(static_cast<size_t>(limit), data.sources.size()) : data.sources.size();
  auto [begin, end] = distributed::shard_range(count, group ? group->rank() : 0, group ? group->world_size() : 1);
  const std::vector<std::vector<int64_t>> sources(data.sources.begin() + static_cast<ptrdiff_t>(begin),
                                                  data.sources.begin() + static_cast<ptrdiff_t>(end));
  const std::vector<std::string> references(data.references.begin() + static_cast<ptrdiff_t>(begin),
                                            data.references.begin() + static_cast<ptrdiff_t>(end));
  std::vector<std::string> hypotheses;
  for (const auto& best :
       models::decode_sources(translator.model(), sources,
                              {.beam_size = beam, .workers = 0, .banned_ids = translator.banned_tokens()}))
    hypotheses.push_back(translator.decode_target(best.front().tokens));
  text::BleuScore bleu = text::corpus_sacrebleu(hypotheses, references);
  text::ChrfScore chrf = text::corpus_chrf(hypotheses, references);
  if (group != nullptr) {  // the counts are integers far below 2^53: exact as doubles
    std::vector<double> summed = {static_cast<double>(bleu.hypothesis_length),
                                  static_cast<double>(bleu.reference_length)};
    for (size_t n = 0; n < bleu.matches.size(); ++n) {
      summed.push_back(static_cast<double>(bleu.matches[n]));
      summed.push_back(static_cast<double>(bleu.totals[n]));
    }
    for (const text::ChrfOrderCounts& order : chrf.counts)
      summed.insert(summed.end(), {static_cast<double>(order.hypothesis), static_cast<double>(order.reference),
                                   static_cast<double>(order.matches)});
    summed = sum_over_ranks(summed, group);
    auto next = summed.begin();
    auto take = [&] { return static_cast<int64_t>(*next++); };
    bleu.hypothesis_length = take();
    bleu.reference_length = take();
    for (size_t n = 0; n < bleu.matches.size(); ++n) {
      bleu.matches[n] = take();
      bleu.totals[n] = take();
    }
    for (text::ChrfOrderCounts& order : chrf.counts) order = {.hypothesis = take(), .reference = take(),
                                                             .matches = take()};
    bleu = text::sacrebleu_from_counts(bleu);
    chrf = text::chrf_from_counts(chrf);
  }
  return {bleu.score, chrf.score};
}

std::filesystem::path beside(const std::filesystem::path& checkpoint, std::string_view suffix) {
  return checkpoint.parent_path() /
         (checkpoint.stem().string() + std::string(suffix) + checkpoint.extension().string());
}

namespace {

/// Epochs since the best validation BLEU of `epochs` (0 when the last is the best, or none is scored).
int64_t epochs_since_best(const std::vector<EpochRecord>& epochs) {
  int64_t best = -1;
  for (size_t e = 0; e < epochs.size(); ++e)
    if (std::isfinite(epochs[e].bleu) && (best < 0 || epochs[e].bleu > epochs[static_cast<size_t>(best)].bleu))
      best = static_cast<int64_t>(e);
  return best < 0 ? 0 : static_cast<int64_t>(epochs.size()) - 1 - best;
}

}  // namespace

int train_translator(models::Translator& translator, const ParallelData& train, const ParallelData& valid,
                     const TrainingOptions& options) {
  const OptimSettings& settings = options.optim;
  models::Transformer& model = translator.model();
  // Forward passes, their gradients and validation: the whole run but the optimizer's float32 steps,
  // which autocast leaves alone.
  AutocastGuard autocast(model.device().type, DType::BFloat16, options.autocast);
  std::vector<Tensor> params = model.parameters();
  optim::Adam adam(params, {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  optim::NoamLR schedule(adam, model.config().d_model, settings.warmup, settings.lr_factor);
  optim::TrainingState state{.model = &model, .optimizer = &adam, .scheduler = &schedule,
                             .generator = &default_generator()};

  MF_CHECK(options.accumulate >= 1, "train_translator: accumulate must be at least 1, got {}", options.accumulate);
  distributed::ProcessGroup* group = options.group.get();
  const int64_t rank = group ? group->rank() : 0;
  const bool leader = rank == 0;  // prints, saves and draws
  // A batch is one share on a process alone; else world size x accumulate shares, each with its own
  // dropout stream and its loss weighted by its tokens, so the shares' gradients sum to the batch's.
  const bool sharded = group != nullptr || options.accumulate > 1;
  const int64_t shares = (group ? group->world_size() : 1) * options.accumulate;

  Progress progress;
  if (options.resume) {  // every rank reads the checkpoint (it must be where each can read it)
    progress = parse_progress(optim::load_training_state(options.checkpoint, state), options.checkpoint, settings,
                              options.names);
    if (leader)
      fmt::print("resuming from '{}': epoch {}, {} batches done, step {}\n", options.checkpoint.string(),
                 progress.epoch + 1, progress.batch, schedule.last_epoch());
  }
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  if (group != nullptr) {
    distributed::DataParallelOptions data_parallel = options.data_parallel;
    data_parallel.reduce = distributed::ReduceOp::Sum;
    ddp = std::make_unique<distributed::DistributedDataParallel>(model, options.group, data_parallel);
  }
  std::unique_ptr<distributed::ZeroRedundancyOptimizer> zero;
  if (group != nullptr && options.shard_optimizer)
    zero = std::make_unique<distributed::ZeroRedundancyOptimizer>(adam, options.group);
  // The step the checkpoint on disk holds (-1: none), for the message when training diverges.
  int64_t saved_step = options.resume ? schedule.last_epoch() : -1;
  auto save = [&] {
    if (options.checkpoint.empty()) return;
    if (zero) zero->consolidate_state(0);  // the whole state on rank 0, in the unsharded format
    if (leader) translator.save(options.checkpoint, state, {{kProgressKey, progress_json(progress, settings)}});
    if (zero) zero->shard_state();
    saved_step = schedule.last_epoch();
  };
  bool stop_requested = false;  // Ctrl-C on any rank (the ranks agree at each step)
  const bool validate = !valid.sources.empty();
  // Every rank reads the same scores (summed over the ranks), so all stop together.
  auto patience_exhausted = [&] {
    return validate && options.patience > 0 && epochs_since_best(progress.epochs) >= options.patience;
  };
  // Where epoch `e`'s model is kept for averaging (1-based, as the log counts epochs).
  auto epoch_model = [&](int64_t e) { return beside(options.checkpoint, format_message(".epoch{}", e)); };
  // The mean of the last average_last epochs' models (those on disk), saved and validated by rank 0.
  auto average_last_epochs = [&] {
    std::vector<std::filesystem::path> epochs;
    for (int64_t e = std::max<int64_t>(1, progress.epoch - options.average_last + 1); e <= progress.epoch; ++e)
      if (std::filesystem::exists(epoch_model(e))) epochs.push_back(epoch_model(e));
    if (epochs.empty()) return;
    const std::filesystem::path averaged = beside(options.checkpoint, ".averaged");
    models::Translator mean = models::Translator::average(epochs);
    mean.save(averaged);
    std::string summary = format_message("averaged the last {} epochs' models into '{}'", epochs.size(),
                                         averaged.string());
    if (validate) {
      mean.model().to(model.device());
      const ValidationScores scores = validation_scores(mean, valid, options.bleu_sentences, nullptr,
                                                        options.valid_beam);
      summary += format_message(": BLEU {:.2f}, chrF {:.2f}", scores.bleu, scores.chrf);
    }
    fmt::print("{}\n", summary);
  };

  const ParallelData* pairs = &train;  // the epoch's training pairs: `train`, or its sampled segmentations
  // This rank's shares of `batch`, forward and backward (the gradients of all but the last stay local):
  // returns the sum of their mean losses weighted by their target tokens.
  auto backward_shares = [&](const text::Batch& batch, int64_t batch_target_tokens) {
    double weighted = 0;
    for (int64_t a = 0; a < options.accumulate; ++a) {
      const int64_t share = rank * options.accumulate + a;
      auto [begin, end] = distributed::shard_range(batch.size(), share, shares);
      if (begin == end) continue;  // a batch with fewer sentences than shares; the gradient sync still runs
      manual_seed(share_seed(settings.seed, schedule.last_epoch() + 1, share));
      models::TranslationBatch b = models::make_translation_batch(
          pairs->sources, pairs->targets, text::Batch(batch.begin() + static_cast<ptrdiff_t>(begin),
                                                    batch.begin() + static_cast<ptrdiff_t>(end)), model.device());
      Tensor loss = model.loss(model.forward(b.src, b.tgt_in), b.tgt_out, settings.label_smoothing);
      const double tokens = static_cast<double>(b.target_tokens);
      weighted += loss.item<double>() * tokens;
      Tensor share_loss = loss * (tokens / static_cast<double>(batch_target_tokens));
      if (ddp && a + 1 < options.accumulate) {
        auto local = ddp->no_sync();
        share_loss.backward();
      } else {
        share_loss.backward();
      }
    }
    return weighted;
  };

  StopSignalScope stop_signals;
  ProgressLine line(options.log_every);
  const auto start = std::chrono::steady_clock::now();
  int64_t steps_this_run = 0, tokens_this_run = 0;
  bool stopped = false;  // by Ctrl-C or max_steps, with the checkpoint saved
  auto should_stop = [&] {
    return stop_requested || (options.max_steps > 0 && steps_this_run >= options.max_steps);
  };

  while (progress.epoch < options.epochs && !stopped && !patience_exhausted()) {
    // Under subword sampling each epoch trains on its own segmentations of the pairs.
    ParallelData sampled;
    if (settings.subword_alpha > 0)
      sampled = sampled_pairs(translator, train, settings, progress.epoch, model.config().max_len - 1);
    pairs = settings.subword_alpha > 0 ? &sampled : &train;
    std::vector<text::Batch> batches = text::make_batches(pairs->sources, pairs->targets,
                                                          {.max_tokens = settings.max_tokens,
                                                           .pool_size = settings.batch_pool},
                                                          static_cast<uint64_t>(settings.seed + progress.epoch));
    const auto n_batches = static_cast<int64_t>(batches.size());
    model.train();
    for (; progress.batch < n_batches; ++progress.batch) {
      const text::Batch& batch = batches[static_cast<size_t>(progress.batch)];
      // A non-finite loss or gradient would poison the parameters and the optimizer state for good:
      // stop before the update, so the checkpoint on disk keeps the last state that was saved.
      auto diverged = [&](const std::string& what) {
        line.finish();
        std::string kept = saved_step < 0 ? std::string("no checkpoint was saved")
                                          : fmt::format("'{}' still holds step {}", options.checkpoint.string(),
                                                        saved_step);
        const SettingNames& names = options.names;
        fail("{} at step {} (epoch {}, batch {}/{}); stopped before updating the model, {}. Lower the learning "
             "rate ({}, {}), check {}, or {} to name the op that first makes a NaN or inf", what,
             schedule.last_epoch() + 1, progress.epoch + 1, progress.batch + 1, n_batches, kept,
             names("optim.lr_factor"), names("optim.warmup"), names("optim.clip"), names.detect_anomaly);
      };
      double loss_value = 0;
      int64_t batch_target_tokens = 0;
      if (!sharded) {
        models::TranslationBatch b =
            models::make_translation_batch(pairs->sources, pairs->targets, batch, model.device());
        Tensor loss = model.loss(model.forward(b.src, b.tgt_in), b.tgt_out, settings.label_smoothing);
        loss_value = loss.item<double>();  // the step's one wait for the device
        if (!std::isfinite(loss_value)) diverged(format_message("the training loss is {}", loss_value));
        loss.backward();
        batch_target_tokens = b.target_tokens;
        stop_requested = g_interrupted != 0;
      } else {
        batch_target_tokens = target_tokens(*pairs, batch);
        const double weighted_loss = backward_shares(batch, batch_target_tokens);
        // First the gradients: a rank may start its last buckets only here (one whose share left a
        // parameter without a gradient), and every rank must issue the collectives in one order.
        if (ddp) ddp->finish_gradient_sync();
        // Then the ranks agree on the batch's loss (and so on stopping when it is not finite) and on
        // Ctrl-C.
        std::vector<double> totals = sum_over_ranks({weighted_loss, g_interrupted ? 1.0 : 0.0}, group);
        loss_value = totals[0] / static_cast<double>(batch_target_tokens);
        stop_requested = totals[1] > 0;
        if (!std::isfinite(loss_value)) diverged(format_message("the training loss is {}", loss_value));
      }
      if (settings.clip > 0) {
        double norm = optim::clip_grad_norm_(params, settings.clip);
        if (!std::isfinite(norm)) diverged(format_message("the gradient norm is {} (loss {:.3f})", norm, loss_value));
      }
      double lr = schedule.get_last_lr()[0];
      if (zero)
        zero->step();
      else
        adam.step();
      schedule.step();
      adam.zero_grad();

      if (options.on_step) options.on_step(schedule.last_epoch(), loss_value);
      double value = loss_value * static_cast<double>(batch_target_tokens);
      progress.loss_sum += value;
      progress.loss_tokens += batch_target_tokens;
      progress.curve_sum += value;
      progress.curve_tokens += batch_target_tokens;
      ++steps_this_run;
      tokens_this_run += batch_tokens(*pairs, batch);
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double remaining_steps = static_cast<double>(n_batches - progress.batch - 1 +
                                                   (options.epochs - progress.epoch - 1) * n_batches);
      if (leader)
        line.update(steps_this_run,
                    format_message("epoch {}/{} step {}/{} loss {:.3f} {:.0f} tok/s lr {:.2e} ETA {}",
                                   progress.epoch + 1, options.epochs, progress.batch + 1, n_batches, loss_value,
                                   static_cast<double>(tokens_this_run) / elapsed, lr,
                                   format_duration(elapsed / static_cast<double>(steps_this_run) * remaining_steps)));
      if (schedule.last_epoch() % options.log_every == 0 || progress.batch + 1 == n_batches) {
        progress.train_curve.emplace_back(static_cast<double>(progress.epoch) +
                                              static_cast<double>(progress.batch + 1) / static_cast<double>(n_batches),
                                          progress.curve_sum / static_cast<double>(progress.curve_tokens));
        progress.curve_sum = 0;
        progress.curve_tokens = 0;
      }
      if (should_stop() && progress.batch + 1 < n_batches) {
        ++progress.batch;  // the checkpoint resumes after this step
        stopped = true;
        break;
      }
    }
    if (stopped) break;

    EpochRecord record{progress.loss_sum / static_cast<double>(std::max<int64_t>(1, progress.loss_tokens)), NAN, NAN,
                       NAN};
    line.finish();
    if (validate) {
      model.eval();
      record.valid_loss = validation_loss(translator, valid, settings.max_tokens, group);
      const ValidationScores scores =
          validation_scores(translator, valid, options.bleu_sentences, group, options.valid_beam);
      record.bleu = scores.bleu;
      record.chrf = scores.chrf;
    }
    progress.epochs.push_back(record);
    progress.loss_sum = 0;
    progress.loss_tokens = 0;
    if (leader && !options.quiet_epochs) {
      std::string summary = format_message("epoch {}: train loss {:.3f}", progress.epoch + 1, record.train_loss);
      if (validate)
        summary += format_message(", valid loss {:.3f}, perplexity {:.2f}, BLEU {:.2f}, chrF {:.2f}", record.valid_loss,
                                  std::exp(record.valid_loss), record.bleu, record.chrf);
      fmt::print("{}\n", summary);
    }
    ++progress.epoch;
    progress.batch = 0;
    save();
    if (leader && !options.checkpoint.empty()) {  // the model alone: translatable, not resumable
      if (validate && options.patience > 0 && epochs_since_best(progress.epochs) == 0)
        translator.save(beside(options.checkpoint, ".best"));
      if (options.average_last > 0) {
        translator.save(epoch_model(progress.epoch));
        if (progress.epoch > options.average_last)
          std::filesystem::remove(epoch_model(progress.epoch - options.average_last));
      }
    }
    stopped = should_stop() && progress.epoch < options.epochs;
  }
  if (leader && patience_exhausted() && progress.epoch < options.epochs) {
    fmt::print("validation BLEU has not improved for {} epochs ({}): stopped early", options.patience,
               options.names("patience"));
    if (!options.checkpoint.empty())
      fmt::print("; the best model is '{}'", beside(options.checkpoint, ".best").string());
    fmt::print("\n");
  }
  if (leader && !stopped && options.average_last > 0 && !options.checkpoint.empty()) average_last_epochs();
  line.finish();
  if (stopped) {
    if (progress.batch > 0) save();  // mid-epoch; an epoch end was saved above
    const SettingNames& names = options.names;
    std::string why = stop_requested ? "interrupted" : "stopped after " + names("max_steps");
    if (leader && options.checkpoint.empty())
      fmt::print("{}; no checkpoint was asked for ({}), nothing saved\n", why, names("checkpoint"));
    else if (leader)
      fmt::print("{}: checkpoint saved to '{}' (continue with {})\n", why, options.checkpoint.string(),
                 names("resume"));
  }
  const int status = stopped && stop_requested ? 130 : 0;
  if (leader && !options.plot.empty()) {
    write_file_atomic(options.plot, training_chart(progress), "training chart");
    fmt::print("training curves written to '{}'\n", options.plot.string());
  }
  if (group != nullptr) group->barrier();  // no rank returns before rank 0's files are on disk
  return status;
}

}  // namespace mf::train
