// Property tests over the whole op registry: for every op and many seeds, random shapes (rank 0-4,
// size-0 and size-1 dims), random layouts of the same values (permuted, step-sliced, offset, stride-0
// expanded), random broadcasting, float64 and float32, against the op's naive reference; gradients
// against central finite differences in float64; and calls that break the op's contract, which must
// raise mf::Error naming the op, never crash.
//
// MF_PROPERTY_SEEDS=N runs N seeds per op (default 32); MF_PROPERTY_SEED=S runs seed S alone, which
// is how a failure (its message names the op and the seed) is reproduced.
#include <doctest/doctest.h>

#include "miniflow.h"
#include "ops/reference.h"
#include "property_layout.h"
#include "property_support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>

using namespace mf;
using namespace mf::props;

namespace {

/// The seeds to run: MF_PROPERTY_SEED alone, else 1..MF_PROPERTY_SEEDS.
std::vector<uint64_t> seeds() {
  if (const char* one = std::getenv("MF_PROPERTY_SEED")) return {std::strtoull(one, nullptr, 10)};
  const char* count = std::getenv("MF_PROPERTY_SEEDS");
  int64_t n = count != nullptr ? std::strtoll(count, nullptr, 10) : 32;
  std::vector<uint64_t> out;
  for (int64_t s = 1; s <= n; ++s) out.push_back(static_cast<uint64_t>(s));
  return out;
}

/// One random stream per (op, seed, test), so that each case reproduces on its own.
Rng rng_for(OpId id, uint64_t seed, uint64_t test) {
  return Rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(id) * 1000003ULL + test);
}

std::string_view name_of(OpId id) { return kOpNames[static_cast<size_t>(id)]; }

std::vector<OpId> all_ops() {
  std::vector<OpId> ids;
  for (size_t i = 0; i < kOpCount; ++i) ids.push_back(static_cast<OpId>(i));
  return ids;
}

/// The ops the suite can generate calls for (the first test case fails the others by name).
std::vector<OpId> generated_ops() {
  std::vector<OpId> ids;
  for (OpId id : all_ops())
    if (valid_generator(id) && registry()[id].samples) ids.push_back(id);
  return ids;
}

/// The parameters by name, each field the struct has (the structs share field names where they share
/// meanings).
std::string attrs_str(const Attrs& attrs) {
  std::string out = std::string(kParamsNames[attrs.index()]);
  auto field = [&](std::string_view name, const auto& value) { out += fmt::format(" {} {}", name, value); };
  auto bound = [](const std::optional<double>& b) { return b ? fmt::format("{}", *b) : std::string("none"); };
  std::visit(
      [&](const auto& p) {
        if constexpr (requires { p.dims; }) field("dims", shape_str(p.dims));
        if constexpr (requires { p.shape; }) field("shape", shape_str(p.shape));
        if constexpr (requires { p.normalized_shape; }) field("normalized_shape", shape_str(p.normalized_shape));
        if constexpr (requires { p.dim; }) field("dim", p.dim);
        if constexpr (requires { p.keepdim; }) field("keepdim", p.keepdim);
        if constexpr (requires { p.correction; }) field("correction", p.correction);
        if constexpr (requires { p.start; }) field("start", p.start);
        if constexpr (requires { p.end; }) field("end", p.end);
        if constexpr (requires { p.step; }) field("step", p.step);
        if constexpr (requires { p.index; }) field("index", p.index);
        if constexpr (requires { p.k; }) field("k", p.k);
        if constexpr (requires { p.largest; }) field("largest", p.largest);
        if constexpr (requires { p.num_classes; }) field("num_classes", p.num_classes);
        if constexpr (requires { p.diagonal; }) field("diagonal", p.diagonal);
        if constexpr (requires { p.exponent; }) field("exponent", p.exponent);
        if constexpr (requires { p.value; }) field("value", p.value);
        if constexpr (requires { p.min; }) field("min", bound(p.min));
        if constexpr (requires { p.max; }) field("max", bound(p.max));
        if constexpr (requires { p.low; }) field("low", p.low);
        if constexpr (requires { p.high; }) field("high", p.high);
        if constexpr (requires { p.mean; }) field("mean", p.mean);
        if constexpr (requires { p.std; }) field("std", p.std);
        if constexpr (requires { p.p; }) field("p", p.p);
        if constexpr (requires { p.eps; }) field("eps", p.eps);
        if constexpr (requires { p.num_embeddings; }) field("num_embeddings", p.num_embeddings);
        if constexpr (requires { p.padding_idx; }) field("padding_idx", p.padding_idx);
        if constexpr (requires { p.accumulate; }) field("accumulate", p.accumulate);
        if constexpr (requires { p.ignore_index; }) field("ignore_index", p.ignore_index);
        if constexpr (requires { p.label_smoothing; }) field("label_smoothing", p.label_smoothing);
        if constexpr (requires { p.dtype; }) field("dtype", dtype_name(p.dtype));
        if constexpr (requires { p.device; }) field("device", p.device.str());
        if constexpr (requires { p.stream; }) field("seed", p.stream.seed), field("counter", p.stream.counter);
      },
      attrs);
  return out;
}

