#include "nn/module.h"

#include "core/graph.h"
#include "ops/functional.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace mf::nn {

const Tensor* find(const StateDict& state, const std::string& name) {
  for (const NamedTensor& entry : state)
    if (entry.name == name) return &entry.tensor;
  return nullptr;
}

std::string LoadReport::str() const {
  std::string text;
  for (const std::string& key : missing) text += fmt::format("\n  missing key: {}", key);
  for (const std::string& key : unexpected) text += fmt::format("\n  unexpected key: {}", key);
  for (const std::string& line : mismatched) text += fmt::format("\n  mismatched: {}", line);
  return text;
}

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  fail("{}: this module has no single-input forward (call its own forward overload)", type_name_);
}

void Module::check_new_name(const std::string& name) const {
  MF_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "{}: '{}' is not a valid name (non-empty, without dots)", type_name_, name);
  auto taken = [&](const auto& list) {
    for (const auto& entry : list)
      if (entry.first == name) return true;
    return false;
  };
  bool used = taken(children_);
  for (const auto& list : {&parameters_, &buffers_})
    for (const NamedTensor& entry : *list) used = used || entry.name == name;
  MF_CHECK(!used, "{}: the name '{}' is registered twice", type_name_, name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name);
  MF_CHECK(tensor.defined(), "{}: parameter '{}' is undefined", type_name_, name);
  if (!tensor.is_leaf()) tensor = tensor.detach();
  if (tensor.requires_grad() != requires_grad) tensor.set_requires_grad(requires_grad);
  parameters_.push_back({name, std::move(tensor)});
  return parameters_.back().tensor;
}

Tensor& Module::replace_parameter(const std::string& name, Tensor tensor) {
  auto entry = std::find_if(parameters_.begin(), parameters_.end(), [&](const NamedTensor& p) { return p.name == name; });
  MF_CHECK(entry != parameters_.end(), "{}: replace_parameter: there is no parameter '{}'", type_name_, name);
  MF_CHECK(tensor.defined(), "{}: replace_parameter: the tensor for '{}' is undefined", type_name_, name);
  entry->tensor = std::move(tensor);
  return entry->tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor, bool persistent) {
  check_new_name(name);
  MF_CHECK(tensor.defined(), "{}: buffer '{}' is undefined", type_name_, name);
  if (!persistent) transient_buffers_.push_back(name);
  buffers_.push_back({name, std::move(tensor)});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  MF_CHECK(module != nullptr, "{}: child module '{}' is null", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

namespace {

void collect(const Module& module, const std::string& prefix, bool recurse, bool want_parameters,
             std::vector<NamedTensor>& out) {
  for (const NamedTensor& entry : want_parameters ? module.named_parameters(false) : module.named_buffers(false))
    out.push_back({prefix + entry.name, entry.tensor});
  if (!recurse) return;
  for (const auto& [name, child] : module.named_children())
    collect(*child, prefix + name + ".", true, want_parameters, out);
}

}  // namespace

std::vector<NamedTensor> Module::named_parameters(bool recurse) const {
  if (!recurse) return parameters_;
  std::vector<NamedTensor> all;
  collect(*this, "", true, true, all);
  // A parameter registered twice (tied weights, a module shared by two parents) is listed once, under
  // its first name, so that optimizers and all-reduces see it once (PyTorch's remove_duplicate).
  std::unordered_set<const TensorImpl*> seen;
  std::vector<NamedTensor> out;
  for (NamedTensor& entry : all)
    if (seen.insert(entry.tensor.impl_ptr().get()).second) out.push_back(std::move(entry));
  return out;
}

std::vector<NamedTensor> Module::named_buffers(bool recurse) const {
  if (!recurse) return buffers_;
  std::vector<NamedTensor> out;
  collect(*this, "", true, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (NamedTensor& entry : named_parameters(recurse)) out.push_back(std::move(entry.tensor));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_)
    for (auto& [path, module] : child->named_modules()) out.emplace_back(path.empty() ? name : name + "." + path, module);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t count = 0;
  for (const Tensor& p : parameters()) count += p.numel();
  return count;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto* list : {&parameters_, &buffers_})
    for (NamedTensor& entry : *list) entry.tensor.set_data(entry.tensor.to(device));
  for (const auto& [name, child] : children_) child->to(device);
}

void Module::to(DType dtype) {
  NoGradGuard no_grad;
  for (auto* list : {&parameters_, &buffers_})
    for (NamedTensor& entry : *list)
      if (is_floating(entry.tensor.dtype())) entry.tensor.set_data(entry.tensor.to(dtype));
  for (const auto& [name, child] : children_) child->to(dtype);
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad({});
}

namespace {

void collect_state(const Module& module, const std::string& prefix, StateDict& state) {
  for (const NamedTensor& entry : module.named_parameters(false))
    state.push_back({prefix + entry.name, entry.tensor.detach()});
  for (const NamedTensor& entry : module.named_buffers(false))
    if (module.is_persistent_buffer(entry.name)) state.push_back({prefix + entry.name, entry.tensor.detach()});
  for (const auto& [name, child] : module.named_children()) collect_state(*child, prefix + name + ".", state);
}

}  // namespace

bool Module::is_persistent_buffer(const std::string& name) const {
  return std::find(transient_buffers_.begin(), transient_buffers_.end(), name) == transient_buffers_.end();
}

StateDict Module::state_dict() const {
  StateDict state;
  collect_state(*this, "", state);
  return state;
}

LoadReport Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict own = state_dict();
  std::unordered_map<std::string, const Tensor*> given;
  for (const NamedTensor& entry : state) given[entry.name] = &entry.tensor;
  LoadReport report;
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  for (const NamedTensor& entry : own) {
    auto it = given.find(entry.name);
    if (it == given.end()) {
      report.missing.push_back(entry.name);
      continue;
    }
    const Tensor& source = *it->second;
    if (source.shape() != entry.tensor.shape() || source.dtype() != entry.tensor.dtype())
      report.mismatched.push_back(fmt::format("{}: checkpoint has {} {}, model has {} {}", entry.name,
                                              shape_str(source.shape()), dtype_name(source.dtype()),
                                              shape_str(entry.tensor.shape()), dtype_name(entry.tensor.dtype())));
    else
      copies.emplace_back(entry.tensor, &source);
    given.erase(it);
  }
  for (const NamedTensor& entry : state)
    if (given.count(entry.name)) report.unexpected.push_back(entry.name);
  MF_CHECK(!strict || report.ok(), "load_state_dict: the state does not match {}:{}", type_name_, report.str());
  NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(*source);
  return report;
}

std::string Module::to_string() const {
  if (children_.empty()) return fmt::format("{}({})", type_name_, extra_repr());
  std::string text = type_name_ + "(";
  for (const auto& [name, child] : children_) {
    std::string nested = child->to_string();
    std::string indented;
    for (char c : nested) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
    text += fmt::format("\n  ({}): {}", name, indented);
  }
  return text + "\n)";
}

// ---- containers ---------------------------------------------------------------------------------

ModuleSequence::ModuleSequence(std::string type_name, std::vector<std::shared_ptr<Module>> modules)
    : Module(std::move(type_name)) {
  for (auto& module : modules) push_back(std::move(module));
}

void ModuleSequence::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

Tensor SequentialImpl::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : named_children()) x = child->forward(x);
  return x;
}

std::shared_ptr<Module> ModuleListImpl::child(size_t index) const {
  MF_CHECK(index < size(), "ModuleList::at: index {} is out of range for {} modules", index, size());
  return named_children()[index].second;
}

}  // namespace mf::nn
