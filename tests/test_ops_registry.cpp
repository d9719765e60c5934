// The registry-driven suite: every registered op, on every sample it declares and on every device
// present, against its naive reference (float64 and float32, contiguous and strided inputs) and,
// where it is differentiable, against central finite differences in float64 on the CPU and the CPU's
// backward elsewhere. MF_TEST_OPS=softmax,layer_norm runs only those ops (the GPU kit's sanitizers
// use it).
#include <doctest/doctest.h>

#include "miniflow.h"
#include "ops/reference.h"
#include "helpers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

using namespace mf;
using mf::testing::check_close;

namespace {

/// Whether MF_TEST_OPS (a comma-separated list of op names) selects `id`; unset, it selects every op.
bool selected(OpId id) {
  static const std::optional<std::string> list = [] {
    const char* value = std::getenv("MF_TEST_OPS");
    return value ? std::optional<std::string>(fmt::format(",{},", value)) : std::nullopt;
  }();
  return !list || list->find(fmt::format(",{},", kOpNames[static_cast<size_t>(id)])) != std::string::npos;
}

/// Copies of `tensors` on `device`, float64 ones in float32 when `single`.
std::vector<Tensor> copies_on(const std::vector<Tensor>& tensors, Device device, bool single = false) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors)
    out.push_back((single && t.dtype() == DType::Float64 ? t.to(DType::Float32) : t.clone()).to(device));
  return out;
}

/// Same values on `device`, laid out with every other element of a twice-as-wide buffer, so every
/// input of rank >= 1 arrives non-contiguous.
Tensor strided_copy(const Tensor& t, Device device) {
  if (t.dim() == 0 || t.numel() == 0) return t.clone().to(device);
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor view = zeros(wide, t.dtype(), device).slice(-1, 0, wide.back(), 2);
  view.copy_(t.to(device));
  return view;
}

/// A sample's parameters for a run on `device`: to_device's samples copy to the CPU, and on another
/// device copy to that one.
Attrs params_on(OpId id, const Attrs& attrs, Device device) {
  return id == OpId::to_device ? Attrs(ToDeviceParams{.device = device}) : attrs;
}

void check_outputs(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected, double rtol,
                   double atol) {
  REQUIRE(actual.size() == expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    CAPTURE(k);
    check_close(actual[k], expected[k], rtol, atol);
  }
}

}  // namespace

// That every op in MF_OPS is defined at all, registry() checks at start-up.
TEST_CASE("every op has samples, a naive reference and a CPU kernel") {
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    CAPTURE(kOpNames[i]);
    const OpDef& def = registry()[id];
    REQUIRE_MESSAGE(bool(def.samples), "op has no samples");
    CHECK_MESSAGE(!def.samples().empty(), "op has an empty sample list");
    CHECK_MESSAGE(bool(def.reference), "op has no naive reference");
    CHECK_MESSAGE(def.runs_on(DeviceType::CPU), "op has no CPU kernel");
  }
}

// Each sample takes the input count MF_OPS declares, and a call with one tensor more or less is
// refused by name before anything reads past the last input.
TEST_CASE("every op takes the parameter struct MF_OPS declares and refuses another, naming both") {
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    CAPTURE(kOpNames[i]);
    for (const Sample& sample : registry()[id].samples()) CHECK(sample.attrs.index() == kOpParamsIndex[i]);
    // NoParams for ops with parameters, TopKParams for ops without: wrong either way.
    Attrs other = kOpParamsIndex[i] == 0 ? Attrs(TopKParams{}) : Attrs(NoParams{});
    std::string expected = fmt::format("{}: takes its parameters as {}, got {}", kOpNames[i],
                                       kParamsNames[kOpParamsIndex[i]], kParamsNames[other.index()]);
    CHECK_THROWS_WITH_AS(call(id, registry()[id].samples().front().inputs, other), doctest::Contains(expected.c_str()),
                         Error);
  }
}

