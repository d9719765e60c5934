// Checkpoints: tensors and modules to and from safetensors files (see core/safetensors.h for the
// byte format and its validation).
//
// Saving copies each tensor to a contiguous CPU buffer (views and device tensors included) and
// writes the file atomically, so a failed save never damages the previous checkpoint. Loading
// validates the whole file first; loading into a module is strict by default: every missing,
// unexpected, mis-shaped or mis-typed key is listed in one mf::Error naming the file, and the
// module is left unchanged.
#pragma once

#include "core/safetensors.h"
#include "core/tensor.h"
#include "nn/module.h"

#include <filesystem>
#include <string>

namespace mf::nn {

/// A record holding a contiguous CPU copy of `tensor` (any strides, any device), with its dtype and
/// shape. Not recorded by autograd.
TensorRecord to_record(const std::string& name, const Tensor& tensor);

/// A new tensor on `device` holding the record's elements (same dtype and shape).
Tensor from_record(const TensorRecord& record, Device device = Device::cpu());

/// Writes `tensors` (names must be unique) and `metadata` to a safetensors file, atomically.
/// Throws mf::Error naming the path when the file cannot be written.
void save_tensors(const std::filesystem::path& path, const StateDict& tensors,
                  const SafetensorsMetadata& metadata = {});

/// What a safetensors file holds, as tensors.
struct TensorFile {
  StateDict tensors;  // in file order (ascending data offset)
  SafetensorsMetadata metadata;
};

/// Reads and validates a safetensors file, placing its tensors on `device`. Throws mf::Error naming
/// the path for any fault (truncation, bad header, unknown dtype, bad offsets, ...).
TensorFile load_tensors(const std::filesystem::path& path, Device device = Device::cpu());

/// Saves the module's state_dict() (parameters and buffers by dotted name).
void save(const Module& module, const std::filesystem::path& path, const SafetensorsMetadata& metadata = {});

/// Loads a checkpoint into `module`'s parameters and buffers (keeping their devices). With strict,
/// any missing, unexpected or mismatched (shape or dtype) key throws one mf::Error naming the file
/// and listing them all, and nothing is changed; otherwise matching keys load and the report lists
/// the rest.
LoadReport load(Module& module, const std::filesystem::path& path, bool strict = true);

}  // namespace mf::nn
