#include "models/translation.h"

#include "core/graph.h"
#include "nn/checkpoint.h"
#include "nn/init.h"
#include "ops/functional.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>

namespace mf::models {
namespace {

constexpr const char* kFormatKey = "translation.format";
constexpr const char* kFormat = "miniflow-translator-1";
// How much bigger than the tensors in a checkpoint the model its config describes may be.
constexpr int64_t kMaxGrowth = 2;

/// Whether a checkpoint's tensor name is a quantized layer's scales (nn::quantize_int8): an int8
/// checkpoint's mark.
bool holds_int8_scales(const std::string& name) { return name.ends_with("weight_scale"); }
// Each side's text codec (text::TextCodec::to_json); the target's is kSameAsSource when both share one.
constexpr const char* kSourceKey = "translation.source";
constexpr const char* kTargetKey = "translation.target";
constexpr const char* kSameAsSource = R"({"kind":"same as source"})";

/// Rows padded to the longest with <pad>: [rows, longest] int64.
Tensor pad_rows(const std::vector<std::vector<int64_t>>& rows, Device device) {
  size_t longest = 1;
  for (const auto& row : rows) longest = std::max(longest, row.size());
  std::vector<int64_t> flat(rows.size() * longest, text::kPadId);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), flat.begin() + r * longest);
  return from_vector(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)}, device);
}

text::TokenizerOptions tokenizer_from_json(const std::string& text, const std::filesystem::path& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  MF_CHECK(j.is_object() && j.contains("lowercase") && j["lowercase"].is_boolean() && j.contains("split_punctuation") &&
               j["split_punctuation"].is_boolean(),
           "checkpoint '{}': malformed tokenizer settings {}", path.string(), text.substr(0, 200));
  return {.lowercase = j["lowercase"].get<bool>(), .split_punctuation = j["split_punctuation"].get<bool>()};
}

const std::string& entry(const SafetensorsMetadata& metadata, const char* key, const std::filesystem::path& path) {
  auto it = metadata.find(key);
  MF_CHECK(it != metadata.end(), "checkpoint '{}' has no '{}' entry", path.string(), key);
  return it->second;
}

/// The source and target codecs a checkpoint holds; checkpoints written before subword models (word
/// vocabularies per side and one tokenizer, under their own keys) load as word codecs.
std::pair<text::TextCodec, text::TextCodec> codecs(const SafetensorsMetadata& metadata,
                                                   const std::filesystem::path& path) {
  const std::string origin = fmt::format("checkpoint '{}'", path.string());
  if (metadata.contains(kSourceKey)) {
    text::TextCodec source = text::TextCodec::from_json(entry(metadata, kSourceKey, path), origin + " (source)");
    const std::string& target = entry(metadata, kTargetKey, path);
    if (target == kSameAsSource) return {source, source};
    return {std::move(source), text::TextCodec::from_json(target, origin + " (target)")};
  }
  const text::TokenizerOptions tokenizer =
      tokenizer_from_json(entry(metadata, "translation.tokenizer", path), path);
  auto words = [&](const char* key, const char* side) {
    return text::TextCodec(
        text::Vocab::from_json(entry(metadata, key, path), fmt::format("{} ({} vocabulary)", path.string(), side)),
        tokenizer);
  };
  return {words("translation.src_vocab", "source"), words("translation.tgt_vocab", "target")};
}

}  // namespace

TranslationBatch make_translation_batch(const std::vector<std::vector<int64_t>>& sources,
                                        const std::vector<std::vector<int64_t>>& targets,
                                        std::span<const int64_t> indices, Device device) {
  std::vector<std::vector<int64_t>> src, tgt_in, tgt_out;
  int64_t target_tokens = 0;
  for (int64_t i : indices) {
    MF_CHECK(i >= 0 && i < static_cast<int64_t>(sources.size()) && sources.size() == targets.size(),
             "make_translation_batch: example {} is out of range for {} pairs", i, sources.size());
    src.push_back(sources[i]);
    src.back().push_back(text::kEosId);
    tgt_in.push_back({text::kSosId});
    tgt_in.back().insert(tgt_in.back().end(), targets[i].begin(), targets[i].end());
    tgt_out.push_back(targets[i]);
    tgt_out.back().push_back(text::kEosId);
    target_tokens += static_cast<int64_t>(tgt_out.back().size());
  }
  return {pad_rows(src, device), pad_rows(tgt_in, device), pad_rows(tgt_out, device), target_tokens};
}