TEST_CASE("every op takes the input count MF_OPS declares and refuses any other") {
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    CAPTURE(kOpNames[i]);
    int arity = kOpArity[i];
    for (const Sample& sample : registry()[id].samples())
      CHECK((arity < 0 ? !sample.inputs.empty() : sample.inputs.size() == static_cast<size_t>(arity)));
    auto refused = [&](const std::vector<Tensor>& inputs) {
      std::string expected =
          arity < 0 ? fmt::format("{}: expects at least one input tensor, got 0", kOpNames[i])
                    : fmt::format("{}: expects {} input tensor{}, got {}", kOpNames[i], arity, arity == 1 ? "" : "s",
                                  inputs.size());
      CHECK_THROWS_WITH_AS(call(id, inputs, {}), doctest::Contains(expected.c_str()), Error);
    };
    if (arity < 0) {
      refused({});
      continue;
    }
    std::vector<Tensor> inputs = registry()[id].samples().front().inputs;
    std::vector<Tensor> one_more = inputs, one_less = inputs;
    one_more.push_back(inputs.front());
    one_less.pop_back();
    refused(one_more);
    refused(one_less);
  }
}

TEST_CASE("every op matches its naive reference, on every device") {
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    int checked = 0;
    for (size_t i = 0; i < kOpCount; ++i) {
      auto id = static_cast<OpId>(i);
      if (!registry()[id].samples || !registry()[id].reference || !selected(id))
        continue;
      const OpDef& def = registry()[id];
      if (!def.runs_on(device.type)) continue;  // cuda::missing_ops() lists these; test_cuda refuses them
      for (const Sample& sample : def.samples()) {
        CAPTURE(kOpNames[i]);
        CAPTURE(sample.name);
        const Attrs attrs = params_on(id, sample.attrs, device);
        std::vector<Tensor> expected = def.reference(copies_on(sample.inputs, Device::cpu()), sample.attrs);
        {
          std::string variant = "float64";
          CAPTURE(variant);
          check_outputs(call(id, copies_on(sample.inputs, device), attrs), expected, 1e-10, 1e-12);
        }
        {
          std::string variant = "float32";
          CAPTURE(variant);
          // Float outputs come back in float32, except where the op's parameters fix the dtype (cast).
          std::vector<Tensor> actual = call(id, copies_on(sample.inputs, device, true), attrs), expected32;
          for (size_t k = 0; k < expected.size() && k < actual.size(); ++k)
            expected32.push_back(is_floating(expected[k].dtype()) ? expected[k].to(actual[k].dtype()) : expected[k]);
          check_outputs(actual, expected32, 1e-5, 1e-5);
        }
        {
          std::string variant = "strided inputs";
          CAPTURE(variant);
          std::vector<Tensor> strided;
          for (const Tensor& t : sample.inputs) strided.push_back(strided_copy(t, device));
          check_outputs(call(id, strided, attrs), expected, 1e-10, 1e-12);
        }
        ++checked;
      }
    }
    MESSAGE(fmt::format("{}: {} samples checked against the naive references", device.str(), checked));
  }
}

namespace {

/// Whether two ops' outputs hold the same dtypes and values, NaN matching NaN.
bool same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].defined() != b[k].defined()) return false;
    if (!a[k].defined()) continue;
    if (a[k].dtype() != b[k].dtype()) return false;
    const std::vector<double> x = a[k].to(DType::Float64).to_vector<double>(),
                              y = b[k].to(DType::Float64).to_vector<double>();
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end(),
                    [](double u, double v) { return u == v || (std::isnan(u) && std::isnan(v)); }))
      return false;
  }
  return true;
}

}  // namespace

