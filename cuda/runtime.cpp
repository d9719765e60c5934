// Device discovery, the caching cudaMalloc allocator behind core's cuda_allocator_hook, one stream
// and one cuBLAS handle per device, error translation, and the to_device copies.
#include "cuda/runtime.h"

#include "core/allocator.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "ops/kernel_api.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mf {

extern Allocator* (*cuda_allocator_hook)(int device_index);  // core/storage.cpp

namespace cuda {
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

// Installed at load time, so that Tensor::empty on a CUDA device works before any op has run.
const bool kHookInstalled = (cuda_allocator_hook = &allocator_for_device, true);

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

bool is_available() { return discovery().count > 0; }
int device_count() { return discovery().count; }
bool is_built() { return true; }
void synchronize(int device) {
  if (device_count() == 0) return;
  check_device(device);  // a wrong index would otherwise time nothing, silently
  MF_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

}  // namespace cuda

void register_cuda_kernels(Registry& registry) {
  (void)cuda::kHookInstalled;
  registry.set_kernel(OpId::to_device, DeviceType::CPU, cuda::to_device);
  registry.set_kernel(OpId::to_device, DeviceType::CUDA, cuda::to_device);
  cuda::register_elementwise(registry);
  cuda::register_fill(registry);
  cuda::register_reduce(registry);
  cuda::register_matmul(registry);
  cuda::register_softmax(registry);
  cuda::register_nn(registry);
  cuda::register_loss(registry);
  cuda::register_index(registry);
}

}  // namespace mf
