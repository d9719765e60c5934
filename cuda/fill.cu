// CUDA kernels of the in-place fills: constants, arange, and the counter-based random draws. Element i
// (row-major) of a draw takes its bits from Philox block (seed, counter + i / 2), exactly as the CPU
// kernels in ops/fill.cpp do, so a seeded draw gives the same numbers on either device.
#include "core/generator.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

#include <cmath>
#include <type_traits>

namespace mf::cuda {
namespace {

template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};

/// Writes pair(p)[k] into row-major element 2p + k of the planned tensor, one thread per pair.
template <typename T, typename Pair>
__global__ void fill_pairs_kernel(DevicePlan<1> plan, Pair pair) {
  int64_t pairs = (plan.numel + 1) / 2;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs; p += int64_t{gridDim.x} * blockDim.x) {
    auto values = pair(p);
    for (int k = 0; k < 2 && 2 * p + k < plan.numel; ++k) {
      int64_t off[1];
      plan.offsets(2 * p + k, off);
      *reinterpret_cast<T*>(plan.base[0] + off[0]) = static_cast<T>(values[k]);
    }
  }
}

template <typename T, typename Pair>
void fill_pairs(Tensor& out, Pair pair) {
  DevicePlan<1> plan = plan_for<1>(out.shape(), {&out});
  fill_pairs_kernel<T><<<blocks_for((plan.numel + 1) / 2), kThreads, 0, stream(out.device().index)>>>(plan, pair);
  check_launch("fill_pairs");
}

/// Two values per pair, as the CPU computes them (ops/fill.cpp documents each formula).
struct Pair {
  double a, b;
  __device__ double operator[](int k) const { return k == 0 ? a : b; }
};

struct Arange {
  double start, step;
  __device__ Pair operator()(int64_t p) const {
    double i = static_cast<double>(2 * p);
    return {start + i * step, start + (i + 1) * step};
  }
};

template <typename T>
struct Uniform {
  uint64_t seed, counter;
  double low, range;
  __device__ Pair operator()(int64_t p) const {
    auto w = Philox::block(seed, 0, counter + p);
    if constexpr (std::is_same_v<T, float>) {
      // The CPU rounds low + range * u to float; keep that order of rounding.
      return {static_cast<double>(static_cast<float>(low + range * uniform_float(w[0]))),
              static_cast<double>(static_cast<float>(low + range * uniform_float(w[2])))};
    } else if constexpr (std::is_same_v<T, double>) {
      return {low + range * uniform_double(w[0], w[1]), low + range * uniform_double(w[2], w[3])};
    } else {
      return {low + floor(range * uniform_double(w[0], w[1])), low + floor(range * uniform_double(w[2], w[3]))};
    }
  }
};

struct Normal {
  uint64_t seed, counter;
  double mean, std;
  __device__ Pair operator()(int64_t p) const {
    auto w = Philox::block(seed, 0, counter + p);
    double u0 = uniform_double(w[0], w[1]), u1 = uniform_double(w[2], w[3]);
    double r = sqrt(-2.0 * log(1.0 - u0)), theta = 2.0 * M_PI * u1;
    return {mean + std * r * cos(theta), mean + std * r * sin(theta)};
  }
};

struct Bernoulli {
  uint64_t seed, counter, threshold;
  __device__ Pair operator()(int64_t p) const {
    auto w = Philox::block(seed, 0, counter + p);
    return {uint64_t{w[0]} < threshold ? 1.0 : 0.0, uint64_t{w[2]} < threshold ? 1.0 : 0.0};
  }
};

void fill(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    map<T>(out[0], {}, Constant<T>{static_cast<T>(std::get<FillParams>(attrs).value)});
  });
}

void arange(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  const ArangeParams& arange = std::get<ArangeParams>(attrs);
  visit_dtype(out[0].dtype(), [&]<typename T>() { fill_pairs<T>(out[0], Arange{arange.start, arange.step}); });
}

void uniform(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  const UniformParams& uniform = std::get<UniformParams>(attrs);
  const PhiloxStream& philox = uniform.stream;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>)
      fill_pairs<T>(out[0], Uniform<T>{philox.seed, philox.counter, uniform.low, uniform.high - uniform.low});
  });
}

void normal(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  const NormalParams& normal = std::get<NormalParams>(attrs);
  visit_floating(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], Normal{normal.stream.seed, normal.stream.counter, normal.mean, normal.std});
  });
}

void bernoulli(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  const BernoulliParams& bernoulli = std::get<BernoulliParams>(attrs);
  auto threshold = static_cast<uint64_t>(std::ceil(bernoulli.p * 0x1p32));
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], Bernoulli{bernoulli.stream.seed, bernoulli.stream.counter, threshold});
  });
}

}  // namespace

void register_fill(Registry& r) {
  r.set_kernel(OpId::fill, DeviceType::CUDA, fill);
  r.set_kernel(OpId::arange, DeviceType::CUDA, arange);
  r.set_kernel(OpId::uniform, DeviceType::CUDA, uniform);
  r.set_kernel(OpId::normal, DeviceType::CUDA, normal);
  r.set_kernel(OpId::bernoulli, DeviceType::CUDA, bernoulli);
}

}  // namespace mf::cuda