// Autocast's rules (OpDef::autocast): a Float32 op computes as outside it, bit for bit, and takes
// bfloat16 inputs as their float32 values; a LowerPrecision op stays within bfloat16's rounding of
// its float32 result (test_autocast.cpp holds the lowered GEMMs to exact references).
TEST_CASE("under autocast, every op keeps its float32 result, except the GEMMs it lowers") {
  int lowered = 0, kept = 0;
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    const OpDef& def = registry()[id];
    if (!def.samples || !selected(id) || def.view) continue;
    for (const Sample& sample : def.samples()) {
      CAPTURE(kOpNames[i]);
      CAPTURE(sample.name);
      const std::vector<Tensor> outside = call(id, copies_on(sample.inputs, Device::cpu(), true), sample.attrs);
      std::vector<Tensor> inside;
      {
        AutocastGuard autocast;
        inside = call(id, copies_on(sample.inputs, Device::cpu(), true), sample.attrs);
      }
      if (def.autocast == AutocastRule::LowerPrecision) {
        check_outputs(inside, outside, 0.05, 0.05);
        ++lowered;
        continue;
      }
      CHECK(same(inside, outside));
      if (def.takes_storage_dtypes || def.writes_input) continue;
      // The same op on its float inputs rounded to bfloat16: as if given their float32 values.
      std::vector<Tensor> bf16, widened;
      for (const Tensor& t : copies_on(sample.inputs, Device::cpu(), true)) {
        const bool floating = t.dtype() == DType::Float32;
        bf16.push_back(floating ? t.to(DType::BFloat16) : t);
        widened.push_back(floating ? t.to(DType::BFloat16).to(DType::Float32) : t);
      }
      std::vector<Tensor> from_bf16;
      {
        AutocastGuard autocast;
        from_bf16 = call(id, bf16, sample.attrs);
      }
      CHECK(same(from_bf16, call(id, widened, sample.attrs)));
      ++kept;
    }
  }
  CHECK(lowered >= 5);
  MESSAGE(fmt::format("autocast: {} samples of lowered ops, {} of ops it keeps in float32", lowered, kept));
}

// bfloat16 arithmetic outside autocast, as PyTorch's CPU kernels do it: each op computes in float32
// on its bfloat16 inputs' values and rounds each float result to bfloat16 once. So the reference is
// the float32 op on the widened inputs, its float32 outputs rounded (the casts are tested bit by bit
// in test_bfloat16.cpp). The ops autocast lowers run their products on bfloat16 operands, the same
// values, summed in another order; attention's backward also rounds the intermediate products it
// multiplies again (dP = dO V^T before dS = P (dP - rowsum)), an error of about 2^-8 relative to the
// terms, not the result (the samples' terms are of order 1): within 4 x 2^-8 relative, 2^-8 absolute.
TEST_CASE("outside autocast, every op that computes takes bfloat16 inputs and rounds its results once") {
  int exact = 0, gemms = 0;
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    const OpDef& def = registry()[id];
    if (!def.samples || !selected(id) || def.view || def.takes_storage_dtypes || def.writes_input) continue;
    for (const Sample& sample : def.samples()) {
      CAPTURE(kOpNames[i]);
      CAPTURE(sample.name);
      std::vector<Tensor> bf16, widened;
      bool any_bf16 = false;
      for (const Tensor& t : copies_on(sample.inputs, Device::cpu(), true)) {
        const bool floating = t.dtype() == DType::Float32;
        any_bf16 = any_bf16 || floating;
        bf16.push_back(floating ? t.to(DType::BFloat16) : t);
        widened.push_back(floating ? t.to(DType::BFloat16).to(DType::Float32) : t);
      }
      if (!any_bf16) continue;
      std::vector<Tensor> expected = call(id, widened, sample.attrs);
      for (Tensor& t : expected)
        if (t.defined() && t.dtype() == DType::Float32) t = t.to(DType::BFloat16);
      const std::vector<Tensor> got = call(id, bf16, sample.attrs);
      if (def.autocast == AutocastRule::LowerPrecision) {
        REQUIRE(got.size() == expected.size());
        for (size_t k = 0; k < got.size(); ++k) CHECK(got[k].dtype() == expected[k].dtype());
        check_outputs(got, expected, 4.0 / 256, 1.0 / 256);
        ++gemms;
      } else {
        CHECK(same(got, expected));
        ++exact;
      }
    }
  }
  CHECK(gemms >= 5);
  MESSAGE(fmt::format("bfloat16: {} samples bit for bit, {} of lowered ops within 4 x 2^-8", exact, gemms));
}

