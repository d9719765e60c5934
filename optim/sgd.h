// Stochastic gradient descent with momentum, as torch.optim.SGD:
//   g = grad + weight_decay * p
//   b = g on the first step, else momentum * b + (1 - dampening) * g     (when momentum != 0)
//   g = nesterov ? g + momentum * b : b                                  (when momentum != 0)
//   p = p - lr * g
#pragma once

#include "optim/optimizer.h"

namespace mf::optim {

/// SGD's options (PyTorch's defaults, except that lr must be given).
struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

/// Throws mf::Error naming the bad option (negative lr, momentum, dampening or weight decay; nesterov
/// without momentum or with dampening).
void validate(const SGDOptions& options);

class SGD : public OptimizerWithOptions<SGDOptions> {
 public:
  /// One group of `params` (options checked by validate()).
  SGD(std::vector<Tensor> params, SGDOptions options);
  /// Several groups, each with its own options.
  explicit SGD(std::vector<ParamGroup<SGDOptions>> groups);

 protected:
  void update(size_t group, Tensor& param, const Tensor& grad, ParamState& state, bool fused) override;
  std::string options_json(size_t group) const override;
  void set_options_json(size_t group, const std::string& json) override;
};

}  // namespace mf::optim