Translator::Translator(const TransformerConfig& config, text::TextCodec source, text::TextCodec target)
    : source_(std::move(source)), target_(std::move(target)) {
  MF_CHECK(config.src_vocab == source_.size() && config.tgt_vocab == target_.size(),
           "Translator: config vocabularies {} / {} do not match the codecs' sizes {} / {}", config.src_vocab,
           config.tgt_vocab, source_.size(), target_.size());
  MF_CHECK(!config.shared_embeddings || source_ == target_,
           "Translator: shared embeddings need the source and target vocabularies to be the same");
  model_ = std::make_shared<Transformer>(config);
}

Translator::Translator(const TransformerConfig& config, text::Vocab src_vocab, text::Vocab tgt_vocab,
                       text::TokenizerOptions tokenizer)
    : Translator(config, text::TextCodec(std::move(src_vocab), tokenizer),
                 text::TextCodec(std::move(tgt_vocab), tokenizer)) {}

Tensor Translator::encode_sources(const std::vector<std::string>& sentences) const {
  std::vector<std::vector<int64_t>> sources;
  for (const std::string& sentence : sentences) sources.push_back(source_.encode(sentence));
  std::vector<int64_t> rows(sources.size());
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return pad_sources(sources, rows, model_->config().max_len, model_->device());
}

std::vector<std::vector<Translation>> Translator::translate(const std::vector<std::string>& sentences,
                                                             const DecodingOptions& options,
                                                             const std::vector<std::string>& target_prefixes) {
  std::vector<std::vector<int64_t>> sources;
  for (const std::string& sentence : sentences) sources.push_back(source_.encode(sentence));
  DecodingOptions encoded = options;
  encoded.banned_ids = banned_tokens();
  for (const std::string& prefix : target_prefixes) encoded.target_prefixes.push_back(target_.encode(prefix));
  std::vector<std::vector<Translation>> out;
  for (const auto& hypotheses : decode_sources(models(), sources, encoded)) {
    out.emplace_back();
    for (const generation::Hypothesis& h : hypotheses) {
      const bool ended = !h.tokens.empty() && h.tokens.back() == text::kEosId;
      out.back().push_back({.text = decode_target(h.tokens),
                            .score = h.score,
                            .ids = std::vector<int64_t>(h.tokens.begin(), h.tokens.end() - (ended ? 1 : 0))});
    }
  }
  return out;
}

std::vector<TargetScore> Translator::score(const std::vector<std::string>& sources,
                                          const std::vector<std::string>& targets, const ScoringOptions& options) {
  std::vector<std::vector<int64_t>> source_ids, target_ids;
  for (const std::string& sentence : sources) source_ids.push_back(source_.encode(sentence));
  for (const std::string& sentence : targets) target_ids.push_back(target_.encode(sentence));
  return score_targets(models(), source_ids, target_ids, options);
}

std::vector<int64_t> Translator::banned_tokens() const {
  std::vector<int64_t> banned = {text::kPadId, text::kSosId};
  if (target_.spells_everything()) banned.push_back(text::kUnkId);
  const std::vector<int64_t> controls = target_.control_character_ids();
  banned.insert(banned.end(), controls.begin(), controls.end());
  return banned;
}

std::vector<WordAlignment> Translator::align(const std::vector<std::string>& sources,
                                            const std::vector<std::vector<int64_t>>& targets, int64_t layer,
                                            const ScoringOptions& batching) {
  std::vector<std::vector<int64_t>> source_ids;
  for (const std::string& sentence : sources) source_ids.push_back(source_.encode(sentence));
  const std::vector<Tensor> attention = target_cross_attention(*model_, source_ids, targets, layer, batching);
  std::vector<WordAlignment> out;
  for (size_t i = 0; i < sources.size(); ++i)
    out.push_back(word_alignment(attention[i], source_.word_indices(source_ids[i]), target_.word_indices(targets[i])));
  return out;
}

std::vector<std::string> Translator::translate_greedy(const std::vector<std::string>& sentences,
                                                      int64_t max_new_tokens) {
  std::vector<std::string> out;
  for (auto& translations : translate(sentences, {.max_new_tokens = max_new_tokens}))
    out.push_back(std::move(translations.front().text));
  return out;
}

text::Lexicon Translator::train_lexicon(const text::Corpus& corpus, const text::LexiconOptions& options) const {
  std::vector<std::vector<int64_t>> sources, targets;
  for (const std::string& line : corpus.source_text) sources.push_back(source_.encode(line));
  for (const std::string& line : corpus.target_text) targets.push_back(target_.encode(line));
  return text::Lexicon::train(sources, targets, options, target_.ids_by_frequency());
}

