// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_. Parameters without a
// gradient are skipped; gradients are changed in place.
#pragma once

#include "core/tensor.h"

#include <limits>
#include <vector>

namespace mf::optim {

/// The value to pass as norm_type for the max-norm.
inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

/// Scales all gradients together so that their joint norm is at most max_norm, and returns the
/// norm before clipping. The norm is computed in double over every element of every gradient:
/// (sum |g|^p)^(1/p) for norm_type p > 0, max |g| for kInfNorm; CPU gradients in fixed runs of
/// elements split over the pool (the same bits on any number of threads), others on their device.
/// As PyTorch does, the gradients are multiplied by min(1, max_norm / (norm + 1e-6)).
/// A non-finite norm (an inf or NaN in some gradient) throws mf::Error when error_if_nonfinite is set.
/// Otherwise it is handled as PyTorch's default (error_if_nonfinite = false): the scale is then 0 for
/// an inf norm (finite entries become 0, infinite ones NaN) and NaN for a NaN norm (everything NaN),
/// so the caller sees the problem in the returned norm and can skip the step.
/// Throws mf::Error on norm_type <= 0 or max_norm < 0.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

namespace detail {
/// Each gradient's sum of |g|^p (max |g| for infinite p, NaN where some element is NaN), reduced in
/// float64 by ops on the gradient's own device and copied to the host together: clip_grad_norm_'s
/// terms for gradients off the CPU, whose elements it would otherwise copy to the host.
std::vector<double> norm_terms_where_they_are(const std::vector<Tensor>& grads, double p);
}  // namespace detail

/// Clamps every gradient element to [-clip_value, clip_value]. Throws mf::Error on clip_value < 0.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace mf::optim
