#include "optim/optimizer.h"

#include "core/format.h"
#include "core/graph.h"
#include "core/json_brief.h"
#include "ops/functional.h"

#include <nlohmann/json.hpp>

#include <set>

namespace mf::optim {

using json = nlohmann::json;

void Optimizer::register_params(const std::vector<Tensor>& params) {
  std::set<const TensorImpl*> seen;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) seen.insert(&p.impl());
  for (const Tensor& p : params) {
    MF_CHECK(p.defined(), "{}: parameter group holds an undefined tensor", name_);
    MF_CHECK(p.dtype() == DType::Float32 || p.dtype() == DType::Float64 || p.dtype() == DType::BFloat16,
             "{}: can only optimize float32, float64 or bfloat16 tensors, got a {} parameter of shape {}", name_,
             dtype_name(p.dtype()), shape_str(p.shape()));
    MF_CHECK(seen.insert(&p.impl()).second, "{}: a parameter of shape {} appears in more than one place", name_,
             shape_str(p.shape()));
  }
  state_.resize(state_.size() + params.size());
}

void Optimizer::check_param_count() const {
  size_t count = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) count += group_params(g).size();
  MF_CHECK(count == state_.size(), "{}: the groups hold {} parameters but {} were added; add parameters with "
           "add_param_group", name_, count, state_.size());
}

void Optimizer::step() {
  check_param_count();
  NoGradGuard no_grad;
  size_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : group_params(g)) {
      ParamState& state = state_[index++];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      MF_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
               "{}: parameter {} is {} {} but its gradient is {} {}{}", name_, index - 1, dtype_name(p.dtype()),
               shape_str(p.shape()), dtype_name(grad.dtype()), shape_str(grad.shape()),
               grad.device() == p.device() ? ""
                                           : fmt::format(" (on {}, the parameter on {})", grad.device().str(),
                                                         p.device().str()));
      ++state.step;
      if (p.dtype() == DType::BFloat16) {
        update_in_float32(g, p, grad, state);
        continue;
      }
      // The fused loop writes through raw pointers, so updates work on contiguous data and copy back
      // if needed.
      Tensor work = p.is_contiguous() ? p : p.contiguous();
      update(g, work, grad.contiguous(), state, fused_ && p.device().is_cpu());
      if (work.is_same(p)) {
        p.storage()->bump_version();
      } else {
        Tensor target = p;
        target.copy_(work);
      }
    }
  }
}

void Optimizer::update_in_float32(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) {
  ParamState wide{.step = state.step};
  for (const auto& [name, buffer] : state.buffers) wide.buffers.emplace(name, buffer.to(DType::Float32));
  Tensor work = param.to(DType::Float32);
  update(group, work, grad.to(DType::Float32).contiguous(), wide, fused_ && param.device().is_cpu());
  Tensor target = param;
  target.copy_(work);  // rounded to nearest even, as every buffer below
  for (const auto& [name, buffer] : wide.buffers) {
    auto it = state.buffers.find(name);
    if (it == state.buffers.end())
      state.buffers.emplace(name, buffer.to(param.dtype()));
    else
      it->second.copy_(buffer);
  }
}

void Optimizer::zero_grad() {
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) {
      Tensor handle = p;
      handle.set_grad({});
    }
}

const ParamState& Optimizer::param_state(size_t index) const {
  MF_CHECK(index < state_.size(), "{}: no parameter {} (the optimizer has {})", name_, index, state_.size());
  return state_[index];
}

void Optimizer::set_param_state(size_t index, ParamState state) {
  MF_CHECK(index < state_.size(), "{}: no parameter {} (the optimizer has {})", name_, index, state_.size());
  MF_CHECK(state.step >= 0 && state.step <= kMaxStepCount, "{}: parameter {}'s step count {} is outside [0, 2^53]",
           name_, index, state.step);
  const Tensor* param = nullptr;
  for (size_t g = 0, first = 0; g < num_param_groups() && !param; first += group_params(g).size(), ++g)
    if (index < first + group_params(g).size()) param = &group_params(g)[index - first];
  for (auto& [buffer, tensor] : state.buffers) {
    MF_CHECK(tensor.shape() == param->shape(), "{}: buffer '{}' of shape {} does not fit parameter {} of shape {}",
             name_, buffer, shape_str(tensor.shape()), index, shape_str(param->shape()));
    if (tensor.dtype() != param->dtype() || tensor.device() != param->device()) {
      Tensor copy = empty_like(*param);
      copy.copy_(tensor);
      tensor = copy;
    }
  }
  state_[index] = std::move(state);
}

