// The backward engine: runs the recorded nodes reachable from the roots in reverse tape order
// (largest sequence number first, so every node has all its output gradients when it runs),
// sums each gradient back to its input's shape, and accumulates into leaves' .grad.
#include "autograd/autograd.h"

#include "core/graph.h"
#include "core/profiler.h"
#include "ops/anomaly.h"
#include "ops/functional.h"

#include <fmt/ranges.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace mf::autograd {
namespace {

struct LeafHook {
  uint64_t id;
  std::shared_ptr<TensorImpl> leaf;
  std::function<void(Tensor&)> call;
};

/// The post-accumulate-grad hooks of every leaf. Backward looks at them only when there are some, so
/// a program without hooks pays nothing.
struct HookRegistry {
  std::mutex mutex;
  std::vector<LeafHook> hooks;
  std::atomic<size_t> count{0};
  uint64_t next_id = 1;
};

HookRegistry& hook_registry() {
  static HookRegistry registry;
  return registry;
}

/// What one backward does to the leaves' .grad beyond adding into it:
///  - Keeps this call's gradient of a leaf apart from what earlier calls left in its .grad, and adds
///    it to that once whole: old + (this call's sum), the order in which a data-parallel reduction
///    adds one rank's gradient to another's, so that accumulating shares of a batch on one process
///    gives the bits of reducing them over ranks.
///  - Runs the post-accumulate-grad hooks of the hooked leaves it reaches, each once its gradient
///    is whole: when the edges into it counted over the graph before the run have all delivered, or
///    when backward ends for those behind nodes that no gradient reached.
class BackwardLeaves {
 public:
  /// `roots` of a backward() that updates .grad (none for grad(), which leaves .grad alone).
  explicit BackwardLeaves(const std::vector<Tensor>& roots) {
    if (hook_registry().count.load(std::memory_order_acquire) == 0) return;
    {
      std::lock_guard lock(hook_registry().mutex);
      for (const LeafHook& hook : hook_registry().hooks) {
        Waiting& w = waiting_[hook.leaf.get()];
        w.leaf = hook.leaf;
        w.hooks.push_back(hook.call);
      }
    }
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (const Tensor& root : roots) {
      if (auto fn = root.grad_fn()) {
        if (seen.insert(fn.get()).second) stack.push_back(fn.get());
      } else {
        count_edge(root.impl_ptr().get());
      }
    }
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& edge : node->next_edges) {
        if (edge.node && seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
        if (edge.leaf) count_edge(edge.leaf.get());
      }
    }
    std::erase_if(waiting_, [](const auto& entry) { return entry.second.edges == 0; });
  }

  /// Backward failed: the leaves keep what earlier calls left plus what this one added.
  ~BackwardLeaves() {
    for (auto& [leaf, earlier] : earlier_) settle(*leaf, earlier);
  }
  BackwardLeaves(const BackwardLeaves&) = delete;
  BackwardLeaves& operator=(const BackwardLeaves&) = delete;

  /// Before this backward first reads or writes `leaf`'s .grad: sets aside what earlier calls left.
  void touch(TensorImpl& leaf) {
    if (!touched_.insert(&leaf).second) return;
    Tensor& slot = leaf.autograd->grad;
    if (slot.defined()) earlier_.emplace(&leaf, std::move(slot));
    slot = Tensor();
  }

  /// An edge into `leaf` has delivered its gradient (or none).
  void arrived(TensorImpl& leaf) {
    if (waiting_.empty()) return;
    auto it = waiting_.find(&leaf);
    if (it == waiting_.end() || --it->second.edges > 0) return;
    Waiting ready = std::move(it->second);
    waiting_.erase(it);
    run_hooks(ready);
  }

  /// Backward is over: every leaf has all the gradient it will get.
  void finish() {
    std::vector<Waiting> left;
    for (auto& [impl, w] : waiting_) left.push_back(std::move(w));
    waiting_.clear();
    for (Waiting& w : left) run_hooks(w);
    for (auto& [leaf, earlier] : earlier_) settle(*leaf, earlier);
    earlier_.clear();
  }

 private:
  struct Waiting {
    std::shared_ptr<TensorImpl> leaf;
    std::vector<std::function<void(Tensor&)>> hooks;
    int64_t edges = 0;
  };

