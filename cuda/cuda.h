// The CUDA backend's public face. The backend itself is libminiflow_cuda.so, installed beside
// libminiflow.so and loaded by the first of these calls (or the first CUDA tensor), so that a program
// that never asks for a GPU runs where no CUDA runtime is installed. In a build without CUDA, or where
// the backend cannot be loaded, everything here still works: is_available() is false,
// unavailable_reason() says why, and CUDA tensors raise an error that says the same.
#pragma once

#include <string>
#include <vector>

namespace mf::cuda {

/// True when miniflow was built with CUDA, its backend loads, and a driver and GPU are present. Never
/// throws: a missing runtime, driver or GPU just gives false.
bool is_available();
/// Number of visible GPUs (0 without CUDA, a driver or a GPU).
int device_count();
/// True when this build includes the CUDA backend.
bool is_built();
/// Why is_available() is false, in the loader's or the driver's words (no CUDA runtime installed, no
/// GPU, a build without CUDA); empty when it is true.
std::string unavailable_reason();
/// Waits until the work queued on GPU `device` has finished (kernels run asynchronously; timings
/// need this). Does nothing without CUDA or a GPU; refuses an index of no visible GPU.
void synchronize(int device = 0);
/// Names of the ops that compute (not views) and have no CUDA kernel in this build; calling one on a
/// CUDA tensor raises "no kernel for device cuda:N".
std::vector<std::string> missing_ops();

}  // namespace mf::cuda
