// Optimizer: the base of SGD, Adam and AdamW. Parameters come in groups, each with its own options
// (lr, weight_decay and the optimizer's own fields), as torch.optim's param_groups. Every parameter
// has state (its step count and named buffers such as "exp_avg") that state_dict() saves, so a
// training run resumes bit for bit.
//
// Updates run under NoGradGuard, skip parameters without a gradient, and write parameters and
// state in place (float32 or float64, on any device), so existing Tensor handles (a Module's) see
// them. State buffers are created like their parameter, on its device.
//
// Each optimizer writes its update formula once, as a template over the value it computes with: a
// CPU element (the fused loop: one pass over memory per parameter) or a whole Tensor (one op per
// term, dispatched to the parameter's device, as torch.optim's single-tensor implementation). CPU
// parameters take the fused loop unless set_fused(false); every other device takes the op form. Both
// round every term to the parameter's dtype in the same order, so on the CPU they agree bit for bit.
#pragma once

#include "core/tensor.h"
#include "nn/module.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mf::optim {

/// A group of parameters sharing one set of options.
template <typename Options>
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

/// The largest step or epoch count a saved optimizer or scheduler state may hold: past 2^53 counts
/// are no longer exact as the doubles the update formulas compute with, and near 2^63 the next
/// increment would overflow. Loading refuses more (and negative counts).
inline constexpr int64_t kMaxStepCount = int64_t{1} << 53;

/// What an optimizer keeps for one parameter: the number of updates it has had and its buffers
/// ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), created on its first update.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};

/// An optimizer's saved state: tensors named "state.<param index>.<buffer>" (the index counts
/// parameters over all groups in order, as PyTorch's state_dict does) and JSON with the optimizer
/// type, each group's options and parameter indices, and each parameter's step count.
struct OptimizerState {
  nn::StateDict tensors;
  std::string json;
};

/// The interface training code and schedulers use, whatever the optimizer.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient (under NoGradGuard). A bfloat16 parameter and
  /// its state (kept in bfloat16, as PyTorch keeps a parameter's state in its dtype) are updated as
  /// PyTorch's fused CPU optimizers update them: read as float32, updated by the float32 rule, each
  /// result rounded to bfloat16 once. Updates smaller than half a bfloat16 step of a weight are lost:
  /// float32 master weights under autocast train more precisely.
  void step();
  /// Drops every parameter's gradient (PyTorch's set_to_none = true).
  void zero_grad();

  /// Whether CPU parameters are updated by the fused per-element loop (the default) or by tensor ops,
  /// as parameters on other devices always are; the results are the same bit for bit.
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }

  /// The optimizer's name as saved in its state ("SGD", "Adam", "AdamW").
  const std::string& name() const { return name_; }
  /// Number of parameter groups.
  virtual size_t num_param_groups() const = 0;
  /// The parameters of group `group`.
  virtual const std::vector<Tensor>& group_params(size_t group) const = 0;
  /// The learning rate of group `group` (schedulers read and write it).
  virtual double lr(size_t group) const = 0;
  /// Sets the learning rate of group `group`.
  virtual void set_lr(size_t group, double lr) = 0;

  /// The state of the parameter at `index` (counting over all groups in order).
  const ParamState& param_state(size_t index) const;
  /// Replaces the state of the parameter at `index` (buffers copied to its dtype and device where they
  /// differ; ParamState{} drops it): a sharded optimizer keeps only its own rank's parameters' states.
  void set_param_state(size_t index, ParamState state);
  /// Copies of the state (tensors cloned, so later steps do not change them) and the options.
  OptimizerState state_dict() const;
  /// Restores what state_dict() returned: options, step counts and buffers (copied into tensors of
  /// each parameter's dtype and device). Throws mf::Error, changing nothing, when the state comes from
  /// another optimizer type, has other group or parameter counts, lacks or has extra tensors, or holds
  /// a buffer whose shape differs from its parameter's.
  void load_state_dict(const OptimizerState& state);

 protected:
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  /// Updates one parameter from its gradient (contiguous, same dtype and device as `param`);
  /// `state.step` has already been incremented. `fused`: update with the CPU per-element loop
  /// (only for CPU tensors); otherwise with tensor ops on the parameter's device.
  virtual void update(size_t group, Tensor& param, const Tensor& grad, ParamState& state, bool fused) = 0;
  /// Group `group`'s options as a JSON object, and back.
  virtual std::string options_json(size_t group) const = 0;
  virtual void set_options_json(size_t group, const std::string& json) = 0;
  /// Checks a new group's parameters (floating, not repeated) and makes room for their state.
  void register_params(const std::vector<Tensor>& params);
  /// Elements per parallel chunk of an update: updates are elementwise, so results do not depend
  /// on the thread count.
  static constexpr int64_t kGrain = 1 << 15;

 private:
  /// Throws mf::Error when the groups' parameter lists were edited behind the optimizer's back.
  void check_param_count() const;
  /// update() on float32 copies of a bfloat16 parameter, its gradient and its state, rounded back.
  void update_in_float32(size_t group, const Tensor& param, const Tensor& grad, ParamState& state);

  std::string name_;
  bool fused_ = true;
  std::vector<ParamState> state_;  // one per parameter, over all groups in order
};

/// Parameter groups with typed options; the concrete optimizers derive from this.
template <typename Options>
class OptimizerWithOptions : public Optimizer {
 public:
  /// Adds a group (its parameters must not already be in the optimizer; its options must pass the
  /// optimizer's validate()).
  void add_param_group(ParamGroup<Options> group) {
    validate(group.options);
    register_params(group.params);
    groups_.push_back(std::move(group));
  }
  /// The groups, options included (changing an option takes effect at the next step). Add
  /// parameters with add_param_group, not by editing a group's list.
  std::vector<ParamGroup<Options>>& param_groups() { return groups_; }
  const std::vector<ParamGroup<Options>>& param_groups() const { return groups_; }

  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& group_params(size_t group) const override { return groups_.at(group).params; }
  double lr(size_t group) const override { return groups_.at(group).options.lr; }
  void set_lr(size_t group, double lr) override { groups_.at(group).options.lr = lr; }

 protected:
  OptimizerWithOptions(std::string name, std::vector<ParamGroup<Options>> groups) : Optimizer(std::move(name)) {
    for (auto& group : groups) add_param_group(std::move(group));
  }
  std::vector<ParamGroup<Options>> groups_;
};

}  // namespace mf::optim
