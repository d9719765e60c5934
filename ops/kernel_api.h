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

/// Adds the CUDA kernels to the registry's ops (cuda/runtime.cpp; a no-op in builds without CUDA,
/// cuda/stub.cpp). The dispatcher calls it once, after the op families have registered.
void register_cuda_kernels(Registry& registry);

namespace detail {

/// A contiguous version of t (t itself when it already is), made without recording autograd.
inline Tensor dense(const Tensor& t) {
  NoGradGuard no_grad;
  return t.contiguous();
}

}  // namespace detail
}  // namespace mf
