// nn::Module: the base of every layer and model. A module owns named parameters, buffers and child
// modules, registered in its constructor, so every tensor has a dotted path
// ("encoder.layers.0.self_attn.q_proj.weight") that state_dict() and checkpoints use.
//
// As in libtorch, each layer is a class `LinearImpl` (the module) and a holder `Linear` (a shared
// pointer to it that is called like a function): `nn::Linear fc(2, 3); Tensor y = fc(x);`, and
// `fc->weight` reaches the module. MF_MODULE(Name) makes the holder for a user's NameImpl.
#pragma once

#include "core/error.h"
#include "core/tensor.h"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
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

/// An mf::Error raised inside a module called as `module(x)`: the message ends with the module's type
/// and the caller's line, "(in Linear called at gpt.cpp:42)", added once, by the innermost such call,
/// so an error deep inside a layer still names the line of the user's code that called it.
class ModuleCallError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// Runs `forward` (a module's forward) for a call made at `site`, adding the module and the site to an
/// mf::Error that escapes it (see ModuleCallError).
template <typename Forward>
decltype(auto) call_forward(const std::string& type_name, const Site& site, Forward&& forward) {
  try {
    return std::forward<Forward>(forward)();
  } catch (const ModuleCallError&) {
    throw;
  } catch (const Error& error) {
    throw ModuleCallError(fmt::format("{} (in {} called at {})", error.what(), type_name, format_location(site)));
  }
}
}  // namespace detail

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
  /// forward(input); an error inside names this call's line (see ModuleCallError).
  Tensor operator()(const Tensor& input, Site site = Site::current()) {
    return detail::call_forward(type_name_, site, [&] { return forward(input); });
  }

  // ---- traversal ------------------------------------------------------------------------------
  /// Every parameter, depth first in registration order (own first, then each child's); a tensor
  /// registered under two names (tied weights) is listed once, under the first.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// This module (named "") and all its descendants with their dotted paths.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// Total number of parameter elements.
  int64_t parameter_count() const;

  /// Makes this module's own parameter `name` the given tensor itself (not a copy), as assigning a
  /// parameter attribute does in PyTorch, and returns the stored handle: a layer's member handle
  /// (`weight`) must be assigned it too, which nn::tie_weights does for Linear.
  Tensor& replace_parameter(const std::string& name, Tensor tensor);

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
  /// tensors share storage with the module (detached). A tied tensor is saved under each of its names,
  /// as PyTorch's state_dict does, so the checkpoint also loads into an untied model.
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
  /// Registers the module a holder (nn::Linear, a MF_MODULE) points to and returns the holder.
  template <typename Holder>
    requires requires(const Holder& holder) { typename Holder::ContainedType; holder.ptr(); }
  Holder register_module(const std::string& name, Holder holder) {
    add_child(name, holder.ptr());
    return holder;
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

namespace detail {
struct NoOptions {};
template <typename Impl>
struct OptionsOf {
  using type = NoOptions;
};
template <typename Impl>
  requires requires { typename Impl::Options; }
struct OptionsOf<Impl> {
  using type = typename Impl::Options;
};
}  // namespace detail

/// Holds a shared Impl module and calls its forward: libtorch's ModuleHolder. `Name(args...)` makes
/// a new NameImpl(args...); `Name(nullptr)` is empty until assigned (for members registered in a
/// constructor); `->` and `*` reach the module; `name(x, ...)` calls its forward, and an error
/// inside names the calling line. A holder converts to std::shared_ptr<Module>, so it can go into a
/// Sequential or a ModuleList. Copies share the module.
template <typename Impl>
class ModuleHolder {
 public:
  using ContainedType = Impl;

  /// A new Impl(), for modules that have a default constructor.
  ModuleHolder()
    requires std::default_initializable<Impl>
      : impl_(std::make_shared<Impl>()) {}
  /// Empty: no module until one is assigned.
  ModuleHolder(std::nullptr_t) {}
  /// A new Impl(args...).
  template <typename First, typename... Rest>
    requires(!std::derived_from<std::decay_t<First>, ModuleHolder> && !std::same_as<std::decay_t<First>, std::nullptr_t> &&
             std::constructible_from<Impl, First, Rest...>)
  explicit ModuleHolder(First&& first, Rest&&... rest)
      : impl_(std::make_shared<Impl>(std::forward<First>(first), std::forward<Rest>(rest)...)) {}
  /// A new Impl(options) from the module's options struct, designated initializers included:
  /// nn::GELU({.approximate = "tanh"}).
  explicit ModuleHolder(const typename detail::OptionsOf<Impl>::type& options)
    requires(!std::same_as<typename detail::OptionsOf<Impl>::type, detail::NoOptions>)
      : impl_(std::make_shared<Impl>(options)) {}
  /// Holds an existing module.
  ModuleHolder(std::shared_ptr<Impl> module) : impl_(std::move(module)) {}

  Impl* operator->() const { return get(); }
  Impl& operator*() const { return *get(); }
  Impl* get() const {
    MF_CHECK(impl_ != nullptr, "accessing an empty module holder (constructed from nullptr and never assigned)");
    return impl_.get();
  }
  const std::shared_ptr<Impl>& ptr() const { return impl_; }
  bool is_empty() const { return impl_ == nullptr; }
  explicit operator bool() const { return impl_ != nullptr; }
  operator std::shared_ptr<Module>() const { return impl_; }

  /// The first argument of a call, with the line that made the call.
  struct Input {
    Input(const Tensor& tensor, Site site = Site::current()) : tensor(tensor), site(site) {}
    const Tensor& tensor;
    Site site;
  };
  /// impl->forward(input, rest...). A forward that takes a trailing Site (the losses) is given the
  /// caller's line directly; any other has an error inside it completed with the line.
  template <typename... Rest>
  decltype(auto) operator()(Input input, Rest&&... rest) const {
    Impl& module = *get();
    if constexpr (requires { module.forward(input.tensor, std::forward<Rest>(rest)..., input.site); })
      return module.forward(input.tensor, std::forward<Rest>(rest)..., input.site);
    else
      return detail::call_forward(module.type_name(), input.site, [&]() -> decltype(auto) {
        return module.forward(input.tensor, std::forward<Rest>(rest)...);
      });
  }

 private:
  std::shared_ptr<Impl> impl_;
};

/// MF_MODULE(Net) declares Net, the holder of NetImpl, as libtorch's TORCH_MODULE does.
#define MF_MODULE(Name)                                         \
  class Name : public ::mf::nn::ModuleHolder<Name##Impl> {      \
   public:                                                      \
    using ::mf::nn::ModuleHolder<Name##Impl>::ModuleHolder;     \
    Name() = default;                                           \
  }

