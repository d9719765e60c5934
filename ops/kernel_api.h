// What ops publishes to kernel authors in other layers (the CUDA kernels in cuda/): the registry the
// kernels register into, the device-independent layouts that the CPU kernels walk too (so both
// devices agree on broadcasting, merged dims and reduction layouts), the per-element math, and the
// few helpers kernels share. Everything else in ops/ is private to it; tests/check_layers.py holds
// cuda/ to this header.
#pragma once

#include "core/graph.h"
#include "core/tensor.h"
#include "ops/layout.h"
#include "ops/math.h"
#include "ops/registry.h"

namespace mf {

/// Routes to_device's copies from the CPU to a GPU through the CUDA backend (cuda/loader.cpp). The
/// dispatcher calls it once, after the op families have registered; the backend's kernels come later.
void register_cross_device_copy(Registry& registry);

namespace detail {

/// The registry, for the CUDA backend to fill its ops' CUDA slots when it is loaded, after the
/// registry was built. Only CUDA slots are written then, and none is read before a CUDA tensor
/// exists, which needs the backend loaded.
Registry& registry_to_extend();

/// What set_float32_matmul_precision last set, for a kernel to ask on every GEMM (cuBLAS's compute
/// type follows it) without comparing names.
enum class MatmulPrecision : uint8_t { Highest, High, Medium };
MatmulPrecision float32_matmul_precision();

/// A contiguous version of t (t itself when it already is), made without recording autograd.
inline Tensor dense(const Tensor& t) {
  NoGradGuard no_grad;
  return t.contiguous();
}

}  // namespace detail
}  // namespace mf
