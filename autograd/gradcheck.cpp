#include "autograd/autograd.h"

#include "ops/functional.h"
#include "ops/reference.h"

#include <cmath>

namespace mf::autograd {
namespace {

/// sum_k <outputs_k, weights_k> over the float outputs, on the outputs' device.
Tensor weighted_total(const std::vector<Tensor>& outputs, const std::vector<Tensor>& weights) {
  Tensor total = scalar_tensor(0.0, DType::Float64, outputs.empty() ? Device::cpu() : outputs[0].device());
  for (size_t k = 0; k < outputs.size(); ++k)
    if (weights[k].defined()) total = add(total, sum(mul(outputs[k].to(DType::Float64), weights[k])));
  return total;
}

}  // namespace

std::string gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  std::vector<Tensor> checked;
  for (const Tensor& input : inputs)
    if (input.requires_grad()) {
      MF_CHECK(input.dtype() == DType::Float64, "gradcheck: inputs that require grad must be float64, got {}",
               dtype_name(input.dtype()));
      checked.push_back(input);
    }
  if (checked.empty()) return "";

  std::vector<Tensor> outputs = fn(inputs);
  std::vector<Tensor> weights;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    weights.push_back(is_floating(out.dtype()) && out.requires_grad()
                          ? reference::randn(out.shape(), 1234 + k).to(out.device())
                          : Tensor());
  }
  Tensor total = weighted_total(outputs, weights);
  if (!total.requires_grad()) return "gradcheck: no output depends on an input that requires grad";
  std::vector<Tensor> analytic = grad({total}, checked, {}, false, true);

  NoGradGuard no_grad;
  auto evaluate = [&] { return weighted_total(fn(inputs), weights).item<double>(); };
  for (size_t i = 0; i < checked.size(); ++i) {
    Tensor input = checked[i];
    Tensor expected = analytic[i].defined() ? analytic[i].contiguous() : zeros_like(input);
    std::vector<double> analytic_values = expected.to_vector<double>();
    // Perturb through a contiguous-index view of the input's elements, whatever its strides.
    int64_t n = input.numel();
    for (int64_t e = 0; e < n; ++e) {
      Shape index(input.dim());
      for (int64_t d = input.dim() - 1, rest = e; d >= 0; --d) {
        index[d] = rest % input.shape()[d];
        rest /= input.shape()[d];
      }
      Tensor element = input;
      for (int64_t d = 0; d < input.dim(); ++d) element = element.select(0, index[d]);
      double original = element.item<double>();
      element.fill_(original + options.eps);
      double plus = evaluate();
      element.fill_(original - options.eps);
      double minus = evaluate();
      element.fill_(original);
      double numeric = (plus - minus) / (2 * options.eps);
      double a = analytic_values[static_cast<size_t>(e)];
      if (std::abs(a - numeric) > options.atol + options.rtol * std::abs(numeric))
        return format_message("gradient of input {} (shape {}) at {}: analytic {:.10g}, numeric {:.10g}", i,
                           shape_str(input.shape()), shape_str(index), a, numeric);
    }
  }
  return "";
}

}  // namespace mf::autograd
