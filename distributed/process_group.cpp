#include "distributed/process_group.h"

#include "core/error.h"
#include "cuda/cuda.h"
#include "distributed/backends.h"
#include "ops/functional.h"

#include <cstdlib>

namespace mf::distributed {
namespace {

std::string_view kind_name(Collective::Kind kind) {
  switch (kind) {
    case Collective::Kind::Barrier: return "barrier";
    case Collective::Kind::Broadcast: return "broadcast";
    case Collective::Kind::AllReduce: return "all_reduce";
    case Collective::Kind::AllGather: return "all_gather";
    case Collective::Kind::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}

class CompletedWork : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

/// One process: every collective leaves its tensors as they are (or copies them where the output is
/// another tensor), which is what W ranks holding equal tensors would give.
class LocalProcessGroup : public ProcessGroup {
 public:
  explicit LocalProcessGroup(ProcessGroupOptions options) : ProcessGroup(0, 1, options) {}
  std::string backend() const override { return "local"; }
  Device device() const override { return Device::cpu(); }

 protected:
  void end_job(int status) override { std::_Exit(status); }
  std::shared_ptr<Work> launch(Collective c) override {
    if (c.kind == Collective::Kind::AllGather) c.output.select(0, 0).copy_(c.input);
    if (c.kind == Collective::Kind::ReduceScatter) c.output.copy_(c.input);
    return std::make_shared<CompletedWork>();
  }
};

void check_tensor(const Tensor& t, const char* what, const char* collective) {
  MF_CHECK(t.defined(), "{}: {} is undefined", collective, what);
  MF_CHECK(t.dtype() != DType::Int8, "{}: {} is int8, a storage type so far: collectives take float32, float64, "
           "bfloat16, int64 or bool tensors", collective, what);
  MF_CHECK(t.numel() == 0 || t.is_contiguous(), "{}: {} of shape {} must be contiguous (collectives work on its "
           "memory in place; call .contiguous())", collective, what, shape_str(t.shape()));
}

void check_reducible(const Tensor& t, ReduceOp op, const char* collective) {
  MF_CHECK(t.dtype() != DType::Bool, "{}: cannot reduce a bool tensor (cast it to int64)", collective);
  MF_CHECK(op != ReduceOp::Average || t.dtype() == DType::Float32 || t.dtype() == DType::Float64,
           "{}: average needs a float32 or float64 tensor, got {} (sum it and divide)", collective,
           dtype_name(t.dtype()));
}

void check_output(const Tensor& input, const Tensor& output, const Shape& expected, const char* collective) {
  check_tensor(output, "the output", collective);
  MF_CHECK(output.shape() == expected && output.dtype() == input.dtype() && output.device() == input.device(),
           "{}: the output must be {} {} on {}, got {} {} on {}", collective, dtype_name(input.dtype()),
           shape_str(expected), input.device().str(), dtype_name(output.dtype()), shape_str(output.shape()),
           output.device().str());
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Average: return "average";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::string_view Collective::name() const { return kind_name(kind); }

std::string Collective::describe() const {
  std::string text = fmt::format("{} #{}", kind_name(kind), sequence);
  if (kind == Kind::Barrier) return text;
  std::string details = fmt::format("{}, {} elements", dtype_name(input.dtype()), input.numel());
  if (kind == Kind::AllReduce || kind == Kind::ReduceScatter)
    details = fmt::format("{}, {}", reduce_op_name(op), details);
  if (kind == Kind::Broadcast) details = fmt::format("from rank {}, {}", root, details);
  return fmt::format("{} ({})", text, details);
}

ProcessGroup::ProcessGroup(int rank, int world_size, ProcessGroupOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {
  MF_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "ProcessGroup: rank {} of {} is out of range", rank,
           world_size);
  MF_CHECK(options.timeout.count() > 0, "ProcessGroup: the timeout must be positive, got {} ms",
           options.timeout.count());
}

std::shared_ptr<Work> ProcessGroup::start(Collective collective) {
  collective.sequence = ++sequence_;
  return launch(std::move(collective));
}

void ProcessGroup::abort_job(int status) {
  end_job(status);
  std::_Exit(status);
}

void ProcessGroup::barrier() { start({.kind = Collective::Kind::Barrier})->wait(); }

void ProcessGroup::broadcast(Tensor& tensor, int root) { broadcast_async(tensor, root)->wait(); }

void ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op)->wait(); }

Tensor ProcessGroup::all_gather(const Tensor& tensor) {
  check_tensor(tensor, "the tensor", "all_gather");
  Shape shape = tensor.shape();
  shape.insert(shape.begin(), world_size_);
  Tensor output = Tensor::empty(shape, tensor.dtype(), tensor.device());
  all_gather_async(tensor, output)->wait();
  return output;
}

Tensor ProcessGroup::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "the tensor", "reduce_scatter");
  MF_CHECK(tensor.dim() >= 1 && tensor.size(0) % world_size_ == 0,
           "reduce_scatter: dim 0 of shape {} must be a multiple of the world size {}", shape_str(tensor.shape()),
           world_size_);
  Shape shape = tensor.shape();
  shape[0] /= world_size_;
  Tensor output = Tensor::empty(shape, tensor.dtype(), tensor.device());
  reduce_scatter_async(tensor, output, op)->wait();
  return output;
}

