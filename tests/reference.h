// PyTorch's reference numbers for the tiny Transformer (tests/data/transformer_tiny.safetensors;
// tests/data/README.md says where it comes from).
#pragma once

#include <doctest/doctest.h>

#include "miniflow.h"

#include <map>
#include <string>

namespace mf::testing {

inline constexpr const char* kReferencePath = "tests/data/transformer_tiny.safetensors";

inline const nn::TensorFile& reference_file() {
  static const nn::TensorFile file = nn::load_tensors(kReferencePath);
  return file;
}

/// Every tensor of the reference file by name (float64 and int64, as stored).
inline const std::map<std::string, Tensor>& reference_tensors() {
  static const std::map<std::string, Tensor> tensors = [] {
    std::map<std::string, Tensor> out;
    for (const nn::NamedTensor& entry : reference_file().tensors) out.emplace(entry.name, entry.tensor);
    return out;
  }();
  return tensors;
}

/// The file's `config` metadata: the model and optimiser settings as JSON text.
inline const std::string& reference_config_json() { return reference_file().metadata.at("config"); }

inline const Tensor& reference(const std::string& name) {
  auto it = reference_tensors().find(name);
  REQUIRE_MESSAGE(it != reference_tensors().end(), "reference tensor '" << name << "' is missing");
  return it->second;
}

/// The reference tensors named prefix + key, as a state dict keyed by `key`.
inline nn::StateDict reference_with_prefix(const std::string& prefix) {
  nn::StateDict state;
  for (const auto& [name, t] : reference_tensors())
    if (name.starts_with(prefix)) state.push_back({name.substr(prefix.size()), t});
  return state;
}

}  // namespace mf::testing