std::string inputs_str(const std::vector<Tensor>& inputs) {
  std::string out;
  for (size_t k = 0; k < inputs.size(); ++k) out += fmt::format("\n  input {}: {}", k, describe(inputs[k]));
  return out;
}

std::string reproduce(OpId id, uint64_t seed) {
  return fmt::format("op {}, seed {} (rerun: MF_PROPERTY_SEED={} build/tests/test_properties)", name_of(id), seed,
                     seed);
}

/// The chosen sample with each float input of a single value (a scalar sample) given the values of
/// that input in every sample of the op, so that random cases get a spread of values, not ties.
/// Samples of integer values keep theirs: they are there for ties.
Sample widened(const Sample& chosen, const std::vector<Sample>& samples) {
  Sample out = chosen;
  for (size_t k = 0; k < chosen.inputs.size(); ++k) {
    const Tensor& x = chosen.inputs[k];
    if (!is_floating(x.dtype()) || integer_valued(x) || x.numel() > 1) continue;
    std::vector<double> pooled;
    for (const Sample& s : samples)
      if (k < s.inputs.size() && s.inputs[k].dtype() == x.dtype())
        for (double v : s.inputs[k].to_vector<double>()) pooled.push_back(v);
    out.inputs[k] = from_vector(pooled).to(x.dtype());
  }
  return out;
}

/// A random valid case of `id`, from a randomly chosen sample.
std::pair<Case, std::string> random_case(OpId id, Rng& rng, bool small) {
  std::vector<Sample> samples = registry()[id].samples();
  const Sample& sample = rng.pick(samples);
  return {valid_generator(id)(widened(sample, samples), rng, small), sample.name};
}

/// One drawn case, with the stream it came from (for the test's further random choices).
struct Drawn {
  OpId id;
  uint64_t seed;
  Rng& rng;
  Case& c;
  std::string context;  // op, seed and sample, for failure messages
};

/// Calls body on a random case of every generated op that `wanted` accepts, for every seed. Each
/// test passes its own `stream`, so that the tests draw different cases.
void for_each_case(uint64_t stream, bool small, bool (*wanted)(const OpDef&), const std::function<void(Drawn&)>& body) {
  std::vector<uint64_t> all = seeds();
  for (OpId id : generated_ops()) {
    if (!wanted(registry()[id])) continue;
    for (uint64_t seed : all) {
      Rng rng = rng_for(id, seed, stream);
      auto [c, sample] = random_case(id, rng, small);
      Drawn drawn{id, seed, rng, c, reproduce(id, seed) + ", from sample '" + sample + "'"};
      body(drawn);
    }
  }
}

bool any_op(const OpDef&) { return true; }

std::vector<Tensor> contiguous_all(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.contiguous().clone());
  return out;
}