void Translator::save(const std::filesystem::path& path, const optim::TrainingState& training,
                      const SafetensorsMetadata& extra) const {
  SafetensorsMetadata metadata = extra;
  metadata[kFormatKey] = kFormat;
  metadata["translation.config"] = model_->config().to_json();
  metadata[kSourceKey] = source_.to_json();
  // A vocabulary shared by both sides (one subword model's bytes, say) is stored once.
  metadata[kTargetKey] = target_ == source_ ? kSameAsSource : target_.to_json();
  optim::TrainingState state = training;
  state.model = model_.get();
  optim::save_training_state(path, state, metadata);
}

Translator Translator::load(const std::filesystem::path& path) {
  nn::TensorFile file = nn::load_tensors(path);
  auto format = file.metadata.find(kFormatKey);
  MF_CHECK(format != file.metadata.end() && format->second == kFormat,
           "'{}' is not a miniflow translation checkpoint (metadata '{}' is missing or not '{}')", path.string(),
           kFormatKey, kFormat);
  auto [source, target] = codecs(file.metadata, path);
  nn::StateDict weights;
  for (nn::NamedTensor& t : file.tensors)
    if (t.name.starts_with("model.")) weights.push_back({t.name.substr(6), t.tensor});
  try {
    const TransformerConfig config = TransformerConfig::from_json(entry(file.metadata, "translation.config", path));
    // A config from another run's file still gets built, so the error can list every mismatched
    // tensor; one describing a model much bigger than the tensors here can only be corrupt, and
    // building it would cost memory the file never held.
    int64_t held = 0;
    for (const nn::NamedTensor& t : weights) held += t.tensor.numel();
    MF_CHECK(config.parameter_count() / kMaxGrowth <= held,
             "its config describes a model of {} parameters, over {} times the {} its tensors hold",
             config.parameter_count(), kMaxGrowth, held);
    // Every parameter is about to be replaced by the file's (load_state_dict refuses a missing one).
    Translator translator = [&] {
      nn::init::SkipInitGuard no_draws;
      return Translator(config, std::move(source), std::move(target));
    }();
    if (std::any_of(weights.begin(), weights.end(), [](const nn::NamedTensor& t) { return holds_int8_scales(t.name); }))
      translator.quantize_int8();
    translator.model_->load_state_dict(weights);
    translator.model_->eval();
    return translator;
  } catch (const Error& error) {
    fail("checkpoint '{}' does not fit its own config: {}", path.string(), error.what());
  }
}

void Translator::add_ensemble_member(Translator member) {
  MF_CHECK(member.source_ == source_ && member.target_ == target_,
           "an ensemble member must have the same vocabularies as the first model: its {} differs",
           member.source_ == source_ ? "target side" : "source side");
  MF_CHECK(member.ensemble_members_.empty(), "an ensemble member must be a single model, not an ensemble itself");
  check_ensemble("Translator::add_ensemble_member", {model_.get(), member.model_.get()});
  ensemble_members_.push_back(std::move(member.model_));
}

Ensemble Translator::models() const {
  Ensemble all{model_.get()};
  for (const auto& member : ensemble_members_) all.push_back(member.get());
  return all;
}

void Translator::quantize_int8() {
  for (Transformer* model : models()) nn::quantize_int8(*model);
}

bool Translator::is_quantized() const { return nn::is_quantized_int8(*model_); }

Translator Translator::average(const std::vector<std::filesystem::path>& paths) {
  MF_CHECK(!paths.empty(), "averaging checkpoints: no checkpoint given");
  Translator mean = load(paths.front());
  MF_CHECK(!mean.is_quantized(), "averaging checkpoints: '{}' holds int8 weights; average the float32 checkpoints, "
           "then quantize the mean", paths.front().string());
  NoGradGuard no_grad;
  nn::StateDict state = mean.model_->state_dict();
  std::vector<Tensor> sums;
  for (const nn::NamedTensor& t : state) sums.push_back(t.tensor.to(DType::Float64));
  for (size_t i = 1; i < paths.size(); ++i) {
    const Translator other = load(paths[i]);
    auto check_same = [&](bool same, std::string_view what) {
      MF_CHECK(same, "averaging checkpoints: '{}' has another {} than '{}'", paths[i].string(), what,
               paths.front().string());
    };
    check_same(other.model_->config().to_json() == mean.model_->config().to_json(), "model config");
    check_same(other.source_ == mean.source_ && other.target_ == mean.target_, "vocabulary or tokenizer");
    check_same(!other.is_quantized(), "precision (it holds int8 weights)");
    const nn::StateDict others = other.model_->state_dict();  // the same names in the same order: same config
    for (size_t j = 0; j < sums.size(); ++j) sums[j] = sums[j] + others[j].tensor.to(DType::Float64);
  }
  for (size_t j = 0; j < sums.size(); ++j)
    state[j].tensor.copy_((sums[j] / static_cast<double>(paths.size())).to(state[j].tensor.dtype()));
  return mean;
}

}  // namespace mf::models
