// The registry and the dispatcher: validation, output allocation, kernel lookup and autograd recording.
#include "core/graph.h"
#include "core/parallel.h"
#include "core/profiler.h"
#include "ops/anomaly.h"
#include "ops/families.h"
#include "ops/functional.h"
#include "ops/kernel_api.h"
#include "ops/registry.h"

#include <fmt/format.h>

#include <cmath>

namespace mf {

void Registry::define(OpId id, OpDef def) {
  size_t index = static_cast<size_t>(id);
  MF_CHECK(defs_[index].name.empty(), "op '{}' is defined twice", kOpNames[index]);
  MF_CHECK(def.name == kOpNames[index], "op '{}' is registered under the id of '{}'", def.name, kOpNames[index]);
  defs_[index] = def;
}

void Registry::set_kernel(OpId id, DeviceType device, KernelFn kernel, bool reads_bfloat16_when_lowered) {
  OpDef& def = defs_[static_cast<size_t>(id)];
  def.kernels[static_cast<size_t>(device)] = kernel;
  def.lowered_kernel_reads_bfloat16[static_cast<size_t>(device)] = reads_bfloat16_when_lowered;
}

Registry& detail::registry_to_extend() {
  static Registry instance = [] {
    Registry r;
    register_elementwise_ops(r);
    register_fill_ops(r);
    register_reduction_ops(r);
    register_view_ops(r);
    register_index_ops(r);
    register_linalg_ops(r);
    register_softmax_ops(r);
    register_nn_ops(r);
    register_loss_ops(r);
    register_attention_ops(r);
    register_quantized_ops(r);
    register_cross_device_copy(r);
    for (size_t i = 0; i < kOpCount; ++i)
      MF_CHECK(r.is_defined(static_cast<OpId>(i)), "op registry: {} is declared in MF_OPS but no op family defines it",
               kOpNames[i]);
    return r;
  }();
  return instance;
}

const Registry& registry() { return detail::registry_to_extend(); }

namespace {

/// A tensor kept for backward, and the storage version it had then.
struct SavedTensor {
  Tensor tensor;
  uint32_t version = 0;
};

class OpNode final : public Node {
 public:
  OpNode(const OpDef& def, const Attrs& attrs, bool lowered) : def_(def), attrs_(attrs), lowered_(lowered) {}

  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs, const std::vector<Tensor>& sums) override {
    MF_CHECK(!released, "backward through the graph a second time, but its saved tensors were already freed; "
             "pass retain_graph = true to the first backward");
    // The gradient computes in the precision the op did, inside or outside autocast (as PyTorch's
    // backward takes the dtypes autocast gave the forward): a lowered op's products in bfloat16.
    AutocastGuard cpu_autocast(DeviceType::CPU, DType::BFloat16, lowered_ && device.is_cpu());
    AutocastGuard cuda_autocast(DeviceType::CUDA, DType::BFloat16, lowered_ && device.is_cuda());
    KernelSettingsGuard settings({.bfloat16_products = lowered_});
    std::vector<Tensor> inputs = unpack(saved_inputs_), outputs = unpack(saved_outputs_);
    std::vector<bool> needs_grad;
    for (const Edge& edge : next_edges) needs_grad.push_back(edge.is_valid());
    GradContext ctx{grad_outputs, inputs, outputs, attrs_, needs_grad, site, sums};
    return def_.backward(ctx);
  }

  std::string name() const override { return std::string(def_.name); }

  void release_saved() override {
    saved_inputs_.clear();
    saved_outputs_.clear();
    released = true;
  }

  void save(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
    if (def_.saves_inputs)
      for (const Tensor& t : inputs) saved_inputs_.push_back({t, t.storage()->version()});
    // Outputs are saved detached: holding an output's own grad_fn here would be a reference cycle.
    if (def_.saves_outputs)
      for (size_t i = 0; i < outputs.size(); ++i)
        saved_outputs_.push_back(i < def_.first_saved_output
                                     ? SavedTensor{}
                                     : SavedTensor{outputs[i].detach(), outputs[i].storage()->version()});
  }

 private:
  std::vector<Tensor> unpack(const std::vector<SavedTensor>& saved) const {
    std::vector<Tensor> tensors;
    tensors.reserve(saved.size());
    for (const SavedTensor& s : saved) {
      if (!s.tensor.defined()) {  // an output the op does not keep
        tensors.emplace_back();
        continue;
      }
      uint32_t now = s.tensor.storage()->version();
      MF_CHECK(now == s.version, "a tensor saved for backward was modified in place afterwards (version {} now, "
               "{} when saved)", now, s.version);
      tensors.push_back(s.tensor);
    }
    return tensors;
  }

