// Reverse-mode automatic differentiation over the graph that ops record (define-by-run).
#pragma once

#include "core/graph.h"
#include "core/tensor.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mf::autograd {

/// Backpropagates from `roots` (scalars, or with one gradient each), accumulating into the .grad of
/// every leaf that requires grad. The graph's saved tensors are freed unless retain_graph.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients = {},
              bool retain_graph = false);

/// Gradients of `outputs` with respect to the leaves `inputs`, returned instead of accumulated into
/// .grad (torch.autograd.grad). An input the outputs do not depend on is an error unless allow_unused,
/// which returns an undefined tensor for it.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

/// Keeps a hook registered by register_post_accumulate_grad_hook; destroying it removes the hook.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(uint64_t id) : id_(id) {}
  HookHandle(HookHandle&& other) noexcept : id_(std::exchange(other.id_, 0)) {}
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  ~HookHandle() { remove(); }
  void remove();

 private:
  uint64_t id_ = 0;
};

/// Calls hook(leaf) in every backward() once `leaf`'s .grad holds all the gradient that backward gives it
/// (PyTorch's register_post_accumulate_grad_hook): data-parallel training starts reducing a gradient
/// there while the rest of backward still runs. Every leaf the backward graph reaches is called once,
/// at the latest when backward ends (the .grad may then be undefined: no gradient flowed); leaves it
/// does not reach are not called. grad(), which leaves .grad alone, calls no hook. Hooks run on the
/// thread that runs backward.
[[nodiscard]] HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(Tensor& leaf)> hook);

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-7;
  double rtol = 1e-5;
};

/// Compares the analytic gradient of fn with central finite differences, in float64: the scalar is
/// sum_k <fn(inputs)_k, w_k> with fixed random weights w_k, so every output element counts. Checks
/// the float inputs that require grad. Returns an empty string when they agree, else a description
/// of the first disagreement (input, element, analytic and numeric values).
std::string gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace mf::autograd
