// Process groups: the collectives that data-parallel training runs on (torch.distributed's
// ProcessGroup). Three backends share one interface:
//   - "local": one process, no launcher; every collective is the identity, so code written for
//     several ranks runs unchanged on one.
//   - "mpi": CPU tensors over MPI (any MPI-3 library: OpenMPI, MPICH); CUDA tensors go through host
//     memory. Started by mpirun, which also launches and ends the job.
//   - "nccl": CUDA tensors over NCCL, its communicator set up over MPI.
// Collectives are issued in the same order on every rank (as MPI and NCCL require) and numbered; one
// that does not complete within the group's timeout ends the whole job with an error naming it, its
// number and the ranks that did not reach it, instead of hanging.
#pragma once

#include "core/tensor.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace mf::distributed {

enum class ReduceOp { Sum, Average, Max };

/// "sum", "average" or "max".
std::string_view reduce_op_name(ReduceOp op);

/// A collective started by one of the *_async calls. wait() blocks until it completes; its tensors
/// must not be touched before then.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool completed() = 0;
};

/// What a collective is, for a backend to run and for error messages to name.
struct Collective {
  enum class Kind { Barrier, Broadcast, AllReduce, AllGather, ReduceScatter };
  Kind kind = Kind::Barrier;
  Tensor input;              // contiguous; for in-place collectives (broadcast, all_reduce) also the output
  Tensor output;             // all_gather: [W, *input shape]; reduce_scatter: input.size(0) / W rows
  ReduceOp op = ReduceOp::Sum;
  int root = 0;              // broadcast's source rank
  uint64_t sequence = 0;     // 1 for the group's first collective

  /// "all_reduce #12 (sum, float32, 4096 elements)".
  std::string describe() const;
  /// "all_reduce".
  std::string_view name() const;
};

struct ProcessGroupOptions {
  /// How long a collective may take before the job is ended. The default suits training; tests use seconds.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// "local", "mpi" or "nccl".
  virtual std::string backend() const = 0;
  /// Where this group's tensors must be: the CPU for "local" and "mpi", this rank's GPU for "nccl".
  virtual Device device() const = 0;
  std::chrono::milliseconds timeout() const { return options_.timeout; }

  /// Returns when every rank has called it.
  void barrier();
  /// Copies root's `tensor` into every rank's (same shape and dtype on every rank).
  void broadcast(Tensor& tensor, int root = 0);
  /// Reduces `tensor` element-wise over the ranks, in place on every rank. Collectives take float32,
  /// float64, bfloat16, int64 and bool tensors; a bfloat16 sum rounds each partial sum to bfloat16
  /// (nearest, ties to even), and average takes float32 or float64 only.
  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  /// Every rank's `tensor`, stacked in rank order: [world_size, *tensor.shape()].
  Tensor all_gather(const Tensor& tensor);
  /// Reduces `tensor` over the ranks and returns this rank's block of it: rows
  /// [rank * n / W, (rank + 1) * n / W) of dim 0, whose size n must be a multiple of the world size.
  Tensor reduce_scatter(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);

  std::shared_ptr<Work> broadcast_async(Tensor tensor, int root = 0);
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op = ReduceOp::Sum);
  /// `output` must be [world_size, *tensor.shape()], contiguous, of tensor's dtype and device.
  std::shared_ptr<Work> all_gather_async(const Tensor& tensor, Tensor output);
  /// `output` must be contiguous, of tensor.size(0) / world_size rows.
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& tensor, Tensor output, ReduceOp op = ReduceOp::Sum);

  /// Ends every process of the job at once with exit status `status` (MPI_Abort): what a rank does
  /// after an error the others cannot know about, so that none is left waiting in a collective.
  [[noreturn]] void abort_job(int status);

 protected:
  ProcessGroup(int rank, int world_size, ProcessGroupOptions options);
  /// Starts `collective`, whose tensors the caller has checked (contiguous, matching shapes).
  virtual std::shared_ptr<Work> launch(Collective collective) = 0;
  /// The backend's way to end every process of the job (abort_job ends this one if it returns).
  virtual void end_job(int status) = 0;

 private:
  std::shared_ptr<Work> start(Collective collective);

  int rank_, world_size_;
  ProcessGroupOptions options_;
  uint64_t sequence_ = 0;
};

/// Items [begin, end) of shard `shard` when `count` items are split into `shards` contiguous shards
/// whose sizes differ by at most one (the first ones are never the larger): the shards are disjoint
/// and cover every item once, whatever the counts, as every rank of a data-parallel job computes alike.
struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
ShardRange shard_range(size_t count, int64_t shard, int64_t shards);

/// Which engine carries the collectives.
enum class Backend { Local, Mpi, Nccl };

/// Whether this build has the backend (MPI and NCCL are build options; local always is).
bool backend_available(Backend backend);

/// True when this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI).
bool launched_by_mpi();

/// The group of all processes of the job. Local needs no launcher; MPI and NCCL initialise MPI (once
/// per process) and need the job to be started by an MPI launcher. Throws mf::Error when the build
/// lacks the backend, naming the build option that adds it.
std::shared_ptr<ProcessGroup> init_process_group(Backend backend, ProcessGroupOptions options = {});

/// A world of one process: what code written for data parallelism uses when no launcher started it.
std::shared_ptr<ProcessGroup> local_process_group();

}  // namespace mf::distributed