/// Modules held in order under the names "0", "1", ...: what Sequential and ModuleList share.
class ModuleSequence : public Module {
 public:
  /// Appends a module (named by its position).
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }

 protected:
  explicit ModuleSequence(std::string type_name) : Module(std::move(type_name)) {}
  ModuleSequence(std::string type_name, std::vector<std::shared_ptr<Module>> modules);
};

/// Modules called one after another, each on the previous one's output; children are named "0", "1", ...
class SequentialImpl : public ModuleSequence {
 public:
  SequentialImpl() : ModuleSequence("Sequential") {}
  explicit SequentialImpl(std::vector<std::shared_ptr<Module>> modules)
      : ModuleSequence("Sequential", std::move(modules)) {}
  /// Sequential(nn::Linear(2, 3), nn::ReLU(), ...): modules or holders, in order.
  template <typename... Modules>
    requires(sizeof...(Modules) > 0 && (std::convertible_to<Modules, std::shared_ptr<Module>> && ...))
  explicit SequentialImpl(Modules&&... modules)
      : SequentialImpl(std::vector<std::shared_ptr<Module>>{std::forward<Modules>(modules)...}) {}
  Tensor forward(const Tensor& input) override;
};

/// A list of modules registered under "0", "1", ... whose forward the owner calls itself.
class ModuleListImpl : public ModuleSequence {
 public:
  ModuleListImpl() : ModuleSequence("ModuleList") {}
  explicit ModuleListImpl(std::vector<std::shared_ptr<Module>> modules)
      : ModuleSequence("ModuleList", std::move(modules)) {}
  /// ModuleList(nn::Linear(2, 3), nn::ReLU(), ...): modules or holders, in order.
  template <typename... Modules>
    requires(sizeof...(Modules) > 0 && (std::convertible_to<Modules, std::shared_ptr<Module>> && ...))
  explicit ModuleListImpl(Modules&&... modules)
      : ModuleListImpl(std::vector<std::shared_ptr<Module>>{std::forward<Modules>(modules)...}) {}
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

  /// The module at `index`, cast to M, an Impl class (throws when out of range or of another type).
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

MF_MODULE(Sequential);
MF_MODULE(ModuleList);

}  // namespace mf::nn
