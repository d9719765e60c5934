// Everything needed to resume training exactly, in one safetensors file (written atomically): the
// model's tensors under "model.", the optimizer's under "optimizer.", and in the metadata the
// optimizer's options and step counts, the scheduler's position, the random generator's position, and
// any entries of the caller's own (epoch, vocabularies, ...).
#pragma once

#include "core/generator.h"
#include "core/safetensors.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

#include <filesystem>

namespace mf::optim {

/// The pieces of a training run to save or restore; any pointer but `model` may be null.
struct TrainingState {
  nn::Module* model = nullptr;
  Optimizer* optimizer = nullptr;
  LRScheduler* scheduler = nullptr;
  ReduceLROnPlateau* plateau = nullptr;
  /// The stream dropout and data shuffling draw from (default_generator() for most programs).
  Generator* generator = nullptr;
};

/// Writes `state` and the caller's `extra` metadata to `path` atomically (an interrupted save never
/// leaves a half-written file, and the previous file survives a failed one). Keys of `extra` must
/// not start with "miniflow.", which this function uses.
void save_training_state(const std::filesystem::path& path, const TrainingState& state,
                         const SafetensorsMetadata& extra = {});

/// Restores every non-null piece of `state` from `path`, strictly: missing, unexpected or mis-shaped
/// tensors, or a piece the file lacks, throw mf::Error naming the file. The file is read and checked
/// before anything changes, but a piece rejected late (the optimizer after the model) leaves the
/// earlier pieces restored. Returns the caller's extra metadata.
SafetensorsMetadata load_training_state(const std::filesystem::path& path, const TrainingState& state);

}  // namespace mf::optim
