// What libminiflow asks of its CUDA backend. The backend (the runtime, the kernels and the NCCL
// process group) is its own library, libminiflow_cuda.so, the only part of miniflow that links
// libcudart and libcublas; cuda/loader.cpp loads it beside libminiflow.so on the first CUDA question,
// so a CPU program starts and runs where no CUDA runtime is installed. Internal to cuda/.
#pragma once

#include "core/allocator.h"
#include "core/tensor.h"
#include "ops/registry.h"

namespace mf::cuda::detail {

/// Bumped whenever Backend or the Registry it fills changes, so that a stale libminiflow_cuda.so is
/// refused by name rather than called through the wrong table.
inline constexpr int kBackendAbiVersion = 2;

/// The name the backend's entry point is exported under (extern "C"): a function taking nothing and
/// returning const Backend*.
inline constexpr const char* kBackendEntryPoint = "miniflow_cuda_backend";

struct Backend {
  int abi_version = kBackendAbiVersion;
  /// Visible GPUs; 0 when there is no driver or no GPU (never throws).
  int (*device_count)() = nullptr;
  /// Why device_count() is 0 (the driver's words), for error messages.
  const char* (*no_device_reason)() = nullptr;
  /// Waits for the work queued on a GPU; refuses an index of no visible GPU.
  void (*synchronize)(int device) = nullptr;
  /// The caching allocator of a GPU; refuses an index of no visible GPU.
  Allocator* (*allocator)(int device) = nullptr;
  /// Copies src into dst (same shape and dtype) across any pair of devices.
  void (*copy_across)(const Tensor& src, Tensor& dst) = nullptr;
  /// Fills the registry's CUDA slots; called once, by the loader.
  void (*register_kernels)(Registry& registry) = nullptr;
};

}  // namespace mf::cuda::detail
