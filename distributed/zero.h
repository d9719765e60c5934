// ZeRO stage 1 (Rajbhandari et al., 2020; PyTorch's ZeroRedundancyOptimizer): the optimizer state is
// sharded over the ranks. Each parameter is owned by one rank, whose optimizer alone keeps its state
// (Adam's two moments: twice the model's size, split W ways) and updates it; after the step, every
// rank's updated parameters are broadcast from it. The gradients are still reduced whole (stage 1),
// so gradient clipping sees the same norm on every rank, and the updates are the bits of the
// unsharded optimizer's.
//
//   optim::Adam adam(model.parameters(), options);          // every rank: all the parameters
//   distributed::ZeroRedundancyOptimizer zero(adam, group);   // ... but state for its own only
//   loss.backward(); ddp.finish_gradient_sync(); zero.step();
//
// Checkpoints hold the whole state in the unsharded format: consolidate_state() gathers it on one
// rank before saving and shard_state() drops the others' part again, so a checkpoint resumes sharded
// or not, at any world size.
#pragma once

#include "distributed/process_group.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace mf::distributed {

class ZeroRedundancyOptimizer {
 public:
  /// Shards `optimizer`'s parameters over `group`'s ranks (each to the rank with the fewest elements
  /// so far, largest first) and drops the state of those this rank does not own. Every rank must
  /// construct it over the same parameters.
  ZeroRedundancyOptimizer(optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> group);

  /// Updates this rank's parameters from their gradients (the others' gradients are dropped first,
  /// so the optimizer skips them), then broadcasts every rank's updated parameters. Collective.
  void step();

  /// Gives rank `to` the state of every parameter (each owner broadcasts its own), so that its
  /// optimizer's state_dict() is the whole, unsharded state; the other ranks keep theirs. Collective.
  void consolidate_state(int to = 0);
  /// Drops the state of the parameters this rank does not own: after consolidate_state() and saving,
  /// or after loading a whole state.
  void shard_state();

  /// The rank that owns the parameter at `index` (over all groups in order).
  int owner(size_t index) const { return owners_.at(index); }
  /// Parameter elements whose state this rank keeps.
  int64_t owned_elements() const;

 private:
  optim::Optimizer& optimizer_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<Tensor> params_;
  std::vector<int> owners_;
  /// One rank's parameters of one dtype and device, broadcast together after each step.
  struct Pack {
    int owner;
    std::vector<size_t> params;
  };
  std::vector<Pack> packs_;
};

}  // namespace mf::distributed