  void count_edge(const TensorImpl* leaf) {
    auto it = waiting_.find(leaf);
    if (it != waiting_.end()) ++it->second.edges;
  }

  /// .grad = what earlier calls left + this call's gradient.
  static void settle(TensorImpl& leaf, Tensor& earlier) {
    Tensor& slot = leaf.autograd->grad;
    if (slot.defined()) earlier.add_(slot);
    slot = std::move(earlier);
  }

  void run_hooks(Waiting& w) {
    auto it = earlier_.find(w.leaf.get());
    if (it != earlier_.end()) {
      settle(*w.leaf, it->second);
      earlier_.erase(it);
    }
    Tensor leaf(w.leaf);
    for (auto& hook : w.hooks) hook(leaf);
  }

  std::unordered_map<const TensorImpl*, Waiting> waiting_;
  std::unordered_set<const TensorImpl*> touched_;
  std::unordered_map<TensorImpl*, Tensor> earlier_;
};

/// True when nothing but `t` sees its memory, so it may be updated in place.
bool owns_storage_alone(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous();
}

/// Whether a gradient of `shape` and `dtype` may be added into `slot` in place.
bool can_add_into(const Tensor& slot, const Shape& shape, DType dtype) {
  return owns_storage_alone(slot) && slot.shape() == shape && slot.dtype() == dtype;
}

void accumulate(Tensor& slot, Tensor grad) {
  if (!slot.defined())
    slot = std::move(grad);
  else if (can_add_into(slot, grad.shape(), grad.dtype()))
    slot.add_(grad);
  else
    slot = add(slot, grad);
}

/// Stores the first gradient of a leaf without a copy when nothing else can see it.
void accumulate_into_leaf(TensorImpl& leaf, Tensor grad, BackwardLeaves& leaves) {
  leaves.touch(leaf);
  Tensor& slot = leaf.autograd->grad;
  if (slot.defined()) {
    slot.add_(grad);
    return;
  }
  slot = owns_storage_alone(grad) ? std::move(grad) : grad.clone();
}

std::string describe(const Node& node) {
  std::vector<std::string> shapes;
  for (const Shape& shape : node.input_shapes) shapes.push_back(shape_str(shape));
  return fmt::format("backward of {} (created at {}, inputs {})", node.name(), format_location(node.site),
                     fmt::join(shapes, ", "));
}

/// Anomaly mode: throws when a node's backward turns NaN-free incoming gradients into NaN, or finite
/// ones into inf, in a gradient it passes on (the caller adds the node's op and call site).
void check_gradients(const Node& node, const std::vector<Tensor>& grad_inputs,
                     const std::vector<Tensor>& grad_outputs) {
  std::vector<Tensor> passed_on(grad_inputs.size());
  for (size_t i = 0; i < grad_inputs.size(); ++i)
    if (node.next_edges[i].is_valid()) passed_on[i] = grad_inputs[i];
  std::string found = find_anomaly(passed_on, [&] { return count_nonfinite(grad_outputs); }, "the gradient for input",
                                   "incoming gradient");
  MF_CHECK(found.empty(), "{}", found);
}

