#include "optim/clip.h"

#include "core/graph.h"
#include "core/parallel.h"
#include "ops/functional.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace mf::optim {

namespace {

/// Elements of a gradient summed as one term: terms are fixed runs of the flat gradient, so the norm
/// has the same bits on any number of threads.
constexpr int64_t kTermElements = int64_t{1} << 15;

/// acc combined with a term: their sum for finite p, their max (NaN if either is) for infinite p.
double combine(double acc, double term, double p) {
  if (!std::isinf(p)) return acc + term;
  return std::isnan(acc) || std::isnan(term) ? NAN : std::max(acc, term);
}

/// Sum of |x|^p over n elements (p finite), or max |x| (p infinite, NaN if any element is NaN), in
/// double; finite p sums into four accumulators in turn, which the loop can keep in flight at once.
template <typename T>
double run_term(const T* x, int64_t n, double p) {
  if (std::isinf(p)) {
    double largest = 0;
    for (int64_t i = 0; i < n; ++i) largest = combine(largest, std::abs(static_cast<double>(x[i])), p);
    return largest;
  }
  auto power = [p](double a) { return p == 2 ? a * a : p == 1 ? a : std::pow(a, p); };
  double sums[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int lane = 0; lane < 4; ++lane) sums[lane] += power(std::abs(static_cast<double>(x[i + lane])));
  for (; i < n; ++i) sums[0] += power(std::abs(static_cast<double>(x[i])));
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

/// The terms of the CPU gradients among `grads` (none for the others), each gradient's runs of
/// kTermElements in order, all of them split over the pool at once: a model's many small gradients
/// cost one parallel_for, not one each.
std::vector<std::vector<double>> cpu_terms(const std::vector<Tensor>& grads, double p) {
  struct Run {
    size_t grad;
    int64_t first;
  };
  std::vector<Tensor> flat(grads.size());
  std::vector<std::vector<double>> terms(grads.size());
  std::vector<Run> runs;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].device().is_cpu()) continue;
    flat[i] = grads[i].contiguous();
    for (int64_t first = 0; first < flat[i].numel(); first += kTermElements) runs.push_back({i, first});
    terms[i].resize(static_cast<size_t>((flat[i].numel() + kTermElements - 1) / kTermElements));
  }
  parallel_for(0, static_cast<int64_t>(runs.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const auto [grad, first] = runs[static_cast<size_t>(r)];
      const Tensor& g = flat[grad];
      visit_floating(g.dtype(), [&]<typename T>() {
        terms[grad][static_cast<size_t>(first / kTermElements)] =
            run_term(g.data_ptr<T>() + first, std::min(kTermElements, g.numel() - first), p);
      });
    }
  });
  return terms;
}

}  // namespace

std::vector<double> detail::norm_terms_where_they_are(const std::vector<Tensor>& grads, double p) {
  std::vector<Tensor> parts;  // one per non-empty gradient (amax keeps NaNs on every device, as PyTorch's)
  for (const Tensor& grad : grads) {
    if (grad.numel() == 0) continue;
    const Tensor magnitude = grad.to(DType::Float64).abs();
    const Tensor term = std::isinf(p) ? magnitude.max()
                        : p == 2      ? (magnitude * magnitude).sum()
                        : p == 1      ? magnitude.sum()
                                      : magnitude.pow(p).sum();
    parts.push_back(term.reshape({1}));
  }
  const std::vector<double> values =
      parts.empty() ? std::vector<double>{} : cat(parts).to(Device::cpu()).to_vector<double>();
  std::vector<double> terms;
  for (size_t i = 0, next = 0; i < grads.size(); ++i) terms.push_back(grads[i].numel() == 0 ? 0 : values[next++]);
  return terms;
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  MF_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or kInfNorm), got {}", norm_type);
  MF_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  // Each gradient's terms: CPU ones in runs over the pool; those on a GPU reduced there, one term
  // each, and copied back together.
  std::vector<std::vector<double>> terms = cpu_terms(grads, norm_type);
  std::vector<Tensor> elsewhere;
  std::vector<size_t> elsewhere_at;
  for (size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].device().is_cpu()) {
      elsewhere.push_back(grads[i]);
      elsewhere_at.push_back(i);
    }
  const std::vector<double> elsewhere_terms = detail::norm_terms_where_they_are(elsewhere, norm_type);
  for (size_t k = 0; k < elsewhere_at.size(); ++k) terms[elsewhere_at[k]] = {elsewhere_terms[k]};
  double acc = 0;
  size_t first_nonfinite = grads.size();  // the gradient that made the norm non-finite, for the message
  for (size_t i = 0; i < grads.size(); ++i) {
    for (double term : terms[i]) acc = combine(acc, term, norm_type);
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