std::shared_ptr<Work> ProcessGroup::broadcast_async(Tensor tensor, int root) {
  check_tensor(tensor, "the tensor", "broadcast");
  MF_CHECK(root >= 0 && root < world_size_, "broadcast: root rank {} is outside the world of {}", root,
           world_size_);
  return start({.kind = Collective::Kind::Broadcast, .input = tensor, .output = tensor, .root = root});
}

std::shared_ptr<Work> ProcessGroup::all_reduce_async(Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "the tensor", "all_reduce");
  check_reducible(tensor, op, "all_reduce");
  return start({.kind = Collective::Kind::AllReduce, .input = tensor, .output = tensor, .op = op});
}

std::shared_ptr<Work> ProcessGroup::all_gather_async(const Tensor& tensor, Tensor output) {
  check_tensor(tensor, "the tensor", "all_gather");
  Shape expected = tensor.shape();
  expected.insert(expected.begin(), world_size_);
  check_output(tensor, output, expected, "all_gather");
  return start({.kind = Collective::Kind::AllGather, .input = tensor, .output = std::move(output)});
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_async(const Tensor& tensor, Tensor output, ReduceOp op) {
  check_tensor(tensor, "the tensor", "reduce_scatter");
  check_reducible(tensor, op, "reduce_scatter");
  MF_CHECK(tensor.dim() >= 1 && tensor.size(0) % world_size_ == 0,
           "reduce_scatter: dim 0 of shape {} must be a multiple of the world size {}", shape_str(tensor.shape()),
           world_size_);
  Shape expected = tensor.shape();
  expected[0] /= world_size_;
  check_output(tensor, output, expected, "reduce_scatter");
  return start({.kind = Collective::Kind::ReduceScatter, .input = tensor, .output = std::move(output), .op = op});
}

ShardRange shard_range(size_t count, int64_t shard, int64_t shards) {
  MF_CHECK(shards >= 1 && shard >= 0 && shard < shards, "shard_range: shard {} of {} is out of range", shard, shards);
  auto bound = [&](int64_t k) { return count * static_cast<size_t>(k) / static_cast<size_t>(shards); };
  return {bound(shard), bound(shard + 1)};
}

std::shared_ptr<ProcessGroup> (*detail::make_nccl_process_group)(const ProcessGroupOptions& options) = nullptr;

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::Local: return true;
#ifdef MF_DISTRIBUTED_MPI
    case Backend::Mpi: return true;
#endif
#ifdef MF_DISTRIBUTED_NCCL
    case Backend::Nccl: return true;
#endif
    default: return false;
  }
}

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

std::shared_ptr<ProcessGroup> init_process_group(Backend backend, ProcessGroupOptions options) {
  switch (backend) {
    case Backend::Local: return std::make_shared<LocalProcessGroup>(options);
    case Backend::Mpi:
#ifdef MF_DISTRIBUTED_MPI
      return detail::make_mpi_process_group(options);
#else
      fail("init_process_group: this build of miniflow has no MPI backend; install an MPI library (apt install "
           "libopenmpi-dev) and rebuild with -Ddistributed=enabled");
#endif
    case Backend::Nccl:
#ifdef MF_DISTRIBUTED_NCCL
      MF_CHECK(cuda::is_available(), "init_process_group: the NCCL backend needs a GPU, and CUDA has none: {}",
               cuda::unavailable_reason());
      MF_CHECK(detail::make_nccl_process_group != nullptr, "init_process_group: the CUDA backend was loaded "
               "without its NCCL process group (libminiflow_cuda.so comes from another build)");
      return detail::make_nccl_process_group(options);
#else
      fail("init_process_group: this build of miniflow has no NCCL backend; it needs CUDA, NCCL and MPI (rebuild "
           "with -Dcuda=enabled -Ddistributed=enabled)");
#endif
  }
  fail("init_process_group: unknown backend {}", static_cast<int>(backend));
}

std::shared_ptr<ProcessGroup> local_process_group() { return init_process_group(Backend::Local); }

}  // namespace mf::distributed