  const OpDef& def_;
  Attrs attrs_;
  bool lowered_;  // recorded under autocast, by an op that autocast lowers
  std::vector<SavedTensor> saved_inputs_, saved_outputs_;
};

// Ops that kernels or rules call internally must not wrap the message again: only the outermost
// call names its op and the user's line.
thread_local int call_depth = 0;

struct CallDepth {
  CallDepth() { ++call_depth; }
  ~CallDepth() { --call_depth; }
  CallDepth(const CallDepth&) = delete;
  CallDepth& operator=(const CallDepth&) = delete;
};

[[noreturn]] void rethrow_with_context(std::string_view op, const Error& error, const Site& site) {
  if (call_depth > 1) throw;
  throw Error(fmt::format("{}: {} at {}", op, error.what(), format_location(site)));
}

/// Whether anomaly mode checks this call: only the user's call (ops a kernel calls are part of it),
/// and not inside backward rules (the engine checks the gradients they give).
bool checks_anomaly() {
  return autograd::is_anomaly_enabled() && call_depth == 1 && !autograd::BackwardScope::active();
}

/// Whether the parameters ask for non-finite values: masked_fill(-inf), fill_(nan), pow(x, inf), a
/// normal draw of infinite mean.
bool asks_for_nonfinite(const Attrs& attrs) {
  return std::visit(
      []<typename P>(const P& params) {
        if constexpr (std::is_same_v<P, FillParams>) return !std::isfinite(params.value);
        else if constexpr (std::is_same_v<P, PowParams>) return !std::isfinite(params.exponent);
        else if constexpr (std::is_same_v<P, NormalParams>) return !std::isfinite(params.mean);
        else return false;
      },
      attrs);
}

/// Anomaly mode: throws at the first NaN or inf an op produces (see autograd::set_detect_anomaly).
/// `sources` counts the op's inputs as they were before it ran. An op told to write a non-finite
/// value is not blamed for it.
void check_anomaly(const std::vector<Tensor>& outputs, const std::function<NonFiniteCount()>& sources,
                   const Attrs& attrs) {
  if (asks_for_nonfinite(attrs)) return;
  std::string found = find_anomaly(outputs, sources, "output", "input");
  MF_CHECK(found.empty(), "{}", found);
}

Device common_device(const OpDef& def, const std::vector<Tensor>& inputs) {
  Device device;
  bool found = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    MF_CHECK(inputs[i].defined(), "input {} is an undefined tensor", i);
    if (!found) {
      device = inputs[i].device();
      found = true;
    } else if (!def.mixes_devices) {
      MF_CHECK(inputs[i].device() == device, "expected all tensors on one device, got {} (input 0) and {} (input {})",
               device.str(), inputs[i].device().str(), i);
    }
  }
  return device;
}

/// bfloat16 and int8 are storage types: the ops that move or convert elements take them
/// (takes_storage_dtypes), on either device; the rest refuse them here, before any kernel could read
/// their bits as another type. bfloat16 reaches this only in float32 (call() and call_inplace() widen
/// inputs and fill targets), so a bfloat16 refused here is an op told to make one from other dtypes.
void check_storage_dtype(const OpDef& def, DType dtype) {
  if (!is_storage_only(dtype) || def.takes_storage_dtypes) return;
  MF_CHECK(dtype != DType::BFloat16, "makes no bfloat16 tensors itself (make a float32 one and cast it with "
           ".to(mf::DType::BFloat16))");
  fail("{} tensors are stored, cast, copied, filled and viewed so far, not computed with (cast with "
       ".to(mf::DType::Float32) first)", dtype_name(dtype));
}

/// `reads_bfloat16`: this call's kernel reads bfloat16 inputs as they are (OpDef::lowered_kernel_reads_bfloat16).
void check_storage_dtype(const OpDef& def, const std::vector<Tensor>& inputs, bool reads_bfloat16 = false) {
  for (const Tensor& t : inputs)
    if (!(reads_bfloat16 && t.dtype() == DType::BFloat16)) check_storage_dtype(def, t.dtype());
}

void check_storage_dtype(const OpDef& def, const std::vector<OutputSpec>& specs) {
  for (const OutputSpec& spec : specs) check_storage_dtype(def, spec.dtype);
}

