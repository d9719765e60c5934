#include "optim/clip.h"

#include "core/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace mf::optim {

namespace {

/// Sum of |g|^p over `grad` (p finite), or max |g| (p infinite, NaN if any element is NaN).
double accumulate_norm(const Tensor& grad, double p, double acc) {
  Tensor g = grad.to(Device::cpu()).contiguous();
  visit_floating(g.dtype(), [&]<typename T>() {
    const T* data = g.data_ptr<T>();
    for (int64_t i = 0, n = g.numel(); i < n; ++i) {
      double a = std::abs(static_cast<double>(data[i]));
      if (std::isinf(p)) acc = std::isnan(a) || std::isnan(acc) ? NAN : std::max(acc, a);
      else acc += p == 2 ? a * a : p == 1 ? a : std::pow(a, p);
    }
  });
  return acc;
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  MF_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or kInfNorm), got {}", norm_type);
  MF_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  double acc = 0;
  size_t first_nonfinite = grads.size();  // the gradient that made the norm non-finite, for the message
  for (size_t i = 0; i < grads.size(); ++i) {
    acc = accumulate_norm(grads[i], norm_type, acc);
    if (first_nonfinite == grads.size() && !std::isfinite(acc)) first_nonfinite = i;
  }
  double total = std::isinf(norm_type) ? acc : norm_type == 2 ? std::sqrt(acc) : std::pow(acc, 1 / norm_type);
  if (error_if_nonfinite && !std::isfinite(total)) [[unlikely]] {
    // For norm_type < 1 the sum can stay finite while its root overflows: then no gradient is to blame.
    std::string source = first_nonfinite < grads.size()
                             ? fmt::format("from gradient {} of {}, shape {}", first_nonfinite, grads.size(),
                                           shape_str(grads[first_nonfinite].shape()))
                             : "the root of a finite sum overflowed";
    fail("clip_grad_norm_: the total {}-norm of the gradients is {} ({}), so it cannot be clipped; pass "
         "error_if_nonfinite = false to scale by it anyway",
         norm_type, total, source);
  }
  double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1))  // also when coef is NaN, which then spreads to the gradients as in PyTorch
    for (Tensor& g : grads) g.mul_(coef);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  MF_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be >= 0, got {}", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(g.clamp(-clip_value, clip_value));
  }
}

}  // namespace mf::optim