/// Runs one node and routes its input gradients along its edges.
void run_node(Node& node, std::vector<Tensor>& grad_outputs, bool retain_graph,
              std::unordered_map<Node*, std::vector<Tensor>>& pending,
              const std::unordered_map<const TensorImpl*, size_t>* captured_leaves, std::vector<Tensor>* captured,
              BackwardLeaves& leaves) {
  for (size_t i = 0; i < grad_outputs.size(); ++i)
    if (!grad_outputs[i].defined() && is_floating(node.output_dtypes[i]) && !node.takes_undefined_grads)
      grad_outputs[i] = zeros(node.output_shapes[i], node.output_dtypes[i], node.device);
  // Gradients already summed for an input that the node may add into in place (a linear layer's
  // dX GEMM then runs with beta = 1, skipping a zeroed buffer and an add; an embedding adds its rows
  // into a tied weight's .grad, which holds only this call's gradient: see BackwardLeaves). Not in
  // anomaly mode, which must see what the node itself produced, nor for grad(), whose leaves keep
  // theirs.
  std::vector<Tensor> sums(node.next_edges.size());
  for (size_t i = 0; i < sums.size() && !is_anomaly_enabled(); ++i) {
    const Edge& edge = node.next_edges[i];
    const Tensor* slot = nullptr;
    if (edge.node) {
      auto it = pending.find(edge.node.get());
      if (it != pending.end() && edge.output_nr < it->second.size()) slot = &it->second[edge.output_nr];
    } else if (edge.leaf && !captured_leaves) {
      leaves.touch(*edge.leaf);
      slot = &edge.leaf->autograd->grad;
    }
    if (slot && slot->defined() && can_add_into(*slot, node.input_shapes[i], node.input_dtypes[i])) sums[i] = *slot;
  }
  std::vector<Tensor> grad_inputs;
  try {
    std::optional<profiler::detail::Scope> profiled;  // the name is built only while a profiler records
    if (profiler::detail::recording())
      profiled.emplace(profiler::EventKind::Backward, node.name(), nullptr, " backward");
    grad_inputs = node.apply(grad_outputs, sums);
    profiled.reset();
    MF_CHECK(grad_inputs.size() == node.next_edges.size(), "returned {} gradients for {} inputs", grad_inputs.size(),
             node.next_edges.size());
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      Tensor& g = grad_inputs[i];
      if (!g.defined() || !node.next_edges[i].is_valid()) continue;
      if (g.shape() != node.input_shapes[i]) g = sum_to(g, node.input_shapes[i]);
      if (g.dtype() != node.input_dtypes[i]) g = g.to(node.input_dtypes[i]);
    }
    if (is_anomaly_enabled()) [[unlikely]]
      check_gradients(node, grad_inputs, grad_outputs);
    // Consumed: dropping them now frees memory early, and a gradient that is a view of one (the
    // transpose in linear's x @ W^T) then owns its storage alone and reaches a leaf without a copy.
    grad_outputs.clear();
  } catch (const Error& error) {
    throw Error(fmt::format("{}: {}", describe(node), error.what()));
  }
  // A gradient the node added into its sum is in the slot already: nothing to route. Then the extra
  // handles go, so that the routing below may still add into those slots in place.
  for (size_t i = 0; i < sums.size(); ++i)
    if (sums[i].defined() && grad_inputs[i].is_same(sums[i])) grad_inputs[i] = Tensor();
  sums.clear();
  if (!retain_graph) node.release_saved();
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    const Edge& edge = node.next_edges[i];
    Tensor& g = grad_inputs[i];
    if (edge.node) {
      if (!g.defined()) continue;
      auto& slots = pending[edge.node.get()];
      slots.resize(edge.node->num_outputs);
      accumulate(slots[edge.output_nr], std::move(g));
    } else if (edge.leaf && captured_leaves) {
      auto it = captured_leaves->find(edge.leaf.get());
      if (g.defined() && it != captured_leaves->end()) accumulate((*captured)[it->second], std::move(g));
    } else if (edge.leaf) {
      if (g.defined()) accumulate_into_leaf(*edge.leaf, std::move(g), leaves);
      leaves.arrived(*edge.leaf);
    }
  }
}

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

/// The shared walk behind backward() and grad(). With `captured_leaves`, gradients of those leaves
/// are collected into `captured` instead of .grad, and other leaves are left alone.
void execute(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph,
             const std::unordered_map<const TensorImpl*, size_t>* captured_leaves, std::vector<Tensor>* captured) {
  NoGradGuard no_grad;
  BackwardScope in_backward;
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  std::unordered_set<Node*> queued;
  std::vector<std::shared_ptr<Node>> keep_alive;  // nodes stay valid even if a root handle drops them
  BackwardLeaves leaves(captured_leaves ? std::vector<Tensor>{} : roots);
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    Tensor g = root_grads[r];
    if (auto fn = root.grad_fn()) {
      auto& slots = pending[fn.get()];
      slots.resize(fn->num_outputs);
      accumulate(slots[root.autograd_meta().output_nr], std::move(g));
      if (queued.insert(fn.get()).second) {
        ready.push(fn.get());
        keep_alive.push_back(fn);
      }
    } else if (captured_leaves) {
      auto it = captured_leaves->find(root.impl_ptr().get());
      if (it != captured_leaves->end()) accumulate((*captured)[it->second], std::move(g));
    } else {
      accumulate_into_leaf(root.impl(), std::move(g), leaves);
      leaves.arrived(root.impl());
    }
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(pending[node]);
    pending.erase(node);
    grads.resize(node->num_outputs);
    run_node(*node, grads, retain_graph, pending, captured_leaves, captured, leaves);
    for (const Edge& edge : node->next_edges)
      if (edge.node && pending.count(edge.node.get()) && queued.insert(edge.node.get()).second) {
        ready.push(edge.node.get());
        keep_alive.push_back(edge.node);
      }
  }
  leaves.finish();
}

