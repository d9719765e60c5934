// The CUDA backend's public face. In a build without CUDA everything here still links: is_available()
// is false and CUDA tensors raise a clear error.
#pragma once

namespace mf::cuda {

/// True when miniflow was built with CUDA and a driver and GPU are present.
bool is_available();
/// Number of visible GPUs (0 without CUDA).
int device_count();
/// True when this build includes the CUDA backend.
bool is_built();

}  // namespace mf::cuda