TEST_CASE("every differentiable op passes gradcheck in float64") {
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    if (!registry()[id].backward || !registry()[id].samples || !selected(id)) continue;
    const OpDef& def = registry()[id];
    for (const Sample& sample : def.samples()) {
      if (!sample.gradcheck) continue;
      CAPTURE(kOpNames[i]);
      CAPTURE(sample.name);
      std::vector<Tensor> inputs = copies_on(sample.inputs, Device::cpu());
      bool any = false;
      for (size_t k = 0; k < inputs.size(); ++k) {
        bool excluded = k < sample.no_grad_inputs.size() && sample.no_grad_inputs[k];
        if (inputs[k].dtype() == DType::Float64 && !excluded) {
          inputs[k].set_requires_grad();
          any = true;
        }
      }
      if (!any) continue;
      std::string failure = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) { return call(id, in, sample.attrs); }, inputs);
      CHECK_MESSAGE(failure.empty(), failure);
    }
  }
}

namespace {

/// Gradients of sum_k <outputs_k, w_k> (fixed random w_k) with respect to the float64 inputs the
/// sample differentiates, computed on `device` and returned on the CPU; undefined where an input gets
/// none.
std::vector<Tensor> weighted_gradients(OpId id, const Sample& sample, Device device) {
  std::vector<Tensor> inputs = copies_on(sample.inputs, device), leaves;
  for (size_t k = 0; k < inputs.size(); ++k) {
    bool excluded = k < sample.no_grad_inputs.size() && sample.no_grad_inputs[k];
    if (inputs[k].dtype() == DType::Float64 && !excluded) leaves.push_back(inputs[k].set_requires_grad());
  }
  if (leaves.empty()) return {};
  std::vector<Tensor> outputs, weights;
  uint64_t seed = 900;
  for (const Tensor& out : call(id, inputs, params_on(id, sample.attrs, device))) {
    if (!out.requires_grad()) continue;
    outputs.push_back(out);
    weights.push_back(reference::randn(out.shape(), seed++).to(out.dtype()).to(device));
  }
  if (outputs.empty()) return {};
  std::vector<Tensor> grads = autograd::grad(outputs, leaves, weights, false, true);
  for (Tensor& g : grads)
    if (g.defined()) g = g.to(Device::cpu());
  return grads;
}

}  // namespace

// Gradcheck runs on the CPU; elsewhere each op's backward is held to the CPU's.
TEST_CASE("every differentiable op's backward on each other device matches the CPU's") {
  for (Device device : testing::test_devices()) {
    if (device.is_cpu()) continue;
    CAPTURE(device);
    for (size_t i = 0; i < kOpCount; ++i) {
      auto id = static_cast<OpId>(i);
      if (!registry()[id].backward || !registry()[id].samples || !selected(id))
        continue;
      const OpDef& def = registry()[id];
      if (!def.runs_on(device.type)) continue;
      for (const Sample& sample : def.samples()) {
        if (!sample.gradcheck) continue;
        CAPTURE(kOpNames[i]);
        CAPTURE(sample.name);
        std::vector<Tensor> expected = weighted_gradients(id, sample, Device::cpu());
        std::vector<Tensor> actual = weighted_gradients(id, sample, device);
        REQUIRE(actual.size() == expected.size());
        for (size_t k = 0; k < actual.size(); ++k) {
          CAPTURE(k);
          REQUIRE(actual[k].defined() == expected[k].defined());
          if (expected[k].defined()) check_close(actual[k], expected[k], 1e-9, 1e-12);
        }
      }
    }
  }
}
