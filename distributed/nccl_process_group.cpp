// The NCCL backend: collectives on CUDA tensors, GPU to GPU. Under an MPI launcher, rank 0's NCCL
// unique id reaches the other ranks over MPI (MPI_COMM_WORLD's ranks are the group's); started
// alone, the group is this process on its GPU. libnccl.so.2 is loaded when the first NCCL group is
// made, not linked: a CUDA build runs on a machine without NCCL, and only asking for it fails.
//
// Collectives run on a stream of their own, after the work already queued on miniflow's stream of the
// device (an event orders them), so that a bucket's reduction overlaps the rest of backward. wait()
// makes miniflow's stream wait for it and blocks the host until it is done, polling the communicator
// for errors; past the timeout it aborts the communicator (NCCL's way out of a collective that
// cannot finish) and ends the job, naming the ranks that had not launched the collective (their MPI
// threads say how far they have got; NCCL itself cannot tell).
#include "distributed/backends.h"

#include "core/error.h"
#include "core/profiler.h"
#include "cuda/cuda.h"
#include "cuda/runtime.h"
#include "ops/functional.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <thread>

namespace mf::distributed::detail {
namespace {

using Clock = std::chrono::steady_clock;

/// The NCCL functions this backend calls, from libnccl.so.2.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config;
  decltype(&ncclCommGetAsyncError) comm_get_async_error;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclReduceScatter) reduce_scatter;
};

/// Loads libnccl.so.2 once; throws mf::Error naming what is missing.
const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag loaded;
  std::call_once(loaded, [] {
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    MF_CHECK(library != nullptr, "init_process_group: cannot load NCCL ({}); put libnccl.so.2 on the library path "
             "(it comes with the CUDA toolkit, and with PyTorch's nvidia-nccl wheel)", dlerror());
    auto load = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, name));
      MF_CHECK(function != nullptr, "init_process_group: libnccl.so.2 has no {}", name);
    };
    load(api.get_error_string, "ncclGetErrorString");
    load(api.get_unique_id, "ncclGetUniqueId");
    load(api.comm_init_rank_config, "ncclCommInitRankConfig");
    load(api.comm_get_async_error, "ncclCommGetAsyncError");
    load(api.comm_abort, "ncclCommAbort");
    load(api.comm_destroy, "ncclCommDestroy");
    load(api.all_reduce, "ncclAllReduce");
    load(api.broadcast, "ncclBroadcast");
    load(api.all_gather, "ncclAllGather");
    load(api.reduce_scatter, "ncclReduceScatter");
  });
  return api;
}