KernelFn kernel_for(const OpDef& def, Device device) {
  KernelFn kernel = def.kernels[static_cast<size_t>(device.type)];
  MF_CHECK(kernel != nullptr, "no kernel for device {}{}", device.str(),
           device.is_cuda() ? " (miniflow was built without CUDA, or this op is not on CUDA yet)" : "");
  return kernel;
}

/// In-place writes need one memory location per element: in an expanded view (stride 0 along a dim
/// of size > 1) several elements share one, which threads would write in any order (PyTorch refuses
/// such writes too).
void check_writable(const Tensor& t) {
  for (size_t d = 0; d < t.shape().size(); ++d)
    MF_CHECK(t.strides()[d] != 0 || t.shape()[d] <= 1,
             "cannot write in place into a tensor of shape {} with strides {}: it is expanded, so several of "
             "its elements share one memory location (clone() it first)",
             shape_str(t.shape()), shape_str(t.strides()));
}

bool all_empty(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (t.numel() != 0) return false;
  return true;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

void record(const OpDef& def, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, const Attrs& attrs,
            const Site& site, bool lowered) {
  auto node = std::make_shared<OpNode>(def, attrs, lowered);
  node->sequence_nr = next_sequence_nr();
  node->site = site;
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->takes_undefined_grads = def.takes_undefined_grads;
  node->device = outputs.empty() ? Device::cpu() : outputs[0].device();
  for (const Tensor& output : outputs) {
    node->output_shapes.push_back(output.shape());
    node->output_dtypes.push_back(output.dtype());
  }
  for (const Tensor& input : inputs) {
    Edge edge;
    if (input.requires_grad()) {
      if (auto fn = input.grad_fn()) {
        edge.node = std::move(fn);
        edge.output_nr = input.autograd_meta().output_nr;
      } else {
        edge.leaf = input.impl_ptr();
      }
    }
    node->next_edges.push_back(std::move(edge));
    node->input_shapes.push_back(input.shape());
    node->input_dtypes.push_back(input.dtype());
  }
  node->save(inputs, outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!is_floating(outputs[i].dtype())) continue;
    AutogradMeta& meta = outputs[i].autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

/// Refuses a wrong number of inputs before any check or kernel reads past the last one.
void check_input_count(OpId id, const std::vector<Tensor>& inputs) {
  int expected = kOpArity[static_cast<size_t>(id)];
  if (expected < 0) {
    MF_CHECK(!inputs.empty(), "expects at least one input tensor, got 0");
    return;
  }
  MF_CHECK(inputs.size() == static_cast<size_t>(expected), "expects {} input tensor{}, got {}", expected,
           expected == 1 ? "" : "s", inputs.size());
}

/// Refuses another op's parameter struct before any check or kernel reads it.
void check_params(OpId id, const Attrs& attrs) {
  size_t expected = kOpParamsIndex[static_cast<size_t>(id)];
  MF_CHECK(attrs.index() == expected, "takes its parameters as {}, got {}", kParamsNames[expected],
           kParamsNames[attrs.index()]);
}

/// Runs a kernel with recording off: a kernel computes its outputs, and those that call ops themselves
/// (CUDA's linear copies the bias into its output first) must neither record nor be refused as in-place
/// writes beside inputs that require grad; call() records the op itself once the kernel is done.
/// `lowered`: autocast lowers this call, so its kernel takes float32 products in bfloat16.
void run_kernel(KernelFn kernel, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, const Attrs& attrs,
                bool lowered = false) {
  NoGradGuard kernels_do_not_record;
  KernelSettingsGuard settings({.bfloat16_products = lowered});
  kernel(inputs, outputs, attrs);
}

bool is_bfloat16(const Tensor& t) { return t.defined() && t.dtype() == DType::BFloat16; }

/// Whether autocast lowers this op on `device` (on this thread, now).
bool autocast_lowers(const OpDef& def, Device device) {
  return def.autocast == AutocastRule::LowerPrecision && is_autocast_enabled(device.type);
}

/// Whether autocast lowers this op on `device` and the op's kernel there reads bfloat16 inputs as
/// they are.
bool lowered_kernel_reads_bfloat16(const OpDef& def, Device device) {
  return def.lowered_kernel_reads_bfloat16[static_cast<size_t>(device.type)] && autocast_lowers(def, device);
}

/// Whether autocast casts some of these inputs to float32 before the op runs: bfloat16 ones on a
/// device where autocast is on, for an op that computes with its inputs' values (not one that writes
/// its input: it would write a copy), unless the call writes a new result with a kernel that reads
/// bfloat16 (in place, the result keeps the target's dtype and goes through the float32 path).
bool autocast_casts_inputs(const OpDef& def, const std::vector<Tensor>& inputs, bool in_place) {
  if (def.view || def.takes_storage_dtypes || def.writes_input) return false;
  return std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& t) {
    return is_bfloat16(t) && is_autocast_enabled(t.device().type) &&
           (in_place || !lowered_kernel_reads_bfloat16(def, t.device()));
  });
}

