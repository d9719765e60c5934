// Adam and AdamW, as torch.optim.Adam / torch.optim.AdamW (Kingma & Ba; Loshchilov & Hutter). With
// t the parameter's step count:
//   Adam:  g = grad + weight_decay * p                  (L2 penalty added to the gradient)
//   AdamW: p = p * (1 - lr * weight_decay)              (decoupled decay, before the moments)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   v_hat = amsgrad ? (v_max = max(v_max, v)) : v
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
#pragma once

#include "optim/optimizer.h"

namespace mf::optim {

/// Adam's options; `Decoupled` selects AdamW, whose default weight decay is 0.01 (Adam's is 0).
template <bool Decoupled>
struct AdamOptionsT {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = Decoupled ? 0.01 : 0.0;
  bool amsgrad = false;
};
using AdamOptions = AdamOptionsT<false>;
using AdamWOptions = AdamOptionsT<true>;

/// Throws mf::Error naming the bad option (negative lr, eps or weight decay; a beta outside [0, 1)).
template <bool Decoupled>
void validate(const AdamOptionsT<Decoupled>& options);

/// Adam (Decoupled = false) or AdamW (Decoupled = true); use the aliases Adam and AdamW.
template <bool Decoupled>
class BasicAdam : public OptimizerWithOptions<AdamOptionsT<Decoupled>> {
 public:
  using Options = AdamOptionsT<Decoupled>;
  /// One group of `params` (options checked by validate()).
  BasicAdam(std::vector<Tensor> params, Options options);
  /// Several groups, each with its own options.
  explicit BasicAdam(std::vector<ParamGroup<Options>> groups);

 protected:
  void update(size_t group, Tensor& param, const Tensor& grad, ParamState& state, bool fused) override;
  std::string options_json(size_t group) const override;
  void set_options_json(size_t group, const std::string& json) override;
};

using Adam = BasicAdam<false>;
using AdamW = BasicAdam<true>;

extern template class BasicAdam<false>;
extern template class BasicAdam<true>;

}  // namespace mf::optim