/// The case's inputs in `dtype` where they are float64 (a float32 run), laid out by the recipes.
struct LaidInputs {
  std::vector<Laid> laid;
  std::vector<Tensor> views() const {
    std::vector<Tensor> out;
    for (const Laid& l : laid) out.push_back(l.view);
    return out;
  }
};

LaidInputs lay_out_all(const std::vector<Tensor>& values, const std::vector<Recipe>& recipes, DType floats) {
  LaidInputs out;
  for (size_t k = 0; k < values.size(); ++k) {
    Tensor x = values[k].dtype() == DType::Float64 ? values[k].to(floats) : values[k];
    out.laid.push_back(lay_out(x, recipes[k]));
  }
  return out;
}

/// Runs the case in one float dtype and holds every output against the reference; checks that the
/// inputs' buffers are untouched (in-place ops: untouched outside the output's view).
void check_forward(OpId id, const Case& c, const std::vector<Tensor>& values, const std::vector<Recipe>& recipes,
                   DType floats, const std::string& context) {
  const OpDef& def = registry()[id];
  LaidInputs inputs = lay_out_all(values, recipes, floats);
  std::vector<Tensor> logical = contiguous_all(inputs.views());
  std::vector<Tensor> before;
  for (const Laid& l : inputs.laid) before.push_back(l.buffer.clone());
  std::string where = fmt::format("{} in {}{}\n  attrs: {}", context, dtype_name(floats), inputs_str(inputs.views()),
                                  attrs_str(c.attrs));
  std::vector<Tensor> actual;
  try {
    actual = call(id, inputs.views(), c.attrs);
  } catch (const Error& error) {
    // view may refuse a layout it cannot view without a copy; a contiguous input it must always take.
    bool strided = !inputs.views()[0].is_contiguous();
    if (id == OpId::view && strided && std::string(error.what()).find("without a copy") != std::string::npos) return;
    FAIL_CHECK(where << "\n  threw: " << error.what());
    return;
  }
  std::vector<Tensor> expected = def.reference(logical, c.attrs);
  if (actual.size() != expected.size()) {
    FAIL_CHECK(where << "\n  " << actual.size() << " outputs, the reference has " << expected.size());
    return;
  }
  for (size_t k = 0; k < actual.size(); ++k) {
    Tensor e = expected[k];
    if (is_floating(e.dtype()) && actual[k].defined() && is_floating(actual[k].dtype())) e = e.to(actual[k].dtype());
    // float32 kernels round each step; the reference works in double on the same float32 inputs.
    bool single = e.dtype() == DType::Float32;
    std::string diff = mismatch(actual[k], e, single ? 1e-4 : 1e-9, single ? 1e-4 : 1e-10);
    if (!diff.empty()) FAIL_CHECK(where << "\n  output " << k << ": " << diff);
  }
  for (size_t k = 0; k < inputs.laid.size(); ++k) {
    Tensor expected_buffer = before[k];
    if (def.writes_input && k == 0) {
      NoGradGuard no_grad;
      view_of_buffer(expected_buffer, recipes[0], values[0].shape()).copy_(actual[0]);
    }
    if (!same_values(inputs.laid[k].buffer, expected_buffer))
      FAIL_CHECK(where << "\n  the buffer of input " << k << " changed outside the op's output");
  }
}

}  // namespace

TEST_CASE("every op has a random-case generator") {
  for (OpId id : all_ops()) {
    CAPTURE(name_of(id));
    CHECK_MESSAGE(bool(valid_generator(id)),
                  "op " << name_of(id) << " has no generator in tests/property_generators.cpp");
  }
}