/// The inputs with each bfloat16 one cast to float32 (a recorded cast: gradients flow back to it).
std::vector<Tensor> float32_inputs(const std::vector<Tensor>& inputs, const Site& site) {
  std::vector<Tensor> cast = inputs;
  for (Tensor& t : cast)
    if (is_bfloat16(t)) t = call1(OpId::cast, {t}, CastParams{.dtype = DType::Float32}, site);
  return cast;
}

/// Whether this call does bfloat16 arithmetic outside autocast: an op that computes, with a bfloat16
/// input (or, in place, target) on a device where autocast is off. It computes in float32 (below).
bool computes_bfloat16_in_float32(const OpDef& def, const std::vector<Tensor>& inputs, const Tensor* target = nullptr) {
  if (def.view || def.takes_storage_dtypes || def.writes_input) return false;
  auto outside_autocast = [](const Tensor& t) {
    return is_bfloat16(t) && !is_autocast_enabled(t.device().type);
  };
  return std::any_of(inputs.begin(), inputs.end(), outside_autocast) || (target && outside_autocast(*target));
}

/// Whether autocast's lowering should run this op's products on bfloat16 operands: an op autocast
/// lowers (linear, matmul, attention) whose float inputs were all bfloat16 (the caller checks that),
/// so rounding their float32 copies to bfloat16 again is exact and the faster kernel gives the float32
/// kernel's results up to the order of the sums, as PyTorch's bfloat16 GEMMs sum bfloat16 products in
/// float32.
bool products_in_bfloat16(const OpDef& def) { return def.autocast == AutocastRule::LowerPrecision; }

DeviceType bfloat16_device(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (is_bfloat16(t)) return t.device().type;
  return DeviceType::CPU;
}

}  // namespace

std::vector<Tensor> call(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs, Site site) {
  const OpDef& def = registry()[id];
  if (autocast_casts_inputs(def, inputs, /*in_place=*/false)) [[unlikely]]
    return call(id, float32_inputs(inputs, site), attrs, site);
  // bfloat16 arithmetic as PyTorch's CPU kernels do it: in float32 with one rounding per result. The
  // op runs on float32 copies of its bfloat16 inputs (recorded casts: gradients flow back in
  // bfloat16), and its float32 results are rounded to bfloat16 unless a float32 or float64 input
  // made float32 the computed type (promote_types' rule; the fronts promote mixed operands).
  if (computes_bfloat16_in_float32(def, inputs)) [[unlikely]] {
    const bool wider_input = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) {
      return t.defined() && (t.dtype() == DType::Float32 || t.dtype() == DType::Float64);
    });
    std::vector<Tensor> outputs;
    {
      AutocastGuard products(bfloat16_device(inputs), DType::BFloat16, products_in_bfloat16(def) && !wider_input);
      outputs = call(id, float32_inputs(inputs, site), attrs, site);
    }
    if (!wider_input)
      for (Tensor& out : outputs)
        if (out.defined() && out.dtype() == DType::Float32)
          out = call1(OpId::cast, {out}, CastParams{.dtype = DType::BFloat16}, site);
    return outputs;
  }
  profiler::detail::Scope profiled(profiler::EventKind::Op, def.name, &inputs);
  CallDepth depth;
  std::vector<Tensor> outputs;
  bool lowered = false;
  try {
    check_input_count(id, inputs);
    check_params(id, attrs);
    Device device = common_device(def, inputs);
    if (def.view) {
      outputs.push_back(def.view(inputs[0], attrs));
    } else {
      Device out_device = def.mixes_devices ? std::get<ToDeviceParams>(attrs).device : device;
      check_storage_dtype(def, inputs, lowered_kernel_reads_bfloat16(def, device));
      std::vector<OutputSpec> specs = def.infer(inputs, attrs);
      check_storage_dtype(def, specs);
      KernelFn kernel = kernel_for(def, device);
      lowered = autocast_lowers(def, device);
      if (def.writes_input) {
        check_writable(inputs[0]);
        outputs.push_back(inputs[0]);
      } else {
        for (const OutputSpec& spec : specs) outputs.push_back(Tensor::empty(spec.shape, spec.dtype, out_device));
      }
      // Nothing to compute for empty outputs (and the CPU loops cannot plan a zero-size dim).
      if (!all_empty(outputs)) run_kernel(kernel, inputs, outputs, attrs, lowered);
      if (def.writes_input) inputs[0].storage()->bump_version();
      // Fills (writes_input) write what they are told; views above share their input's values.
      else if (checks_anomaly()) [[unlikely]]
        check_anomaly(outputs, [&] { return count_nonfinite(inputs); }, attrs);
    }
  } catch (const Error& error) {
    rethrow_with_context(def.name, error, site);
  }
  if (def.backward && grad_mode_enabled() && any_requires_grad(inputs))
    record(def, inputs, outputs, attrs, site, lowered);
  return outputs;
}

