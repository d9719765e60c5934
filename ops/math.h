// Per-element math, shared by the CPU loops and the CUDA kernels so the CPU tests cover the formulas
// on both devices.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

namespace mf::math {

struct Add { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a + b; } };
struct Sub { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a - b; } };
struct Mul { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a * b; } };
struct Div { template <typename T> MF_HOST_DEVICE T operator()(T a, T b) const { return a / b; } };
struct Neg { template <typename T> MF_HOST_DEVICE T operator()(T a) const { return -a; } };

}  // namespace mf::math