TEST_CASE("every op matches its reference on random shapes, layouts and dtypes") {
  int64_t cases = 0;
  for_each_case(
      1, false, [](const OpDef& def) { return bool(def.reference); },
      [&](Drawn& d) {
        std::vector<Recipe> recipes;
        std::vector<Tensor> values;
        for (const Tensor& x : d.c.inputs) {
          recipes.push_back(random_recipe(x.shape(), d.rng, d.c.expandable, true));
          values.push_back(collapsed(x, recipes.back()));
        }
        check_forward(d.id, d.c, values, recipes, DType::Float64, d.context);
        check_forward(d.id, d.c, values, recipes, DType::Float32, d.context);
        ++cases;
      });
  MESSAGE(cases << " random cases (each in float64 and float32) over " << kOpCount << " ops, " << seeds().size()
                << " seeds each");
}

TEST_CASE("every differentiable op's gradients match finite differences on random cases") {
  int64_t checked = 0;
  std::map<OpId, int64_t> checked_per_op;
  for_each_case(
      2, true, [](const OpDef& def) { return def.backward != nullptr; },
      [&](Drawn& d) {
        const Case& c = d.c;
        if (!c.gradcheck) return;
        // Leaves are buffers laid out like the inputs (permuted, expanded: no junk to perturb); the
        // views to the op's inputs are part of the function, so their backward rules are checked too.
        // view refuses most permuted and expanded layouts (the forward test covers those).
        bool plain = d.id == OpId::view;
        std::vector<Recipe> recipes;
        std::vector<Tensor> leaves;
        int64_t elements = 0;
        for (size_t k = 0; k < c.inputs.size(); ++k) {
          Recipe recipe = random_recipe(c.inputs[k].shape(), d.rng, c.expandable && !plain, false);
          if (plain) std::iota(recipe.order.begin(), recipe.order.end(), 0);
          Laid laid = lay_out(collapsed(c.inputs[k], recipe), recipe);
          if (laid.buffer.dtype() == DType::Float64 && !(k < c.no_grad.size() && c.no_grad[k]) &&
              !integer_valued(laid.buffer)) {
            laid.buffer.set_requires_grad();
            elements += std::max<int64_t>(laid.buffer.numel(), 1);
          }
          recipes.push_back(recipe);
          leaves.push_back(laid.buffer);
        }
        if (elements == 0 || elements > 400) return;  // nothing to differentiate, or too slow
        auto fn = [&](const std::vector<Tensor>& in) {
          std::vector<Tensor> views;
          for (size_t k = 0; k < in.size(); ++k)
            views.push_back(view_of_buffer(in[k], recipes[k], c.inputs[k].shape()));
          return call(d.id, views, c.attrs);
        };
        std::string failure;
        try {
          failure = autograd::gradcheck(fn, leaves);
        } catch (const Error& error) {
          failure = std::string("threw: ") + error.what();
        }
        ++checked;
        ++checked_per_op[d.id];
        CHECK_MESSAGE(failure.empty(),
                      d.context << inputs_str(c.inputs) << "\n  attrs: " << attrs_str(c.attrs) << "\n  " << failure);
      });
  MESSAGE(checked << " random gradient checks");
  // Cases are skipped (no float input, too many elements, ties), but over the default 32 seeds or
  // more every differentiable op must get some; a single seed rerun (MF_PROPERTY_SEED) need not.
  if (seeds().size() < 32) return;
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    if (registry()[id].backward == nullptr) continue;
    CHECK_MESSAGE(checked_per_op[id] > 0, "no random gradient check ran for " << name_of(id));
  }
}

namespace {

/// Empty when the call raised mf::Error naming the op, else what happened instead.
std::string refusal(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  std::string prefix = std::string(name_of(id)) + ": ";
  try {
    call(id, inputs, attrs);
  } catch (const Error& error) {
    std::string message = error.what();
    return message.starts_with(prefix) ? "" : "mf::Error that does not name the op: " + message;
  } catch (const std::exception& error) {
    return std::string("an exception other than mf::Error: ") + error.what();
  }
  return "no error";
}

/// Inputs laid out at random (a refusal must not depend on the layout).
std::vector<Tensor> strided(const std::vector<Tensor>& inputs, Rng& rng) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    Recipe recipe = random_recipe(t.shape(), rng, false, true);
    out.push_back(lay_out(t, recipe).view);
  }
  return out;
}

}  // namespace