Tensor checked_root_grad(const Tensor& root, const Tensor& gradient, const char* api) {
  MF_CHECK(root.defined(), "{}: the tensor is undefined", api);
  MF_CHECK(root.requires_grad(), "{}: the tensor (shape {}) does not require grad and has no grad_fn; call "
           "set_requires_grad() on the inputs you want gradients for", api, shape_str(root.shape()));
  if (!gradient.defined()) {
    MF_CHECK(root.numel() == 1, "{}: a gradient can be created implicitly only for a one-element tensor, got shape "
             "{}; pass the gradient explicitly", api, shape_str(root.shape()));
    return ones(root.shape(), root.dtype(), root.device());
  }
  MF_CHECK(gradient.shape() == root.shape(), "{}: gradient of shape {} does not match the tensor's shape {}", api,
           shape_str(gradient.shape()), shape_str(root.shape()));
  return gradient.to(root.dtype()).to(root.device());
}

}  // namespace

HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(Tensor& leaf)> hook) {
  MF_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(),
           "register_post_accumulate_grad_hook: expects a leaf tensor that requires grad");
  MF_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: the hook is empty");
  HookRegistry& registry = hook_registry();
  std::lock_guard lock(registry.mutex);
  uint64_t id = registry.next_id++;
  registry.hooks.push_back({id, leaf.impl_ptr(), std::move(hook)});
  registry.count.store(registry.hooks.size(), std::memory_order_release);
  return HookHandle(id);
}

void HookHandle::remove() {
  if (id_ == 0) return;
  HookRegistry& registry = hook_registry();
  std::lock_guard lock(registry.mutex);
  std::erase_if(registry.hooks, [&](const LeafHook& hook) { return hook.id == id_; });
  registry.count.store(registry.hooks.size(), std::memory_order_release);
  id_ = 0;
}

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph) {
  MF_CHECK(gradients.empty() || gradients.size() == roots.size(), "backward: {} gradients for {} tensors",
           gradients.size(), roots.size());
  std::vector<Tensor> root_grads;
  for (size_t r = 0; r < roots.size(); ++r)
    root_grads.push_back(checked_root_grad(roots[r], gradients.empty() ? Tensor() : gradients[r], "backward"));
  execute(roots, root_grads, retain_graph, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  std::unordered_map<const TensorImpl*, size_t> wanted;
  for (size_t i = 0; i < inputs.size(); ++i) {
    MF_CHECK(inputs[i].requires_grad() && inputs[i].is_leaf(),
             "grad: input {} must be a leaf that requires grad (shape {})", i, shape_str(inputs[i].shape()));
    wanted[inputs[i].impl_ptr().get()] = i;
  }
  std::vector<Tensor> root_grads;
  for (size_t r = 0; r < outputs.size(); ++r)
    root_grads.push_back(checked_root_grad(outputs[r], grad_outputs.empty() ? Tensor() : grad_outputs[r], "grad"));
  std::vector<Tensor> captured(inputs.size());
  execute(outputs, root_grads, retain_graph, &wanted, &captured);
  for (size_t i = 0; i < inputs.size(); ++i)
    MF_CHECK(allow_unused || captured[i].defined(),
             "grad: input {} (shape {}) is not connected to the outputs; pass allow_unused = true", i,
             shape_str(inputs[i].shape()));
  return captured;
}

}  // namespace mf::autograd

namespace mf {

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{}, retain_graph);
}

}  // namespace mf
