// Loss functions, as functions and as modules holding their options (PyTorch's torch.nn.functional
// losses and torch.nn.*Loss). All are built from differentiable ops, so autograd reaches the input
// (and, where PyTorch allows it, the target).
//
// The class dimension is the last one ([..., C] with targets [...]), as in mf::cross_entropy;
// PyTorch puts it second for inputs of more than two dims.
//
//   nn::CrossEntropyLoss criterion({.ignore_index = 0, .label_smoothing = 0.1});
//   Tensor loss = criterion(logits, targets);  // logits [B, T, V], targets [B, T]
#pragma once

#include "core/tensor.h"
#include "nn/module.h"
#include "ops/functional.h"

#include <cstdint>
#include <string>
#include <utility>

namespace mf::nn {

using mf::Reduction;

/// "none", "mean" or "sum".
std::string reduction_name(Reduction reduction);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;  // targets equal to this contribute nothing and are not counted
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

struct NLLLossOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
};

struct MSELossOptions {
  Reduction reduction = Reduction::Mean;
};

struct BCEWithLogitsOptions {
  /// Weight of the positive term per class (broadcast against the input's last dim), or undefined.
  Tensor pos_weight = {};
  Reduction reduction = Reduction::Mean;
};

/// Cross-entropy of logits [..., C] against int64 class indices [...]: mf::cross_entropy with the
/// options (ignore_index, label smoothing as PyTorch defines it, reduction; mean divides by the number
/// of targets not ignored).
Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options = {},
                     Site site = Site::current());

/// Negative log-likelihood of log-probabilities [..., C] against int64 class indices [...]:
/// loss_i = -input[i, target_i], 0 where target_i == ignore_index. Mean divides by the number of
/// targets not ignored (nan when all are). Targets outside [0, C) that are not ignored are an error.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {},
                Site site = Site::current());

/// Squared error (input - target)^2 of two same-shaped float tensors, reduced.
Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossOptions& options = {},
                Site site = Site::current());

/// Binary cross-entropy of logits x against probabilities y of the same shape, computed stably:
/// without pos_weight max(x, 0) - x y + log(1 + exp(-|x|)); with pos_weight p, PyTorch's
/// (1 - y) x + (1 + (p - 1) y) log(1 + exp(-x)). Its gradient in x is sigmoid(x) - y (times the
/// weights), exact at x = 0 too.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsOptions& options = {}, Site site = Site::current());

/// "ignore_index=-100, label_smoothing=0, reduction=mean": the options as module printing shows them.
std::string describe(const CrossEntropyOptions& options);
std::string describe(const NLLLossOptions& options);
std::string describe(const MSELossOptions& options);
std::string describe(const BCEWithLogitsOptions& options);

/// The module form of a loss function: holds its options and applies `Function` with them.
template <typename LossOptions, Tensor (*Function)(const Tensor&, const Tensor&, const LossOptions&, Site)>
class Loss : public Module {
 public:
  using Options = LossOptions;
  using Module::forward;
  /// The loss of `input` against `target` with this module's options.
  Tensor forward(const Tensor& input, const Tensor& target, Site site = Site::current()) const {
    return Function(input, target, options_, site);
  }
  /// Same as forward(input, target).
  Tensor operator()(const Tensor& input, const Tensor& target, Site site = Site::current()) const {
    return forward(input, target, site);
  }
  const LossOptions& options() const { return options_; }
  std::string extra_repr() const override { return describe(options_); }

 protected:
  Loss(std::string type_name, LossOptions options) : Module(std::move(type_name)), options_(std::move(options)) {}
  LossOptions options_;
};

/// nn.CrossEntropyLoss: logits [..., C] against class indices [...].
class CrossEntropyLossImpl : public Loss<CrossEntropyOptions, cross_entropy> {
 public:
  explicit CrossEntropyLossImpl(CrossEntropyOptions options = {}) : Loss("CrossEntropyLoss", options) {}
};
MF_MODULE(CrossEntropyLoss);

/// nn.NLLLoss: log-probabilities [..., C] against class indices [...].
class NLLLossImpl : public Loss<NLLLossOptions, nll_loss> {
 public:
  explicit NLLLossImpl(NLLLossOptions options = {}) : Loss("NLLLoss", options) {}
};
MF_MODULE(NLLLoss);

/// nn.MSELoss: squared error of same-shaped tensors.
class MSELossImpl : public Loss<MSELossOptions, mse_loss> {
 public:
  explicit MSELossImpl(MSELossOptions options = {}) : Loss("MSELoss", options) {}
};
MF_MODULE(MSELoss);

/// nn.BCEWithLogitsLoss: logits against target probabilities of the same shape. A pos_weight is
/// registered as the buffer "pos_weight" (as in PyTorch), so it moves with to() and is saved.
class BCEWithLogitsLossImpl : public Loss<BCEWithLogitsOptions, binary_cross_entropy_with_logits> {
 public:
  explicit BCEWithLogitsLossImpl(BCEWithLogitsOptions options = {});
};
MF_MODULE(BCEWithLogitsLoss);

}  // namespace mf::nn