OptimizerState Optimizer::state_dict() const {
  check_param_count();
  OptimizerState out;
  json groups = json::array(), states = json::array();
  size_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    json indices = json::array();
    for (size_t i = 0; i < group_params(g).size(); ++i) indices.push_back(index++);
    groups.push_back({{"options", json::parse(options_json(g))}, {"params", indices}});
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    json buffers = json::array();
    for (const auto& [buffer, tensor] : state_[i].buffers) {
      buffers.push_back(buffer);
      out.tensors.push_back({fmt::format("state.{}.{}", i, buffer), tensor.detach().clone()});
    }
    states.push_back({{"step", state_[i].step}, {"buffers", buffers}});
  }
  out.json = json{{"optimizer", name_}, {"param_groups", groups}, {"state", states}}.dump();
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& saved) {
  check_param_count();
  std::vector<Tensor> params;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) params.push_back(p);
  std::vector<ParamState> state(params.size());
  std::vector<std::string> options;
  try {
    json j = json::parse(saved.json);
    MF_CHECK(j.at("optimizer").get<std::string>() == name_, "{}::load_state_dict: the state is from {}", name_,
             j.at("optimizer").get<std::string>());
    const json& groups = j.at("param_groups");
    MF_CHECK(groups.size() == num_param_groups(), "{}::load_state_dict: the state has {} parameter groups, the "
             "optimizer {}", name_, groups.size(), num_param_groups());
    for (size_t g = 0; g < groups.size(); ++g) {
      size_t n = groups[g].at("params").size();
      MF_CHECK(n == group_params(g).size(), "{}::load_state_dict: group {} has {} parameters in the state, {} in the "
               "optimizer", name_, g, n, group_params(g).size());
      // Options are flat ({"betas": [0.9, 0.999]}); anything deeper is corrupt, and too deep to dump.
      MF_CHECK(!detail::nests_deeper_than(groups[g].at("options"), 2),
               "{}::load_state_dict: the options of group {} nest deeper than options do", name_, g);
      options.push_back(groups[g].at("options").dump());
    }
    const json& states = j.at("state");
    MF_CHECK(states.size() == params.size(), "{}::load_state_dict: the state has {} parameters, the optimizer {}",
             name_, states.size(), params.size());
    size_t expected_tensors = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      state[i].step = states[i].at("step").get<int64_t>();
      MF_CHECK(state[i].step >= 0 && state[i].step <= kMaxStepCount,
               "{}::load_state_dict: parameter {} has step count {}, outside [0, 2^53]", name_, i, state[i].step);
      for (const std::string& buffer : states[i].at("buffers").get<std::vector<std::string>>()) {
        std::string key = fmt::format("state.{}.{}", i, buffer);
        const Tensor* tensor = nn::find(saved.tensors, key);
        MF_CHECK(tensor != nullptr, "{}::load_state_dict: tensor '{}' is missing", name_, key);
        MF_CHECK(tensor->shape() == params[i].shape(), "{}::load_state_dict: '{}' has shape {} but parameter {} has "
                 "shape {}", name_, key, shape_str(tensor->shape()), i, shape_str(params[i].shape()));
        Tensor copy = empty_like(params[i]);
        copy.copy_(*tensor);
        state[i].buffers[buffer] = copy;
        ++expected_tensors;
      }
    }
    MF_CHECK(saved.tensors.size() == expected_tensors, "{}::load_state_dict: the state holds {} tensors, its JSON "
             "lists {}", name_, saved.tensors.size(), expected_tensors);
  } catch (const json::exception& e) {
    fail("{}::load_state_dict: malformed state JSON: {}", name_, e.what());
  }
  std::vector<std::string> previous;
  for (size_t g = 0; g < num_param_groups(); ++g) previous.push_back(options_json(g));
  try {
    for (size_t g = 0; g < options.size(); ++g) set_options_json(g, options[g]);
  } catch (const std::exception& e) {
    for (size_t g = 0; g < previous.size(); ++g) set_options_json(g, previous[g]);
    fail("{}::load_state_dict: bad group options: {}", name_, e.what());
  }
  state_ = std::move(state);
}

}  // namespace mf::optim
