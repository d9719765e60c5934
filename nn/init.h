// Parameter initialisers, PyTorch's torch.nn.init: same names, same formulas, so a layer built here
// starts from the distribution its PyTorch twin would. Each fills its tensor in place outside autograd
// (under NoGradGuard, so it works on parameters that require grad), draws from `generator` (the
// default generator when null) and returns the tensor.
#pragma once

#include "core/generator.h"
#include "core/tensor.h"

#include <utility>

namespace mf::nn::init {

/// The nonlinearities calculate_gain knows (torch.nn.init.calculate_gain's names).
enum class Nonlinearity { Linear, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };

/// Which fan kaiming_* scales by: fan_in keeps the forward pass's variance, fan_out the backward's.
enum class FanMode { FanIn, FanOut };

/// The recommended gain for a nonlinearity: 1 for linear and sigmoid, 5/3 for tanh, sqrt(2) for ReLU,
/// sqrt(2 / (1 + slope^2)) for leaky ReLU (`param` is the negative slope), 3/4 for SELU.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

/// {fan_in, fan_out} of a weight of shape [out, in, k...]: fan_in = in * prod(k), fan_out =
/// out * prod(k) (the receptive field counts for conv-like shapes). Needs at least 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

/// While one lives (on this thread), the initialisers that draw (uniform_, normal_ and the xavier and
/// kaiming ones built on them, so every layer's constructor) fill their tensor with zeros instead and
/// leave the generator where it was: for a model whose parameters a checkpoint is about to replace,
/// as PyTorch's torch.nn.utils.skip_init. Zeros, not uninitialised memory, so that nothing reads
/// garbage before the load. Drawing is most of building a model; loading a file is a copy.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

/// Fills with U(low, high).
Tensor& uniform_(Tensor& tensor, double low = 0.0, double high = 1.0, Generator* generator = nullptr);
/// Fills with N(mean, std^2).
Tensor& normal_(Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
/// Fills with `value`.
Tensor& constant_(Tensor& tensor, double value);
/// Fills with 0.
Tensor& zeros_(Tensor& tensor);
/// Fills with 1.
Tensor& ones_(Tensor& tensor);

/// Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);
/// Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);
/// He uniform: U(-b, b) with b = sqrt(3) * gain / sqrt(fan), gain = calculate_gain(nonlinearity, a),
/// fan chosen by `mode`. Linear's default is a = sqrt(5), which gives b = 1 / sqrt(fan_in).
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                         Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* generator = nullptr);
/// He normal: N(0, std^2) with std = gain / sqrt(fan), as kaiming_uniform_.
Tensor& kaiming_normal_(Tensor& tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* generator = nullptr);

}  // namespace mf::nn::init