TEST_CASE("every op refuses calls that break its contract with an mf::Error naming it") {
  int64_t refusals = 0;
  for_each_case(3, true, any_op, [&](Drawn& d) {
    std::optional<std::vector<Invalid>> invalid = invalid_cases(d.id, d.c, d.rng);
    REQUIRE_MESSAGE(invalid.has_value(),
                    "op " << name_of(d.id) << " has no invalid cases in tests/property_invalid.cpp");
    for (size_t k = 0; k < d.c.inputs.size(); ++k) {
      std::vector<Tensor> inputs = d.c.inputs;
      inputs[k] = Tensor();
      invalid->push_back({fmt::format("input {} undefined", k), inputs, d.c.attrs});
    }
    for (const Invalid& bad : *invalid) {
      std::vector<Tensor> inputs = bad.as_laid_out ? bad.inputs : strided(bad.inputs, d.rng);
      std::string failure = refusal(d.id, inputs, bad.attrs);
      ++refusals;
      CHECK_MESSAGE(failure.empty(), d.context << ": " << bad.what << inputs_str(inputs)
                                               << "\n  attrs: " << attrs_str(bad.attrs) << "\n  " << failure);
    }
  });
  MESSAGE(refusals << " invalid calls refused");
}

namespace {

/// One random change to a valid call: an input's dtype, rank or sizes, or an attribute. The result
/// may still be valid; what the op must never do with it is crash or throw anything but mf::Error.
void mutate(std::vector<Tensor>& inputs, Attrs& attrs, Rng& rng) {
  // Each change touches the fields of its kind that the op's struct has.
  auto change = [&attrs](auto touch) { std::visit(touch, attrs); };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> integers = {-3, -2, -1, 0, 1, 2, 3, 5, int64_t{1} << 62, kMax, kMin};
  std::vector<double> reals = {-1, 0, 0.5, 1, 2, std::nan(""), std::numeric_limits<double>::infinity()};
  int64_t what = rng.integer(0, inputs.empty() ? 5 : 8);
  size_t k = inputs.empty() ? 0 : static_cast<size_t>(rng.integer(0, static_cast<int64_t>(inputs.size()) - 1));
  switch (what) {
    case 0: {
      int64_t dim = rng.pick(integers);
      change([&](auto& p) {
        if constexpr (requires { p.dim; }) p.dim = dim;
      });
      break;
    }
    case 1: {
      int64_t count = rng.pick(integers);
      change([&](auto& p) {
        if constexpr (requires { p.k; }) p.k = count;
        if constexpr (requires { p.num_classes; }) p.num_classes = count;
        if constexpr (requires { p.diagonal; }) p.diagonal = count;
        if constexpr (requires { p.num_embeddings; }) p.num_embeddings = count;
      });
      break;
    }
    case 2: {
      Shape dims;
      for (int64_t n = rng.integer(0, 4); n > 0; --n)
        dims.push_back(rng.chance(0.8) ? rng.integer(-5, 5) : rng.pick(integers));
      change([&](auto& p) {
        if constexpr (requires { p.dims; }) p.dims = dims;
        if constexpr (requires { p.shape; }) p.shape = dims;
        if constexpr (requires { p.normalized_shape; }) p.normalized_shape = dims;
      });
      break;
    }
    case 3: {
      int64_t start = rng.pick(integers), end = rng.pick(integers), step = rng.pick(integers);
      change([&](auto& p) {
        if constexpr (requires { p.end; }) p.start = start, p.end = end, p.step = step;
        if constexpr (requires { p.index; }) p.index = start;
      });
      break;
    }
    case 4: {
      double value = rng.pick(reals), scale = rng.pick(reals), smoothing = rng.pick(reals);
      change([&](auto& p) {
        if constexpr (requires { p.value; }) p.value = value;
        if constexpr (requires { p.exponent; }) p.exponent = value;
        if constexpr (requires { p.p; }) p.p = value;
        if constexpr (requires { p.mean; }) p.mean = value, p.std = scale;
        if constexpr (std::is_same_v<std::decay_t<decltype(p)>, ArangeParams>) p.start = value, p.step = scale;
        if constexpr (requires { p.eps; }) p.eps = scale;
        if constexpr (requires { p.label_smoothing; }) p.label_smoothing = smoothing;
      });
      break;
    }
    case 5: {
      int64_t correction = rng.pick(integers), ignore_index = rng.pick(integers);
      double min = rng.pick(reals), max = rng.pick(reals);
      change([&](auto& p) {
        if constexpr (requires { p.correction; }) p.correction = correction;
        if constexpr (requires { p.ignore_index; }) p.ignore_index = ignore_index;
        if constexpr (requires { p.padding_idx; }) p.padding_idx = ignore_index;
        if constexpr (requires { p.min; }) p.min = min, p.max = max;
        if constexpr (requires { p.low; }) p.low = min, p.high = max;
      });
      break;
    }
    case 6: {
      std::vector<DType> dtypes = {DType::Float32, DType::Float64, DType::Int64, DType::Bool};
      // New values in [-2, 3], not a cast: casting -inf (softmax's samples) to int64 is undefined.
      Tensor like = reference::make({2}, rng.pick(dtypes), {-2, 3});
      if (inputs[k].defined()) inputs[k] = draw_like(like, inputs[k].shape(), rng);
      break;
    }
    default: {  // another shape: one dim more, one fewer, or one size changed
      if (!inputs[k].defined()) break;
      Shape shape = inputs[k].shape();
      if (shape.empty() || rng.chance(0.3))
        shape.insert(shape.begin(), rng.integer(0, 3));
      else if (rng.chance(0.4))
        shape.erase(shape.begin() + rng.integer(0, static_cast<int64_t>(shape.size()) - 1));
      else
        shape[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(shape.size()) - 1))] = rng.integer(0, 4);
      inputs[k] = draw_like(inputs[k], shape, rng);
    }
  }
}

}  // namespace