Tensor call1(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs, Site site) {
  return std::move(call(id, inputs, attrs, site)[0]);
}

void call_inplace(OpId id, Tensor& self, const std::vector<Tensor>& inputs, const Attrs& attrs, Site site) {
  const OpDef& def = registry()[id];
  if (autocast_casts_inputs(def, inputs, /*in_place=*/true)) [[unlikely]]
    return call_inplace(id, self, float32_inputs(inputs, site), attrs, site);
  // bfloat16 outside autocast: computed in float32 as call() does, the result rounded into self.
  const bool bfloat16_in_float32 = computes_bfloat16_in_float32(def, inputs, &self);
  if (bfloat16_in_float32 && std::any_of(inputs.begin(), inputs.end(), is_bfloat16)) [[unlikely]]
    return call_inplace(id, self, float32_inputs(inputs, site), attrs, site);
  // A fill that computes its values (a random draw, arange) into a bfloat16 tensor: made in float32,
  // then rounded into it, as PyTorch draws bfloat16 tensors.
  if (def.writes_input && !def.takes_storage_dtypes && self.dtype() == DType::BFloat16 && !inputs.empty() &&
      inputs[0].is_same(self)) [[unlikely]] {
    Tensor widened = Tensor::empty(self.shape(), DType::Float32, self.device());
    std::vector<Tensor> widened_inputs = inputs;
    widened_inputs[0] = widened;
    call_inplace(id, widened, widened_inputs, attrs, site);
    NoGradGuard filling;
    self.copy_(widened, site);
    return;
  }
  profiler::detail::Scope profiled(profiler::EventKind::Op, def.name, &inputs);
  CallDepth depth;
  try {
    check_input_count(id, inputs);
    check_params(id, attrs);
    MF_CHECK(!(grad_mode_enabled() && (self.requires_grad() || any_requires_grad(inputs))),
             "in-place operation on a tensor that requires grad (wrap it in NoGradGuard, or use the "
             "out-of-place form)");
    Device device = common_device(def, inputs);
    MF_CHECK(self.device() == device, "in-place target is on {} but the inputs are on {}", self.device().str(),
             device.str());
    check_writable(self);
    check_storage_dtype(def, inputs);
    if (!bfloat16_in_float32) check_storage_dtype(def, self.dtype());
    std::vector<OutputSpec> specs = def.infer(inputs, attrs);
    check_storage_dtype(def, specs);
    MF_CHECK(specs.size() == 1 && specs[0].shape == self.shape(),
             "result of shape {} cannot be written in place into a tensor of shape {}", shape_str(specs[0].shape),
             shape_str(self.shape()));
    KernelFn kernel = kernel_for(def, device);
    const bool lowered = autocast_lowers(def, device);
    // In anomaly mode the inputs are counted before the kernel overwrites self, often one of them.
    std::optional<NonFiniteCount> before;
    if (checks_anomaly()) [[unlikely]] before = count_nonfinite(inputs);
    if (self.numel() == 0) {
      // nothing to write
    } else if (specs[0].dtype == self.dtype()) {
      std::vector<Tensor> outputs{self};
      run_kernel(kernel, inputs, outputs, attrs, lowered);
    } else {
      std::vector<Tensor> outputs{Tensor::empty(specs[0].shape, specs[0].dtype, device)};
      run_kernel(kernel, inputs, outputs, attrs, lowered);
      std::vector<Tensor> casted{self};
      kernel_for(registry()[OpId::cast], device)({outputs[0]}, casted, CastParams{.dtype = self.dtype()});
    }
    self.storage()->bump_version();
    if (before) check_anomaly({self}, [&] { return *before; }, attrs);
  } catch (const Error& error) {
    rethrow_with_context(def.name, error, site);
  }
}

}  // namespace mf
