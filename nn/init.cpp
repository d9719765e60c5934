#include "nn/init.h"

#include "core/graph.h"
#include "ops/functional.h"

#include <cmath>

namespace mf::nn::init {

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::SELU: return 3.0 / 4.0;
  }
  fail("calculate_gain: unknown nonlinearity {}", static_cast<int>(nonlinearity));
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  MF_CHECK(tensor.dim() >= 2,
           "calculate_fan_in_and_fan_out: fans need a tensor of at least 2 dims ([out, in, ...]), got {}",
           shape_str(tensor.shape()));
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

namespace {
thread_local bool skipping_init = false;
}  // namespace

SkipInitGuard::SkipInitGuard() : previous_(skipping_init) { skipping_init = true; }
SkipInitGuard::~SkipInitGuard() { skipping_init = previous_; }

Tensor& uniform_(Tensor& tensor, double low, double high, Generator* generator) {
  if (skipping_init) return zeros_(tensor);
  mf::uniform_(tensor, low, high, generator);
  return tensor;
}

Tensor& normal_(Tensor& tensor, double mean, double std, Generator* generator) {
  if (skipping_init) return zeros_(tensor);
  mf::normal_(tensor, mean, std, generator);
  return tensor;
}

Tensor& constant_(Tensor& tensor, double value) {
  NoGradGuard no_grad;
  tensor.fill_(value);
  return tensor;
}

Tensor& zeros_(Tensor& tensor) { return constant_(tensor, 0.0); }

Tensor& ones_(Tensor& tensor) { return constant_(tensor, 1.0); }

Tensor& xavier_uniform_(Tensor& tensor, double gain, Generator* generator) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  double bound = std::sqrt(3.0) * std;
  return init::uniform_(tensor, -bound, bound, generator);
}

Tensor& xavier_normal_(Tensor& tensor, double gain, Generator* generator) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return init::normal_(tensor, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), generator);
}

namespace {

/// gain / sqrt(fan): the standard deviation both kaiming initialisers aim for.
double kaiming_std(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  int64_t fan = mode == FanMode::FanIn ? fan_in : fan_out;
  MF_CHECK(fan > 0, "kaiming init: tensor of shape {} has a zero {}", shape_str(tensor.shape()),
           mode == FanMode::FanIn ? "fan_in" : "fan_out");
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}

}  // namespace

Tensor& kaiming_uniform_(Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity, Generator* generator) {
  if (tensor.numel() == 0) return tensor;  // PyTorch: a no-op on zero-element tensors
  double bound = std::sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity);
  return init::uniform_(tensor, -bound, bound, generator);
}

Tensor& kaiming_normal_(Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity, Generator* generator) {
  if (tensor.numel() == 0) return tensor;
  return init::normal_(tensor, 0.0, kaiming_std(tensor, a, mode, nonlinearity), generator);
}

}  // namespace mf::nn::init
