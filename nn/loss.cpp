#include "nn/loss.h"

#include <fmt/format.h>

namespace mf::nn {

namespace {

// N = number of predictions (all dims but the last, flattened), C = classes.

Tensor reduce(const Tensor& losses, Reduction reduction, Site site) {
  switch (reduction) {
    case Reduction::None: return losses;
    case Reduction::Sum: return losses.sum({}, false, site);
    case Reduction::Mean: break;
  }
  return losses.mean({}, false, site);
}

void check_floating(std::string_view op, std::string_view what, const Tensor& t, Site site) {
  MF_CHECK(t.defined() && is_floating(t.dtype()), "{}: {} must be a float32 or float64 tensor, got {} at {}", op,
           what, t.defined() ? fmt::format("{} of shape {}", dtype_name(t.dtype()), shape_str(t.shape())) : "undefined",
           format_location(site));
}

void check_same_shape(std::string_view op, const Tensor& input, const Tensor& target, Site site) {
  check_floating(op, "input", input, site);
  check_floating(op, "target", target, site);
  MF_CHECK(input.shape() == target.shape(), "{}: target of shape {} does not match input of shape {} at {}", op,
           shape_str(target.shape()), shape_str(input.shape()), format_location(site));
}

// log(1 + exp(z)) = relu(z) + log(1 + exp(-|z|)): exp never overflows. -|z| is written as
// where(z > 0, -z, z) rather than -abs(z) so that the gradient at z = 0 comes out as sigmoid(0) = 1/2
// (relu contributes 0 there, the z branch exp(0) / (1 + exp(0))); with abs, whose derivative is 0 at
// 0, it would be 0 and a zero-initialised logit would get a wrong gradient.
Tensor softplus(const Tensor& z, Site site) {
  Tensor minus_abs = where(z.gt(zeros_like(z), site), z.neg(site), z, site);
  return z.relu(site).add(minus_abs.exp(site).add(1.0, site).log(site), site);
}

}  // namespace

std::string reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options, Site site) {
  return mf::cross_entropy(input, target, options.ignore_index, options.label_smoothing, options.reduction, site);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options, Site site) {
  check_floating("nll_loss", "input (log-probabilities [..., C])", input, site);
  MF_CHECK(input.dim() >= 1, "nll_loss: input must have a class dim, got shape {} at {}", shape_str(input.shape()),
           format_location(site));
  const Shape batch(input.shape().begin(), input.shape().end() - 1);  // [...]
  MF_CHECK(target.defined() && target.dtype() == DType::Int64 && target.shape() == batch,
           "nll_loss: target must be int64 class indices of shape {} for input of shape {}, got {} at {}",
           shape_str(batch), shape_str(input.shape()),
           target.defined() ? fmt::format("{} of shape {}", dtype_name(target.dtype()), shape_str(target.shape()))
                            : "undefined",
           format_location(site));
  const int64_t N = shape_numel(batch), C = input.size(-1);
  Tensor flat_target = target.reshape({N}, site);                                      // [N]
  Tensor ignored = flat_target.eq(static_cast<double>(options.ignore_index), site);    // [N]
  // Ignored targets may be out of range (-100): gather class 0 for them, then zero their loss.
  Tensor safe_target = where(ignored, zeros_like(flat_target), flat_target, site);     // [N]
  Tensor picked = gather(input.reshape({N, C}, site), 1, safe_target.unsqueeze(1, site), site).squeeze(1, site);
  Tensor losses = masked_fill(picked.neg(site), ignored, 0.0, site);                   // [N]
  switch (options.reduction) {
    case Reduction::None: return losses.reshape(batch, site);
    case Reduction::Sum: return losses.sum({}, false, site);
    case Reduction::Mean: break;
  }
  // PyTorch's mean: over the targets that count (0 / 0 = nan when every target is ignored).
  Tensor counted = ignored.logical_not(site).to(input.dtype(), site).sum({}, false, site);
  return losses.sum({}, false, site).div(counted, site);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossOptions& options, Site site) {
  check_same_shape("mse_loss", input, target, site);
  Tensor diff = input.sub(target, site);
  return reduce(diff.mul(diff, site), options.reduction, site);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsOptions& options, Site site) {
  check_same_shape("binary_cross_entropy_with_logits", input, target, site);
  // PyTorch: loss = (1 - y) x + w log(1 + exp(-x)) with w = 1 + (pos_weight - 1) y, or w = 1. For
  // w = 1 this is max(x, 0) - x y + log(1 + exp(-|x|)), since x + softplus(-x) = softplus(x).
  Tensor linear = input.sub(input.mul(target, site), site);  // (1 - y) x
  Tensor log_term = softplus(input.neg(site), site);         // log(1 + exp(-x))
  if (options.pos_weight.defined()) {
    check_floating("binary_cross_entropy_with_logits", "pos_weight", options.pos_weight, site);
    Tensor weight = options.pos_weight.sub(1.0, site).mul(target, site).add(1.0, site);
    log_term = log_term.mul(weight, site);
  }
  return reduce(linear.add(log_term, site), options.reduction, site);
}

std::string describe(const CrossEntropyOptions& options) {
  return fmt::format("ignore_index={}, label_smoothing={}, reduction={}", options.ignore_index,
                     options.label_smoothing, reduction_name(options.reduction));
}

std::string describe(const NLLLossOptions& options) {
  return fmt::format("ignore_index={}, reduction={}", options.ignore_index, reduction_name(options.reduction));
}

std::string describe(const MSELossOptions& options) {
  return fmt::format("reduction={}", reduction_name(options.reduction));
}

std::string describe(const BCEWithLogitsOptions& options) {
  if (!options.pos_weight.defined()) return fmt::format("reduction={}", reduction_name(options.reduction));
  return fmt::format("pos_weight={}, reduction={}", shape_str(options.pos_weight.shape()),
                     reduction_name(options.reduction));
}

BCEWithLogitsLossImpl::BCEWithLogitsLossImpl(BCEWithLogitsOptions options) : Loss("BCEWithLogitsLoss", std::move(options)) {
  if (options_.pos_weight.defined()) options_.pos_weight = register_buffer("pos_weight", options_.pos_weight);
}

}  // namespace mf::nn
