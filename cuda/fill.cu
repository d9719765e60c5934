// CUDA kernels of the in-place fills: constants, arange, and the counter-based random draws. Element i
// (row-major) of a draw takes its bits from Philox block (seed, counter + i / 2), exactly as the CPU
// kernels in ops/fill.cpp do, so a seeded draw gives the same numbers on either device.
#include "core/generator.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"
#include "ops/sampling.h"

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
  visit_any_dtype(out[0].dtype(), [&]<typename T>() {
    map<T>(out[0], {}, Constant<T>{convert<T>(std::get<FillParams>(attrs).value)});
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

// ---- randperm and multinomial: the CPU's arithmetic (ops/sampling.h), so the same draws --------------

/// Fisher-Yates on one thread: the shuffle is sequential.
__global__ void randperm_kernel(DevicePlan<1> plan, uint64_t seed, uint64_t counter) {
  auto at = [&](int64_t i) -> int64_t& {
    int64_t off[1];
    plan.offsets(i, off);
    return *reinterpret_cast<int64_t*>(plan.base[0] + off[0]);
  };
  for (int64_t i = 0; i < plan.numel; ++i) at(i) = i;
  for (uint64_t i = static_cast<uint64_t>(plan.numel); i-- > 1;) {
    int64_t j = static_cast<int64_t>(sampling::scaled_below(sampling::element_bits(seed, counter, i), i + 1));
    int64_t held = at(static_cast<int64_t>(i));
    at(static_cast<int64_t>(i)) = at(j);
    at(j) = held;
  }
}

void randperm(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  if (out[0].numel() == 0) return;
  const PhiloxStream& philox = std::get<RandpermParams>(attrs).stream;
  DevicePlan<1> plan = plan_for<1>(out[0].shape(), {&out[0]});
  randperm_kernel<<<1, 1, 0, stream(out[0].device().index)>>>(plan, philox.seed, philox.counter);
  check_launch("randperm");
}

/// One thread per row; a draw without replacement leaves out the row's earlier picks.
template <typename T>
__global__ void multinomial_kernel(const char* weights, int64_t rows, int64_t categories, int64_t row_stride,
                                   int64_t stride, int64_t* picks, int64_t out_row, int64_t out_stride,
                                   int64_t num_samples, bool replacement, uint64_t seed, uint64_t counter) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < rows; b += int64_t{gridDim.x} * blockDim.x) {
    const T* row = reinterpret_cast<const T*>(weights) + b * row_stride;
    int64_t* drawn = picks + b * out_row;
    for (int64_t s = 0; s < num_samples; ++s) {
      auto taken = [&](int64_t j) {
        if (replacement) return false;
        for (int64_t earlier = 0; earlier < s; ++earlier)
          if (drawn[earlier * out_stride] == j) return true;
        return false;
      };
      double u = sampling::unit_interval(sampling::element_bits(seed, counter, static_cast<uint64_t>(b * num_samples + s)));
      drawn[s * out_stride] = sampling::pick_category(row, categories, stride, u, taken);
    }
  }
}

void multinomial(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& weights = in[0];
  Tensor& drawn = out[0];
  const auto& [num_samples, replacement, philox] = std::get<MultinomialParams>(attrs);
  int64_t rows = weights.dim() == 2 ? weights.shape()[0] : 1, categories = weights.shape().back();
  if (drawn.numel() == 0) return;
  visit_floating(weights.dtype(), [&]<typename T>() {
    multinomial_kernel<T><<<blocks_for(rows), kThreads, 0, stream(weights.device().index)>>>(
        static_cast<const char*>(weights.raw_data()), rows, categories,
        weights.dim() == 2 ? weights.strides()[0] : 0, weights.strides().back(), drawn.data_ptr<int64_t>(),
        drawn.dim() == 2 ? drawn.strides()[0] : 0, drawn.strides().back(), num_samples, replacement, philox.seed,
        philox.counter);
  });
  check_launch("multinomial");
}

}  // namespace

void register_fill(Registry& r) {
  r.set_kernel(OpId::fill, DeviceType::CUDA, fill);
  r.set_kernel(OpId::arange, DeviceType::CUDA, arange);
  r.set_kernel(OpId::uniform, DeviceType::CUDA, uniform);
  r.set_kernel(OpId::normal, DeviceType::CUDA, normal);
  r.set_kernel(OpId::bernoulli, DeviceType::CUDA, bernoulli);
  r.set_kernel(OpId::randperm, DeviceType::CUDA, randperm);
  r.set_kernel(OpId::multinomial, DeviceType::CUDA, multinomial);
}

}  // namespace mf::cuda