TEST_CASE("random changes to valid calls raise mf::Error or succeed, never crash") {
  int64_t calls = 0;
  for_each_case(4, true, any_op, [&](Drawn& d) {
    for (int64_t n = d.rng.integer(1, 3); n > 0; --n) mutate(d.c.inputs, d.c.attrs, d.rng);
    std::vector<Tensor> inputs = strided(d.c.inputs, d.rng);
    std::string outcome = refusal(d.id, inputs, d.c.attrs);
    ++calls;
    CHECK_MESSAGE((outcome.empty() || outcome == "no error"),
                  d.context << inputs_str(inputs) << "\n  attrs: " << attrs_str(d.c.attrs) << "\n  " << outcome);
  });
  MESSAGE(calls << " mutated calls");
}

TEST_CASE("ops refuse inputs on two devices") {
  if (!cuda::is_available()) {
    // Without a GPU no CUDA tensor can exist: making one, or copying one there, is refused.
    CHECK_THROWS_AS(Tensor::empty({2}, DType::Float32, Device::cuda()), Error);
    CHECK_THROWS_WITH_AS(call<OpId::to_device>({from_vector<double>({1, 2})}, {.device = Device::cuda()}),
                         doctest::Contains("to_device: "), Error);
    MESSAGE("SKIPPED: no GPU: mixed-device calls not run");
    return;
  }
  for_each_case(
      5, true, [](const OpDef& def) { return !def.mixes_devices; },
      [&](Drawn& d) {
        if (d.c.inputs.size() < 2) return;
        std::vector<Tensor> inputs = d.c.inputs;
        inputs.back() = inputs.back().to(Device::cuda());
        std::string failure = refusal(d.id, inputs, d.c.attrs);
        CHECK_MESSAGE(failure.empty(), d.context << ", last input on cuda: " << failure);
      });
}