#define MF_NCCL_CHECK(expr)                                                                     \
  do {                                                                                          \
    ncclResult_t mf_nccl_status_ = (expr);                                                      \
    if (mf_nccl_status_ != ncclSuccess && mf_nccl_status_ != ncclInProgress)                    \
      ::mf::fail("nccl: {} failed: {}", #expr, nccl().get_error_string(mf_nccl_status_));            \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::Bool: return ncclUint8;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int8: break;  // check_tensor refuses it first
  }
  fail("nccl: unsupported dtype {}", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

/// Waits for the communicator to leave ncclInProgress (a non-blocking communicator's calls return
/// before they are done), within `deadline`.
void wait_ready(ncclComm_t comm, Clock::time_point deadline, const char* what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    MF_NCCL_CHECK(nccl().comm_get_async_error(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail("nccl: {} failed: {}", what, nccl().get_error_string(state));
    if (Clock::now() > deadline) fail("nccl: {} did not finish within the timeout", what);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class NcclProcessGroup;

class NcclWork : public Work {
 public:
  NcclWork(NcclProcessGroup& group, Collective collective, cudaEvent_t done)
      : group_(group), collective_(std::move(collective)), done_(done) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override;
  bool completed() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  NcclProcessGroup& group_;
  Collective collective_;  // keeps its tensors alive until the GPU is done with them
  cudaEvent_t done_;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(int rank, int world_size, int device, std::shared_ptr<MpiProcessGroupBase> bootstrap,
                   const ProcessGroupOptions& options)
      : ProcessGroup(rank, world_size, options), device_(device), bootstrap_(std::move(bootstrap)) {
    MF_CUDA_CHECK(cudaSetDevice(device_));
    MF_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (rank == 0) MF_NCCL_CHECK(nccl().get_unique_id(&id));
    if (bootstrap_) {  // rank 0's id, over MPI
      std::vector<int64_t> words((sizeof(id) + 7) / 8, 0);
      std::memcpy(words.data(), &id, sizeof(id));
      Tensor t = from_vector(words, {static_cast<int64_t>(words.size())});
      bootstrap_->broadcast(t, 0);
      std::vector<int64_t> received = t.to_vector<int64_t>();
      std::memcpy(&id, received.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; timeouts can then abort a stuck communicator
    MF_NCCL_CHECK(nccl().comm_init_rank_config(&comm_, world_size, id, rank, &config));
    wait_ready(comm_, Clock::now() + timeout(), "ncclCommInitRankConfig");
  }

  ~NcclProcessGroup() override {
    if (comm_ != nullptr) nccl().comm_destroy(comm_);
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  }

  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  void end_job(int status) override {
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    if (bootstrap_) bootstrap_->abort_job(status);
  }

  /// Blocks until `done` has happened on the GPU, ending the job past the timeout.
  void wait_for(const Collective& c, cudaEvent_t done) {
    const Clock::time_point deadline = Clock::now() + timeout();
    for (;;) {
      cudaError_t state = cudaEventQuery(done);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) cuda::fail_cuda("cudaEventQuery", state);
      ncclResult_t async = ncclSuccess;
      nccl().comm_get_async_error(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail("nccl: {} failed: {}", c.describe(), nccl().get_error_string(async));
      if (Clock::now() > deadline) {
        const std::string missing = bootstrap_ ? bootstrap_->nccl_ranks_missing(c.sequence) : "its GPU stalled";
        std::fprintf(stderr, "[rank %d] miniflow: %s did not complete within %.3g s (nccl): %s; ending the job\n",
                     rank(), c.describe().c_str(), std::chrono::duration<double>(timeout()).count(),
                     missing.c_str());
        std::fflush(stderr);
        abort_job(1);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // miniflow's stream of the device goes on only after the collective (cheap: the event is done).
    MF_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), done, 0));
  }

 protected:
  std::shared_ptr<Work> launch(Collective c) override {
    for (const Tensor* t : {&c.input, &c.output})
      MF_CHECK(!t->defined() || t->device() == Device::cuda(device_),
               "nccl: {} needs tensors on cuda:{} (this rank's GPU), got one on {}", c.describe(), device_,
               t->device().str());
    // After what miniflow has queued on the device (the gradients being reduced, say).
    cudaEvent_t queued = nullptr, done = nullptr;
    MF_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
    MF_CUDA_CHECK(cudaEventRecord(queued, cuda::stream(device_)));
    MF_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, queued, 0));
    MF_CUDA_CHECK(cudaEventDestroy(queued));
    if (c.kind == Collective::Kind::Barrier) {  // NCCL has none: a one-element all-reduce
      c.input = zeros({1}, DType::Float32, Device::cuda(device_));
      c.output = c.input;
    }
    const size_t count = static_cast<size_t>(c.input.numel());
    switch (c.kind) {
      case Collective::Kind::Barrier:
      case Collective::Kind::AllReduce:
        MF_NCCL_CHECK(nccl().all_reduce(c.input.raw_data(), c.output.raw_data(), count, nccl_type(c.input.dtype()),
                                    nccl_op(c.op), comm_, comm_stream_));
        break;
      case Collective::Kind::Broadcast:
        MF_NCCL_CHECK(nccl().broadcast(c.input.raw_data(), c.output.raw_data(), count, nccl_type(c.input.dtype()),
                                    c.root, comm_, comm_stream_));
        break;
      case Collective::Kind::AllGather:
        MF_NCCL_CHECK(nccl().all_gather(c.input.raw_data(), c.output.raw_data(), count, nccl_type(c.input.dtype()),
                                    comm_, comm_stream_));
        break;
      case Collective::Kind::ReduceScatter:
        MF_NCCL_CHECK(nccl().reduce_scatter(c.input.raw_data(), c.output.raw_data(),
                                        static_cast<size_t>(c.output.numel()), nccl_type(c.input.dtype()),
                                        nccl_op(c.op), comm_, comm_stream_));
        break;
    }
    MF_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MF_CUDA_CHECK(cudaEventRecord(done, comm_stream_));
    if (bootstrap_) bootstrap_->note_nccl_launch(c.sequence);
    return std::make_shared<NcclWork>(*this, std::move(c), done);
  }

 private:
  int device_;
  std::shared_ptr<MpiProcessGroupBase> bootstrap_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
};

void NcclWork::wait() {
  profiler::detail::Scope profiled(profiler::EventKind::Collective, "wait for ", nullptr, collective_.name());
  group_.wait_for(collective_, done_);
}

std::shared_ptr<ProcessGroup> make_group(const ProcessGroupOptions& options) {
  std::shared_ptr<MpiProcessGroupBase> bootstrap;
  int rank = 0, world_size = 1;
#ifdef MF_DISTRIBUTED_MPI
  if (launched_by_mpi()) {
    bootstrap = make_mpi_process_group(options);
    rank = bootstrap->rank();
    world_size = bootstrap->world_size();
  }
#endif
  MF_CHECK(world_size == 1 || bootstrap != nullptr, "init_process_group: NCCL across processes needs MPI to start");
  const int device = rank % cuda::device_count();  // one GPU per rank, round robin over the visible ones
  return std::make_shared<NcclProcessGroup>(rank, world_size, device, std::move(bootstrap), options);
}

// Set when the dynamic loader runs this library's initializers, before init_process_group can ask.
[[maybe_unused]] const bool kFactoryInstalled = (make_nccl_process_group = &make_group, true);

}  // namespace
}  // namespace mf::distributed::detail
