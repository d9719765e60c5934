#include "optim/training_state.h"

#include "nn/checkpoint.h"

#include <nlohmann/json.hpp>

namespace mf::optim {
namespace {

constexpr const char* kFormat = "miniflow.format";
constexpr const char* kFormatName = "training-state-1";
constexpr const char* kOptimizer = "miniflow.optimizer";
constexpr const char* kScheduler = "miniflow.scheduler";
constexpr const char* kPlateau = "miniflow.plateau";
constexpr const char* kGenerator = "miniflow.generator";
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";

/// The entries of `tensors` named prefix + rest, as rest -> tensor.
nn::StateDict strip_prefix(const nn::StateDict& tensors, const std::string& prefix) {
  nn::StateDict out;
  for (const nn::NamedTensor& entry : tensors)
    if (entry.name.starts_with(prefix)) out.push_back({entry.name.substr(prefix.size()), entry.tensor});
  return out;
}

const std::string& required(const SafetensorsMetadata& metadata, const char* key, const std::filesystem::path& path) {
  auto it = metadata.find(key);
  MF_CHECK(it != metadata.end(), "training state '{}' has no '{}' entry (was it saved with that piece?)",
           path.string(), key);
  return it->second;
}

}  // namespace

void save_training_state(const std::filesystem::path& path, const TrainingState& state,
                         const SafetensorsMetadata& extra) {
  MF_CHECK(state.model != nullptr, "save_training_state: no model given for '{}'", path.string());
  SafetensorsMetadata metadata;
  for (const auto& [key, value] : extra) {
    MF_CHECK(!key.starts_with("miniflow."), "save_training_state: metadata key '{}' is reserved", key);
    metadata[key] = value;
  }
  metadata[kFormat] = kFormatName;
  nn::StateDict tensors;
  for (nn::NamedTensor& entry : state.model->state_dict()) tensors.push_back({kModelPrefix + entry.name, entry.tensor});
  if (state.optimizer) {
    OptimizerState optimizer = state.optimizer->state_dict();
    for (nn::NamedTensor& entry : optimizer.tensors) tensors.push_back({kOptimizerPrefix + entry.name, entry.tensor});
    metadata[kOptimizer] = optimizer.json;
  }
  if (state.scheduler) metadata[kScheduler] = state.scheduler->state_json();
  if (state.plateau) metadata[kPlateau] = state.plateau->state_json();
  if (state.generator)
    metadata[kGenerator] = nlohmann::json{{"seed", state.generator->seed()}, {"offset", state.generator->offset()}}.dump();
  nn::save_tensors(path, tensors, metadata);
}

SafetensorsMetadata load_training_state(const std::filesystem::path& path, const TrainingState& state) {
  MF_CHECK(state.model != nullptr, "load_training_state: no model given for '{}'", path.string());
  nn::TensorFile file = nn::load_tensors(path);
  auto format = file.metadata.find(kFormat);
  MF_CHECK(format != file.metadata.end() && format->second == kFormatName,
           "'{}' is not a miniflow training state (metadata '{}' is missing or not '{}')", path.string(), kFormat,
           kFormatName);
  // Parse every piece before changing anything, so a bad file leaves the caller's objects intact.
  nn::StateDict model = strip_prefix(file.tensors, kModelPrefix);
  OptimizerState optimizer{strip_prefix(file.tensors, kOptimizerPrefix), ""};
  if (state.optimizer) optimizer.json = required(file.metadata, kOptimizer, path);
  std::optional<std::pair<uint64_t, uint64_t>> generator;
  if (state.generator) {
    nlohmann::json j = nlohmann::json::parse(required(file.metadata, kGenerator, path), nullptr, false);
    MF_CHECK(j.is_object() && j.contains("seed") && j.contains("offset") && j["seed"].is_number_unsigned() &&
                 j["offset"].is_number_unsigned(),
             "training state '{}': malformed '{}' entry", path.string(), kGenerator);
    generator = {j["seed"].get<uint64_t>(), j["offset"].get<uint64_t>()};
  }
  try {
    state.model->load_state_dict(model);
    if (state.optimizer) state.optimizer->load_state_dict(optimizer);
    if (state.scheduler) state.scheduler->load_state_json(required(file.metadata, kScheduler, path));
    if (state.plateau) state.plateau->load_state_json(required(file.metadata, kPlateau, path));
  } catch (const Error& error) {
    fail("cannot resume from '{}': {}", path.string(), error.what());
  }
  if (generator) {
    state.generator->manual_seed(generator->first);
    state.generator->set_offset(generator->second);
  }
  SafetensorsMetadata extra;
  for (const auto& [key, value] : file.metadata)
    if (!key.starts_with("miniflow.")) extra[key] = value;
  return extra;
}

}  // namespace mf::optim
