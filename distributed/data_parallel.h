// Data-parallel training (PyTorch's DistributedDataParallel): every rank holds the whole model, runs
// forward and backward on its own share of the batch, and the ranks' gradients are summed or
// averaged, so that every rank takes the same optimizer step.
//
//   auto group = distributed::init_process_group(distributed::Backend::Mpi);
//   distributed::DistributedDataParallel ddp(model, group);   // checks the ranks agree, copies rank 0's weights
//   loss.backward();                  // buckets of gradients are reduced while backward still runs
//   ddp.finish_gradient_sync();       // waits for them: every .grad now holds the ranks' average
//   optimizer.step();
//
// Gradients are packed into buckets of about bucket_bytes, the parameters in reverse registration
// order (roughly the order backward finishes them) until the first step has shown the real order:
// then the buckets are rebuilt once in the order rank 0's gradients became final, as PyTorch's
// Reducer rebuilds its buckets after the first iteration. A bucket is reduced as soon as all its gradients
// are final (the autograd engine's post-accumulate-grad hook says so) and every bucket before it has
// been started, so all ranks issue the same collectives in the same order whatever order their
// gradients come in. A bucket holding a parameter that a rank's backward did not reach starts only in
// finish_gradient_sync(), so issue no other collective on the group between backward and
// finish_gradient_sync(): one rank could then issue it before that bucket and another after.
#pragma once

#include "autograd/autograd.h"
#include "distributed/process_group.h"
#include "nn/module.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace mf::distributed {

/// What gradients travel as between the ranks.
enum class GradientCompression {
  None,
  /// Rounded to bfloat16 (PyTorch's bf16_compress_hook, Horovod's compression): half the bytes to
  /// send and to sum, with bfloat16's 8 significant bits in each rank's share and in the sum.
  BFloat16,
};

struct DataParallelOptions {
  /// Gradient bytes per bucket: larger buckets need fewer collectives, smaller ones start sooner.
  int64_t bucket_bytes = int64_t{4} << 20;
  /// Sum or average of the ranks' gradients (average: what one process would get from the mean
  /// loss over the whole batch, when the ranks' shares are equal).
  ReduceOp reduce = ReduceOp::Average;
  /// Reduce buckets while backward runs; off: all of them in finish_gradient_sync().
  bool overlap = true;
  /// Sum the ranks' gradients in rank order (all_gather, then rank 0's + rank 1's + ...), so the
  /// result equals, bit for bit, one process accumulating the same gradients in the same order,
  /// whatever algorithm the backend reduces with. Costs world_size times a bucket's memory.
  bool deterministic = false;
  /// BFloat16: each float32 bucket is rounded to bfloat16, summed over the ranks in bfloat16 (each
  /// sum rounded to nearest), cast back, and divided by the world size in float32 for an average;
  /// buckets of other dtypes travel as they are. With `deterministic`, the ranks' bfloat16 shares
  /// are summed in float32, in rank order. Off by default: the result no longer equals one process's.
  GradientCompression compression = GradientCompression::None;
  /// Also copy rank 0's buffers (not only its parameters) to every rank at the start.
  bool broadcast_buffers = true;
  /// Rebuild the buckets once, at the end of the first finish_gradient_sync() whose backward ran on
  /// rank 0, in the order that backward made its gradients final (parameters it did not reach
  /// last, in reverse registration order); every rank takes rank 0's order. A model whose modules
  /// are registered in another order than backward reaches them then still fills its first bucket
  /// first. The reduced gradients do not depend on the buckets.
  bool rebuild_buckets = true;
};

class DistributedDataParallel {
 public:
  /// Checks that every rank has the same parameters (names, dtypes, shapes, order), throwing
  /// mf::Error that names the first that differs and the ranks, on every rank; copies rank 0's
  /// parameters (and buffers) to the others; and starts watching the gradients. A collective call:
  /// every rank must construct it.
  DistributedDataParallel(const nn::Module& module, std::shared_ptr<ProcessGroup> group,
                          DataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Ends the gradient reduction of the backward just run: starts the buckets backward left (those
  /// with parameters it gave no gradient; their share counts as zero), waits for every bucket and
  /// makes each .grad a view of its bucket, holding the reduced gradient (the next
  /// finish_gradient_sync() overwrites it: clone a gradient to keep it). A rank with nothing to
  /// compute calls it without a backward and still takes part. Collective: every rank calls it once
  /// per optimizer step.
  void finish_gradient_sync();

  /// While the returned guard lives, backward accumulates gradients locally without reducing them
  /// (gradient accumulation): the first backward after it reduces the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp) { ddp_->syncing_ = false; }
    ~NoSyncGuard() { ddp_->syncing_ = true; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  ProcessGroup& group() { return *group_; }
  const DataParallelOptions& options() const { return options_; }
  /// The buckets, in the order they are reduced, each as the parameter indices (in module order) it holds.
  std::vector<std::vector<size_t>> bucket_parameters() const;

 private:
  struct Bucket;
  /// Packs the parameters, taken in `order`, into buckets_ (and where_).
  void assign_buckets(const std::vector<size_t>& order);
  /// Rebuilds the buckets in rank 0's order of ready gradients, once rank 0 has recorded one.
  void rebuild_buckets_in_ready_order();
  void on_gradient_ready(size_t param);
  void launch_ready_buckets();
  bool compresses(const Bucket& bucket) const;
  void launch(Bucket& bucket);
  void fill(Bucket& bucket, size_t slot);

  std::shared_ptr<ProcessGroup> group_;
  DataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // per parameter: bucket, slot
  std::vector<autograd::HookHandle> hooks_;
  size_t next_launch_ = 0;
  bool syncing_ = true;
  bool buckets_rebuilt_ = false;
  std::vector<size_t> ready_order_;  // parameters as their gradients became final, until the rebuild
};

}  // namespace mf::distributed
