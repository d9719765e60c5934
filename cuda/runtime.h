// The CUDA runtime layer the kernels share: error checks, the current device's stream and cuBLAS
// handle, launch sizes, and copies between devices. Internal to cuda/; users see cuda/cuda.h.
#pragma once

#include "core/error.h"
#include "core/tensor.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mf::cuda {

/// Throws mf::Error naming the failed call and CUDA's description of `status`.
[[noreturn]] void fail_cuda(const char* call, cudaError_t status);
/// Throws mf::Error naming the failed cuBLAS call and cuBLAS's description of `status`.
[[noreturn]] void fail_cublas(const char* call, cublasStatus_t status);

/// The stream every kernel and copy on `device` runs on (one per device, created on first use); makes
/// `device` current.
cudaStream_t stream(int device);
/// The cuBLAS handle of `device`, bound to stream(device).
cublasHandle_t cublas(int device);

/// Checks that the kernel just launched on the current device started, naming it in the error.
void check_launch(const char* kernel);

/// Threads per block of the elementwise and row kernels.
inline constexpr int kThreads = 256;
/// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

/// Blocks for kernels that give each of `rows` rows one block (capped: the loop covers the rest).
inline unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 * 8 ? 65535 * 8 : rows));
}

/// Copies `src` into `dst` (same shape and dtype) across any pair of devices; returns once the data is
/// readable by the host when `dst` is on the CPU.
void copy_across(const Tensor& src, Tensor& dst);

}  // namespace mf::cuda

/// Evaluates a CUDA runtime call and throws mf::Error (with the call's text) when it fails.
#define MF_CUDA_CHECK(expr)                                                      \
  do {                                                                           \
    cudaError_t mf_cuda_status_ = (expr);                                        \
    if (mf_cuda_status_ != cudaSuccess) ::mf::cuda::fail_cuda(#expr, mf_cuda_status_); \
  } while (0)

/// Evaluates a cuBLAS call and throws mf::Error (with the call's text) when it fails.
#define MF_CUBLAS_CHECK(expr)                                                        \
  do {                                                                               \
    cublasStatus_t mf_cublas_status_ = (expr);                                       \
    if (mf_cublas_status_ != CUBLAS_STATUS_SUCCESS) ::mf::cuda::fail_cublas(#expr, mf_cublas_status_); \
  } while (0)
