// nn::Module: the base of every layer and model. A module owns named parameters, buffers and child
// modules, registered in its constructor, so every tensor has a dotted path
// ("encoder.layers.0.self_attn.q_proj.weight") that state_dict() and checkpoints use.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mf::nn {

/// A tensor with its dotted name.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

/// Parameters and buffers by dotted name, in registration order (PyTorch's OrderedDict).
using StateDict = std::vector<NamedTensor>;

/// The tensor called `name`, or nullptr.
const Tensor* find(const StateDict& state, const std::string& name);

/// What load_state_dict found: keys the module has but the dict lacks, keys the dict has but the
/// module lacks, and keys present in both whose shape or dtype differ (with both described).
struct LoadReport {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> mismatched;
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// One line per problem, for error messages.
  std::string str() const;
};

class Module {
 public:
  /// `type_name` is what printing shows ("Linear").
  explicit Module(std::string type_name);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The single-input forward that Sequential chains; modules with other signatures keep this
  /// default, which throws an error naming the module type. Their forward hides it, on purpose
  /// (calling them with one tensor should not compile), so -Woverloaded-virtual is off for it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverloaded-virtual"
  virtual Tensor forward(const Tensor& input);
#pragma GCC diagnostic pop
  Tensor operator()(const Tensor& input) { return forward(input); }

  // ---- traversal ------------------------------------------------------------------------------
  /// Every parameter, depth first in registration order (own first, then each child's).
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// This module (named "") and all its descendants with their dotted paths.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// Total number of parameter elements.
  int64_t parameter_count() const;

  // ---- modes and placement --------------------------------------------------------------------
  /// Training mode for this module and all descendants (dropout is active only in training).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves every parameter and buffer in place (existing Tensor handles see the move).
  void to(Device device);
  /// Converts every floating parameter and buffer in place.
  void to(DType dtype);
  /// Drops every parameter's gradient (PyTorch's set_to_none = true).
  void zero_grad();

  // ---- state ----------------------------------------------------------------------------------
  /// Parameters and persistent buffers by dotted name, each module's own before its children's. The
  /// tensors share storage with the module (detached).
  StateDict state_dict() const;
  /// Whether this module's buffer `name` belongs in state_dict().
  bool is_persistent_buffer(const std::string& name) const;
  /// Copies matching tensors into the module's own (keeping its devices). With strict, any missing,
  /// unexpected or mismatched key throws mf::Error listing all of them and nothing is changed;
  /// otherwise matching keys load and the report says what did not.
  LoadReport load_state_dict(const StateDict& state, bool strict = true);

  // ---- printing -------------------------------------------------------------------------------
  const std::string& type_name() const { return type_name_; }
  /// PyTorch-style tree: "Linear(in_features=4, out_features=2, bias=true)" and nested children.
  std::string to_string() const;
  /// The part inside the parentheses for a leaf module (override in layers).
  virtual std::string extra_repr() const { return ""; }

 protected:
  /// Registers a parameter (requires_grad on unless told otherwise) and returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  /// Registers a buffer: state that moves with the module but is not trained. A persistent buffer is
  /// part of state_dict(); a non-persistent one (a table the constructor recomputes) is not.
  Tensor& register_buffer(const std::string& name, Tensor tensor, bool persistent = true);
  /// Registers a child module under `name` and returns it.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  std::vector<std::string> transient_buffers_;  // names of the non-persistent ones
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/// Modules called one after another, each on the previous one's output; children are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  /// Appends a module (named by its position).
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  size_t size() const { return named_children().size(); }
};

/// A list of modules registered under "0", "1", ... whose forward the owner calls itself.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  /// Iterates the modules in order, as std::shared_ptr<Module>: for (const auto& layer : *list).
  class Iterator {
   public:
    using Children = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;
    explicit Iterator(Children::const_iterator at) : at_(at) {}
    const std::shared_ptr<Module>& operator*() const { return at_->second; }
    Iterator& operator++() {
      ++at_;
      return *this;
    }
    bool operator==(const Iterator& other) const = default;

   private:
    Children::const_iterator at_;
  };
  Iterator begin() const { return Iterator(named_children().begin()); }
  Iterator end() const { return Iterator(named_children().end()); }

  /// The module at `index`, cast to M (throws when out of range or of another type).
  template <typename M = Module>
  std::shared_ptr<M> at(size_t index) const {
    auto module = std::dynamic_pointer_cast<M>(child(index));
    MF_CHECK(module != nullptr, "ModuleList::at: module {} is a {}, not the type asked for", index,
             child(index)->type_name());
    return module;
  }

 private:
  std::shared_ptr<Module> child(size_t index) const;
};

}  // namespace mf::nn
