// Device discovery, the caching cudaMalloc allocator, one stream and one cuBLAS handle per device,
// error translation, the to_device copies, and the entry point through which cuda/loader.cpp finds
// them all in libminiflow_cuda.so.
#include "cuda/runtime.h"

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/kernels.h"
#include "ops/kernel_api.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mf::cuda {
namespace {

/// What cudaGetDeviceCount said, asked once: no driver or no GPU gives 0 devices, never an error.
struct Discovery {
  int count = 0;
  std::string reason;  // why there is no GPU, for error messages
};

const Discovery& discovery() {
  static const Discovery found = [] {
    Discovery d;
    cudaError_t status = cudaGetDeviceCount(&d.count);
    if (status != cudaSuccess) {
      d.count = 0;
      d.reason = cudaGetErrorString(status);
      cudaGetLastError();  // clear the sticky error so later calls do not report it
    } else if (d.count == 0) {
      d.reason = "no CUDA GPU is visible";
    }
    return d;
  }();
  return found;
}

void check_device(int device) {
  const Discovery& d = discovery();
  MF_CHECK(d.count > 0, "device cuda:{} is not available: {} (miniflow was built with CUDA, but there is no GPU "
           "to run on)", device, d.reason);
  MF_CHECK(device >= 0 && device < d.count, "device cuda:{} is not available: {} CUDA device(s) visible", device,
           d.count);
}

/// Blocks are multiples of 512 bytes; the pool and statistics are core's. Every kernel on a device runs
/// on that device's one stream, so a block freed by the host is safe to hand out again at once: the
/// next user's work is queued behind the last one's.
class CudaCachingAllocator final : public CachingAllocator {
 public:
  explicit CudaCachingAllocator(int device) : CachingAllocator(fmt::format("cuda:{}", device), 512), device_(device) {}

 protected:

  void* system_allocate(size_t size) override {
    MF_CUDA_CHECK(cudaSetDevice(device_));
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the pool retries after emptying its cache, or reports out of memory
      return nullptr;
    }
    if (status != cudaSuccess)
      fail("cudaMalloc of {} bytes on cuda:{} failed: {}", size, device_, cudaGetErrorString(status));
    return ptr;
  }

  void system_free(std::span<void* const> blocks) override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream(device_));  // queued kernels may still read the blocks
    for (void* block : blocks) cudaFree(block);
  }

 private:
  int device_;
};

/// Per-device state, created on first use and kept for the life of the process (freeing CUDA objects
/// during static destruction races the driver's own teardown).
struct DeviceState {
  std::unique_ptr<CudaCachingAllocator> allocator;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
};

DeviceState& state(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceState*> states;
  check_device(device);
  std::lock_guard lock(mutex);
  DeviceState*& s = states[device];
  if (s == nullptr) {
    auto fresh = std::make_unique<DeviceState>();
    MF_CUDA_CHECK(cudaSetDevice(device));
    MF_CUDA_CHECK(cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking));
    fresh->allocator = std::make_unique<CudaCachingAllocator>(device);
    s = fresh.release();
  }
  return *s;
}

Allocator* allocator_for_device(int device) { return state(device).allocator.get(); }

int visible_devices() { return discovery().count; }
const char* no_device_reason() { return discovery().reason.c_str(); }

void synchronize_device(int device) {
  check_device(device);  // a wrong index would otherwise time nothing, silently
  MF_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

// ---- to_device ------------------------------------------------------------------------------------
// The dispatcher picks a kernel by the input's device: cpu -> cuda arrives in the CPU slot (which also
// keeps serving cpu -> cpu), cuda -> anything in the CUDA slot.

void to_device(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) { copy_across(in[0], out[0]); }

}  // namespace

[[noreturn]] void fail_cuda(const char* call, cudaError_t status) {
  cudaGetLastError();
  fail("CUDA error in {}: {} ({})", call, cudaGetErrorString(status), cudaGetErrorName(status));
}

[[noreturn]] void fail_cublas(const char* call, cublasStatus_t status) {
  fail("cuBLAS error in {}: {} ({})", call, cublasGetStatusString(status), static_cast<int>(status));
}

cudaStream_t stream(int device) {
  DeviceState& s = state(device);
  MF_CUDA_CHECK(cudaSetDevice(device));
  return s.stream;
}

cublasHandle_t cublas(int device) {
  DeviceState& s = state(device);
  MF_CUDA_CHECK(cudaSetDevice(device));
  if (s.cublas == nullptr) {
    MF_CUBLAS_CHECK(cublasCreate(&s.cublas));
    MF_CUBLAS_CHECK(cublasSetStream(s.cublas, s.stream));
  }
  return s.cublas;
}

void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail("CUDA kernel {} failed to launch: {}", kernel, cudaGetErrorString(status));
}

void copy_across(const Tensor& src, Tensor& dst) {
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::vector<Tensor> out{dst};
    registry()[OpId::copy].kernels[0]({src}, out, {});
    return;
  }
  // Strided layouts are made dense on their own device first (the copy op runs there), so the
  // transfer itself is one memcpy.
  Tensor from = src.contiguous();
  Tensor to = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  int device = (from.device().is_cuda() ? from.device() : to.device()).index;
  cudaStream_t s = stream(device);
  size_t nbytes = static_cast<size_t>(from.numel()) * from.element_size();
  MF_CUDA_CHECK(cudaMemcpyAsync(to.raw_data(), from.raw_data(), nbytes, cudaMemcpyDefault, s));
  // The host may read (or free) its side at once, and another GPU's stream does not wait on this one.
  if (from.device() != to.device()) MF_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!to.is_same(dst)) {
    std::vector<Tensor> out{dst};
    registry()[OpId::copy].kernels[static_cast<size_t>(dst.device().type)]({to}, out, {});
  }
}

namespace {

void register_kernels(Registry& registry) {
  registry.set_kernel(OpId::to_device, DeviceType::CUDA, to_device);
  register_elementwise(registry);
  register_fill(registry);
  register_reduce(registry);
  register_matmul(registry);
  register_softmax(registry);
  register_nn(registry);
  register_loss(registry);
  register_index(registry);
}

}  // namespace
}  // namespace mf::cuda

extern "C" const mf::cuda::detail::Backend* miniflow_cuda_backend() {
  using namespace mf::cuda;
  static const detail::Backend table{
      .device_count = visible_devices,
      .no_device_reason = no_device_reason,
      .synchronize = synchronize_device,
      .allocator = allocator_for_device,
      .copy_across = copy_across,
      .register_kernels = register_kernels,
  };
  return &table;
}
