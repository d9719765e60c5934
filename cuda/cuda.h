// The CUDA backend's public face. In a build without CUDA everything here still links: is_available()
// is false and CUDA tensors raise a clear error.
#pragma once

#include <string>
#include <vector>

namespace mf::cuda {

/// True when miniflow was built with CUDA and a driver and GPU are present. Never throws: a missing
/// driver or GPU just gives false.
bool is_available();
/// Number of visible GPUs (0 without CUDA, a driver or a GPU).
int device_count();
/// True when this build includes the CUDA backend.
bool is_built();
/// Waits until the work queued on GPU `device` has finished (kernels run asynchronously; timings
/// need this). Does nothing without CUDA or a GPU; refuses an index of no visible GPU.
void synchronize(int device = 0);
/// Names of the ops that compute (not views) and have no CUDA kernel in this build; calling one on a
/// CUDA tensor raises "no kernel for device cuda:N".
std::vector<std::string> missing_ops();

}  // namespace mf::cuda
