// optim: SGD, Adam, AdamW against torch.optim's published update rules (worked in plain double
// arithmetic here) and against PyTorch's own numbers in the shared reference file; schedulers against
// their formulas; gradient clipping against hand-computed norms; bit-exact resume from state dicts;
// and a small MLP that learns a real task.
#include <doctest/doctest.h>

#include "helpers.h"
#include "reference.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;
using mf::testing::ThreadCountGuard;

namespace {

/// A float64 leaf parameter holding `values`, with gradient `grad` (if given).
Tensor param(const std::vector<double>& values, const std::vector<double>& grad = {}) {
  Tensor p = f64(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad();
  if (!grad.empty()) p.set_grad(f64(grad, {static_cast<int64_t>(grad.size())}));
  return p;
}

void set_grad(Tensor& p, const std::vector<double>& grad) {
  p.set_grad(f64(grad, {static_cast<int64_t>(grad.size())}));
}

/// Runs `steps` updates of `expected` (an independent per-element rule) and of the optimizer, checking
/// the parameter after each. grads[s] is the gradient at step s.
void check_steps(optim::Optimizer& opt, Tensor& p, std::vector<double> expected,
                 const std::vector<std::vector<double>>& grads,
                 const std::function<void(std::vector<double>&, const std::vector<double>&, int)>& rule) {
  for (size_t s = 0; s < grads.size(); ++s) {
    CAPTURE(s);
    set_grad(p, grads[s]);
    opt.step();
    rule(expected, grads[s], static_cast<int>(s) + 1);
    check_close(p, f64(expected, {static_cast<int64_t>(expected.size())}), 1e-14, 1e-15);
  }
}

const std::vector<double> kP0 = {1.0, -2.0, 0.5};
const std::vector<std::vector<double>> kGrads = {{0.1, 0.2, -0.3}, {-0.4, 0.05, 0.3}, {0.02, -0.01, 0.001}};



}  // namespace

// ---- SGD ----------------------------------------------------------------------------------------

TEST_CASE("SGD without momentum: p -= lr * g (hand-worked)") {
  // 1 - 0.1 * 0.1 = 0.99; -2 - 0.1 * 0.2 = -2.02; 0.5 + 0.1 * 0.3 = 0.53.
  Tensor p = param(kP0, kGrads[0]);
  optim::SGD opt({p}, {.lr = 0.1});
  opt.step();
  check_close(p, f64({0.99, -2.02, 0.53}, {3}), 1e-15, 1e-15);
  CHECK(opt.param_state(0).buffers.empty());
}

TEST_CASE("SGD with momentum, dampening and weight decay follows torch.optim.SGD") {
  // torch.optim.SGD: d = g + wd p; b = d on the first step, else mu b + (1 - dampening) d; p -= lr b.
  const double lr = 0.1, mu = 0.9, damp = 0.1, wd = 0.01;
  Tensor p = param(kP0);
  optim::SGD opt({p}, {.lr = lr, .momentum = mu, .dampening = damp, .weight_decay = wd});
  std::vector<double> buf(3);
  check_steps(opt, p, kP0, kGrads, [&](std::vector<double>& x, const std::vector<double>& g, int step) {
    for (size_t i = 0; i < x.size(); ++i) {
      double d = g[i] + wd * x[i];
      buf[i] = step == 1 ? d : mu * buf[i] + (1 - damp) * d;
      x[i] -= lr * buf[i];
    }
  });
  CHECK(opt.param_state(0).buffers.count("momentum_buffer") == 1);
}

TEST_CASE("SGD with Nesterov momentum follows torch.optim.SGD") {
  // Nesterov: b as above (dampening 0); the step uses d + mu b.
  const double lr = 0.05, mu = 0.8, wd = 0.1;
  Tensor p = param(kP0);
  optim::SGD opt({p}, {.lr = lr, .momentum = mu, .weight_decay = wd, .nesterov = true});
  std::vector<double> buf(3);
  check_steps(opt, p, kP0, kGrads, [&](std::vector<double>& x, const std::vector<double>& g, int step) {
    for (size_t i = 0; i < x.size(); ++i) {
      double d = g[i] + wd * x[i];
      buf[i] = step == 1 ? d : mu * buf[i] + d;
      x[i] -= lr * (d + mu * buf[i]);
    }
  });
}

TEST_CASE("SGD refuses bad options and duplicate parameters") {
  Tensor p = param(kP0);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = -1}), doctest::Contains("lr must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), doctest::Contains("nesterov needs momentum"),
                       Error);
  CHECK_THROWS_WITH_AS(optim::SGD({p, p}, {.lr = 0.1}), doctest::Contains("more than one place"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({zeros({2}, DType::Int64)}, {.lr = 0.1}), doctest::Contains("int64"), Error);
}

// ---- Adam / AdamW -------------------------------------------------------------------------------

namespace {

/// The Adam rule as the paper writes it (Kingma & Ba, Algorithm 1, with PyTorch's options):
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; m_hat = m / (1-b1^t); v_hat = v / (1-b2^t)
/// (AMSGrad: v_hat from the running max of v); p -= lr m_hat / (sqrt(v_hat) + eps).
/// torch.optim divides sqrt(v) by sqrt(1-b2^t) instead: the same number up to rounding.
struct AdamRule {
  double lr, b1, b2, eps, wd;
  bool decoupled, amsgrad;
  std::vector<double> m = std::vector<double>(3), v = std::vector<double>(3), v_max = std::vector<double>(3);
  void operator()(std::vector<double>& x, const std::vector<double>& grad, int t) {
    for (size_t i = 0; i < x.size(); ++i) {
      double g = grad[i];
      if (decoupled) x[i] *= 1 - lr * wd;  // AdamW: decay the weights, not the gradient
      else g += wd * x[i];                 // Adam: L2 penalty in the gradient
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      v_max[i] = std::max(v_max[i], v[i]);
      double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = (amsgrad ? v_max[i] : v[i]) / (1 - std::pow(b2, t));
      x[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

}  // namespace

TEST_CASE("Adam's first step moves each weight by about lr against its gradient's sign") {
  // Step 1: m_hat = g, v_hat = g^2, so p -= lr g / (|g| + eps): 1 - 0.1 * 0.1 / (0.1 + 1e-8) etc.
  Tensor p = param(kP0, kGrads[0]);
  optim::Adam opt({p}, {.lr = 0.1});
  opt.step();
  check_close(p, f64({1 - 0.1 * 0.1 / (0.1 + 1e-8), -2 - 0.1 * 0.2 / (0.2 + 1e-8), 0.5 + 0.1 * 0.3 / (0.3 + 1e-8)}, {3}),
              1e-14, 1e-15);
  CHECK(opt.param_state(0).step == 1);
}

TEST_CASE("Adam, Adam with L2, AMSGrad and AdamW follow the published rules over several steps") {
  SUBCASE("Adam") {
    Tensor p = param(kP0);
    optim::Adam opt({p}, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6});
    check_steps(opt, p, kP0, kGrads, AdamRule{0.01, 0.8, 0.9, 1e-6, 0, false, false});
  }
  SUBCASE("Adam with weight decay") {
    Tensor p = param(kP0);
    optim::Adam opt({p}, {.lr = 0.01, .weight_decay = 0.1});
    check_steps(opt, p, kP0, kGrads, AdamRule{0.01, 0.9, 0.999, 1e-8, 0.1, false, false});
  }
  SUBCASE("AMSGrad (the third gradient is small, so v_max differs from v)") {
    Tensor p = param(kP0);
    optim::Adam opt({p}, {.lr = 0.01, .beta2 = 0.5, .amsgrad = true});
    check_steps(opt, p, kP0, kGrads, AdamRule{0.01, 0.9, 0.5, 1e-8, 0, false, true});
    CHECK(opt.param_state(0).buffers.count("max_exp_avg_sq") == 1);
  }
  SUBCASE("AdamW (default weight decay 0.01)") {
    Tensor p = param(kP0);
    optim::AdamWOptions options{.lr = 0.05};
    CHECK(options.weight_decay == 0.01);
    optim::AdamW opt({p}, options);
    check_steps(opt, p, kP0, kGrads, AdamRule{0.05, 0.9, 0.999, 1e-8, 0.01, true, false});
  }
}

TEST_CASE("float32 parameters are updated in float32 by the same rule") {
  Tensor p = from_vector(std::vector<float>{1.0f, -2.0f, 0.5f}).set_requires_grad();
  optim::Adam opt({p}, {.lr = 0.01, .amsgrad = true});
  AdamRule rule{0.01, 0.9, 0.999, 1e-8, 0, false, true};
  std::vector<double> expected = kP0;
  for (int s = 0; s < 3; ++s) {
    std::vector<float> g(kGrads[s].begin(), kGrads[s].end());
    p.set_grad(from_vector(g));
    opt.step();
    rule(expected, std::vector<double>(g.begin(), g.end()), s + 1);
  }
  CHECK(p.dtype() == DType::Float32);
  check_close(p.to(DType::Float64), f64(expected, {3}), 1e-6, 1e-7);
  // A gradient that does not match its parameter (set_grad refuses one; the autograd slot does not) is refused.
  p.autograd_meta().grad = f64({1, 1}, {2});
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("is float32 [3] but its gradient is float64 [2]"), Error);
}

TEST_CASE("Adam and AdamW match PyTorch on every parameter of the reference Transformer") {
  const std::map<std::string, Tensor>& tensors = testing::reference_tensors();
  nlohmann::json config = nlohmann::json::parse(testing::reference_config_json());
  for (Device device : testing::test_devices())
    for (const char* which : {"adam", "adamw"}) {
      CAPTURE(device);
      CAPTURE(which);
      const nlohmann::json& c = config.at(which);
      std::vector<std::string> names;
      std::vector<Tensor> params;
      for (const auto& [key, tensor] : tensors) {
        if (!key.starts_with("param.")) continue;
        std::string name = key.substr(6);
        Tensor p = tensor.clone().to(device);
        p.set_requires_grad();
        p.set_grad(tensors.at("grad." + name).to(device));
        names.push_back(name);
        params.push_back(p);
      }
      REQUIRE(names.size() > 40);
      double lr = c.at("lr"), b1 = c.at("betas").at(0), b2 = c.at("betas").at(1), eps = c.at("eps");
      if (std::string(which) == "adam") {
        optim::Adam(params, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps}).step();
      } else {
        optim::AdamW(params, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = c.at("weight_decay")})
            .step();
      }
      for (size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        check_close(params[i], tensors.at(std::string(which) + "1." + names[i]), 1e-12, 1e-15);
      }
    }
}

// ---- the Optimizer base -------------------------------------------------------------------------

TEST_CASE("groups have their own options; parameters without a gradient are skipped; zero_grad drops grads") {
  Tensor a = param({1.0}, {1.0}), b = param({1.0}, {1.0}), c = param({1.0});
  optim::SGD opt({{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.5}}});
  opt.add_param_group({{c}, {.lr = 1.0}});
  REQUIRE(opt.num_param_groups() == 3);
  opt.set_lr(0, 0.25);
  CHECK(opt.lr(0) == 0.25);
  opt.step();
  CHECK(a.item<double>() == 0.75);
  CHECK(b.item<double>() == 0.5);
  CHECK(c.item<double>() == 1.0);  // no gradient: untouched, step count stays 0
  CHECK(opt.param_state(1).step == 1);
  CHECK(opt.param_state(2).step == 0);
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  CHECK_THROWS_WITH_AS(opt.add_param_group({{a}, {.lr = 1.0}}), doctest::Contains("more than one place"), Error);
}

TEST_CASE("a non-contiguous parameter is updated in place") {
  Tensor base = f64({1, 2, 3, 4}, {2, 2});
  base.set_requires_grad();
  Tensor p = base.t();  // strides [1, 2]
  p.set_grad(f64({1, 1, 1, 1}, {2, 2}));
  optim::SGD opt({p}, {.lr = 1});
  opt.step();
  CHECK(base.to_vector<double>() == std::vector<double>{0, 1, 2, 3});
}

TEST_CASE("a large update split over threads gives the same bits as one thread") {
  auto run_adam = [](int threads) {
    set_num_threads(threads);
    Generator gen(3);
    Tensor p = randn({300000}, DType::Float32, Device::cpu(), &gen).set_requires_grad();
    optim::Adam opt({p}, {.lr = 0.01, .weight_decay = 0.1});
    for (int s = 0; s < 2; ++s) {
      p.set_grad(randn({300000}, DType::Float32, Device::cpu(), &gen));
      opt.step();
    }
    return p.to_vector<float>();
  };
  ThreadCountGuard restore_threads;
  std::vector<float> serial = run_adam(1), parallel = run_adam(4);
  CHECK(serial == parallel);
}

namespace {

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

/// The parameter and every state buffer after three steps of the optimizer `make` builds, with
/// random gradients from a fixed seed, updated by the fused CPU loop or by tensor ops.
std::vector<std::vector<double>> after_three_steps(const MakeOptimizer& make, DType dtype, bool fused) {
  Generator gen(11);
  Tensor p = randn({1000}, dtype, Device::cpu(), &gen).set_requires_grad();
  std::unique_ptr<optim::Optimizer> opt = make({p});
  opt->set_fused(fused);
  for (int s = 0; s < 3; ++s) {
    p.set_grad(randn({1000}, dtype, Device::cpu(), &gen).mul(s == 1 ? 0.01 : 1.0));  // v shrinks: amsgrad's max acts
    opt->step();
  }
  std::vector<std::vector<double>> out{p.to_vector<double>()};
  for (const auto& [name, buffer] : opt->param_state(0).buffers) out.push_back(buffer.to_vector<double>());
  return out;
}

}  // namespace

TEST_CASE("the tensor-op update that non-CPU devices use gives the fused CPU loop's bits") {
  // Both forms round each term to the parameter's dtype in the same order, so they must agree exactly;
  // a term regrouped in either (say c2 * (g * g) for (c2 * g) * g) changes the last bits of float32.
  std::vector<std::pair<const char*, MakeOptimizer>> optimizers = {
      {"Adam", [](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 0.01}); }},
      {"Adam L2 amsgrad",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"AdamW amsgrad",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"SGD", [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1}); }},
      {"SGD momentum dampening L2",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(
             p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01});
       }},
      {"SGD nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
       }},
  };
  for (const auto& [name, make] : optimizers)
    for (DType dtype : {DType::Float32, DType::Float64}) {
      std::string optimizer = name;
      CAPTURE(optimizer);
      CAPTURE(dtype_name(dtype));
      std::vector<std::vector<double>> fused = after_three_steps(make, dtype, true);
      std::vector<std::vector<double>> ops = after_three_steps(make, dtype, false);
      REQUIRE(fused.size() == ops.size());
      for (size_t k = 0; k < fused.size(); ++k) {
        CAPTURE(k);  // 0: the parameter, then the buffers in name order
        CHECK(fused[k] == ops[k]);
      }
    }
}

TEST_CASE("parameters slipped into a group's list behind the optimizer's back are refused") {
  Tensor a = param({1.0}, {1.0});
  optim::SGD opt({a}, {.lr = 0.1});
  opt.param_groups()[0].params.push_back(param({2.0}, {1.0}));
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("add parameters with add_param_group"), Error);
}

// ---- state dicts --------------------------------------------------------------------------------

namespace {

/// Gradient of sum(w * (p - target)^2) with a different weighting per step, so runs are not trivial.
void quadratic_grad(Tensor& p, int step) {
  NoGradGuard no_grad;
  Tensor target = f64({0.3, -0.7, 1.1, 0.0, 2.0, -1.5}, {2, 3});
  p.set_grad((p - target) * (2.0 + std::sin(static_cast<double>(step))));
}

/// k steps of `opt` on the quadratic, from step number `first`.
void run(optim::Optimizer& opt, std::vector<Tensor>& params, int first, int k) {
  for (int s = first; s < first + k; ++s) {
    for (Tensor& p : params) quadratic_grad(p, s);
    opt.step();
  }
}

template <typename Opt, typename Options>
void check_resume(Options options) {
  const int k = 5;
  auto make = [] {
    return std::vector<Tensor>{f64({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {2, 3}).set_requires_grad(),
                               f64({-1, 1, 0.5, 2, 0, 1}, {2, 3}).set_requires_grad()};
  };
  std::vector<Tensor> params = make();
  Opt opt({{{params[0]}, options}, {{params[1]}, options}});
  run(opt, params, 0, k);
  optim::OptimizerState saved = opt.state_dict();
  std::vector<Tensor> resumed = make();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) resumed[i].copy_(params[i]);
  }
  run(opt, params, k, k);

  Opt fresh({{{resumed[0]}, Options{}}, {{resumed[1]}, Options{}}});
  fresh.load_state_dict(saved);
  CHECK(fresh.lr(1) == options.lr);
  CHECK(fresh.param_state(1).step == k);
  run(fresh, resumed, k, k);
  for (size_t i = 0; i < params.size(); ++i)
    CHECK(resumed[i].to_vector<double>() == params[i].to_vector<double>());  // bitwise
}

}  // namespace

TEST_CASE("training resumes bit for bit from a state dict") {
  SUBCASE("SGD") { check_resume<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}); }
  SUBCASE("Adam") { check_resume<optim::Adam>(optim::AdamOptions{.lr = 0.03, .weight_decay = 0.1, .amsgrad = true}); }
  SUBCASE("AdamW") { check_resume<optim::AdamW>(optim::AdamWOptions{.lr = 0.02, .beta2 = 0.98}); }
}

TEST_CASE("state dicts name their tensors and loading refuses a mismatch") {
  Tensor a = param({1, 2}, {0.1, 0.2}), b = param({3}, {0.3});
  optim::Adam opt({a, b}, {});
  opt.step();
  optim::OptimizerState state = opt.state_dict();
  CHECK(nn::find(state.tensors, "state.1.exp_avg_sq") != nullptr);
  CHECK(state.tensors.size() == 4);
  CHECK(nlohmann::json::parse(state.json).at("param_groups").at(0).at("options").at("lr") == 1e-3);

  optim::Adam fewer({a}, {});
  CHECK_THROWS_WITH_AS(fewer.load_state_dict(state), doctest::Contains("1 in the optimizer"), Error);
  Tensor wrong = param({1, 2, 3});
  optim::Adam reshaped({a, wrong}, {});
  CHECK_THROWS_WITH_AS(reshaped.load_state_dict(state), doctest::Contains("has shape [3]"), Error);
  CHECK(reshaped.param_state(1).buffers.empty());  // nothing changed
  optim::SGD other({a, b}, {.lr = 0.1});
  CHECK_THROWS_WITH_AS(other.load_state_dict(state), doctest::Contains("the state is from Adam"), Error);
  optim::OptimizerState missing = state;
  missing.tensors.pop_back();
  CHECK_THROWS_WITH_AS(optim::Adam({a, b}, {}).load_state_dict(missing), doctest::Contains("is missing"), Error);
  CHECK_THROWS_WITH_AS(optim::Adam({a, b}, {}).load_state_dict({state.tensors, "{"}), doctest::Contains("malformed"),
                       Error);
  // Options nested deeper than {"betas": [..]} are refused before they are dumped (recursively).
  nlohmann::json deep_options = nlohmann::json::parse(state.json);
  deep_options["param_groups"][0]["options"]["lr"] = nlohmann::json::parse("[[[1]]]");
  CHECK_THROWS_WITH_AS(optim::Adam({a, b}, {}).load_state_dict({state.tensors, deep_options.dump()}),
                       "Adam::load_state_dict: the options of group 0 nest deeper than options do", Error);
  // A step count the next update would overflow (or a negative one) is refused, as found for the
  // schedulers' counters with fuzz_checkpoint.
  for (const char* step : {"9223372036854775807", "-1"}) {
    CAPTURE(step);
    nlohmann::json j = nlohmann::json::parse(state.json);
    j["state"][1]["step"] = nlohmann::json::parse(step);
    CHECK_THROWS_WITH_AS(optim::Adam({a, b}, {}).load_state_dict({state.tensors, j.dump()}),
                         (std::string("Adam::load_state_dict: parameter 1 has step count ") + step +
                          ", outside [0, 2^53]").c_str(),
                         Error);
  }
}

// ---- schedulers ---------------------------------------------------------------------------------

TEST_CASE("NoamLR follows the Transformer paper's formula and peaks at step = warmup") {
  Tensor p = param({1.0});
  optim::Adam opt({p}, {.lr = 123});  // Noam replaces the base lr
  const int d_model = 512, warmup = 40;
  optim::NoamLR sched(opt, d_model, warmup, 2.0);
  int peak = 0;
  double best = 0;
  for (int t = 1; t <= 200; ++t) {
    CAPTURE(t);
    double expected = 2.0 * std::pow(d_model, -0.5) * std::min(std::pow(t, -0.5), t * std::pow(warmup, -1.5));
    CHECK(opt.lr(0) == doctest::Approx(expected).epsilon(1e-14));
    CHECK(sched.get_last_lr().at(0) == opt.lr(0));
    if (opt.lr(0) > best) best = opt.lr(0), peak = t;
    sched.step();
  }
  CHECK(peak == warmup);
  // at the peak: 2 / sqrt(512) / sqrt(40)
  CHECK(best == doctest::Approx(2.0 / std::sqrt(512.0) / std::sqrt(40.0)).epsilon(1e-14));
}

TEST_CASE("LinearWarmupCosine warms up linearly, then follows a half cosine down to min_lr") {
  Tensor p = param({1.0});
  optim::SGD opt({{{p}, {.lr = 0.1}}, {{param({2.0})}, {.lr = 0.4}}});
  const int warmup = 10, total = 50;
  const double min_lr = 0.01;
  optim::LinearWarmupCosine sched(opt, warmup, total, min_lr);
  for (int t = 1; t <= 60; ++t) {
    CAPTURE(t);
    for (size_t g = 0; g < 2; ++g) {
      double base = g == 0 ? 0.1 : 0.4;
      double expected = t <= warmup ? base * t / warmup
                                    : min_lr + (base - min_lr) * 0.5 *
                                                   (1 + std::cos(std::numbers::pi * std::min(1.0, (t - warmup) / 40.0)));
      CHECK(opt.lr(g) == doctest::Approx(expected).epsilon(1e-14));
    }
    if (t == warmup) CHECK(opt.lr(1) == doctest::Approx(0.4).epsilon(1e-15));
    if (t >= total) CHECK(opt.lr(0) == doctest::Approx(min_lr).epsilon(1e-15));
    sched.step();
  }
  CHECK_THROWS_WITH_AS(optim::LinearWarmupCosine(opt, 10, 10), doctest::Contains("warmup < total_steps"), Error);
}

TEST_CASE("StepLR multiplies by gamma every step_size epochs") {
  optim::SGD opt({param({1.0})}, {.lr = 1.0});
  optim::StepLR sched(opt, 3, 0.5);
  // epochs 0..2: 1, 3..5: 0.5, 6..8: 0.25, ...
  for (int epoch = 0; epoch < 20; ++epoch) {
    CAPTURE(epoch);
    CHECK(opt.lr(0) == std::pow(0.5, epoch / 3));
    sched.step();
  }
}

TEST_CASE("a scheduler's state JSON restores its schedule") {
  optim::SGD opt({param({1.0})}, {.lr = 0.3});
  optim::LinearWarmupCosine sched(opt, 5, 30);
  for (int i = 0; i < 12; ++i) sched.step();
  std::string saved = sched.state_json();
  optim::SGD opt2({param({1.0})}, {.lr = 99});
  optim::LinearWarmupCosine sched2(opt2, 5, 30);
  sched2.load_state_json(saved);
  CHECK(opt2.lr(0) == opt.lr(0));
  sched.step();
  sched2.step();
  CHECK(opt2.lr(0) == opt.lr(0));
  CHECK_THROWS_WITH_AS(sched2.load_state_json("[1]"), doctest::Contains("malformed"), Error);
  // Found with fuzz_checkpoint: last_epoch 2^63 - 1 made lr_at's epoch + 1 overflow (undefined
  // behaviour) while loading. Counters outside [0, 2^53] are refused, and the schedule is unchanged.
  CHECK_THROWS_WITH_AS(sched2.load_state_json(R"({"base_lrs": [0.3], "last_epoch": 9223372036854775807})"),
                       "LRScheduler::load_state_json: last_epoch is 9223372036854775807, outside [0, 2^53]", Error);
  CHECK_THROWS_WITH_AS(sched2.load_state_json(R"({"base_lrs": [0.3], "last_epoch": -5})"),
                       "LRScheduler::load_state_json: last_epoch is -5, outside [0, 2^53]", Error);
  CHECK(sched2.last_epoch() == 13);
  optim::ReduceLROnPlateau plateau(opt2);
  CHECK_THROWS_WITH_AS(
      plateau.load_state_json(R"({"best": 1.0, "num_bad_epochs": -1, "cooldown_counter": 0, "last_epoch": 3})"),
      "ReduceLROnPlateau::load_state_json: num_bad_epochs is -1, outside [0, 2^53]", Error);
}

TEST_CASE("ReduceLROnPlateau: patience, relative threshold, cooldown and min_lr on a scripted metric") {
  optim::SGD opt({param({1.0})}, {.lr = 1.0});
  optim::ReduceLROnPlateau sched(opt, {.factor = 0.5, .patience = 2, .threshold = 0.1, .cooldown = 1, .min_lr = 0.2});
  // Better means < best * 0.9. Epoch by epoch (bad = epochs without improvement):
  //  1: 10 best=10 | 2: 9.5 bad 1 | 3: 9.2 bad 2 | 4: 9.1 bad 3 > 2 -> lr 0.5, cooldown 1
  //  5: 9.05 cooldown, bad reset | 6, 7: 9.5 bad 1, 2 | 8: 8 < 9 best=8 | 9, 10: bad 1, 2 | 11: bad 3 -> 0.25
  //  12: cooldown | 13, 14: bad 1, 2 | 15: bad 3 -> max(0.125, 0.2) = 0.2 | 16: cooldown | 17, 18 | 19: 0.2 stays
  std::vector<double> metrics = {10, 9.5, 9.2, 9.1, 9.05, 9.5, 9.5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
  std::vector<double> lrs = {1, 1, 1, .5, .5, .5, .5, .5, .5, .5, .25, .25, .25, .25, .2, .2, .2, .2, .2};
  std::string mid;
  for (size_t e = 0; e < metrics.size(); ++e) {
    CAPTURE(e + 1);
    sched.step(metrics[e]);
    CHECK(opt.lr(0) == lrs[e]);
    CHECK(sched.get_last_lr().at(0) == lrs[e]);
    if (e == 9) mid = sched.state_json();
  }
  // Restored after epoch 10 (bad 2): one more bad epoch reduces the lr.
  optim::SGD opt2({param({1.0})}, {.lr = 0.5});
  optim::ReduceLROnPlateau sched2(opt2, {.factor = 0.5, .patience = 2, .threshold = 0.1, .cooldown = 1});
  sched2.load_state_json(mid);
  sched2.step(8);
  CHECK(opt2.lr(0) == 0.25);

  SUBCASE("mode max") {
    optim::SGD opt3({param({1.0})}, {.lr = 1.0});
    optim::ReduceLROnPlateau max_sched(opt3, {.maximize = true, .patience = 0});
    max_sched.step(1);  // best 1
    max_sched.step(2);  // 2 > 1.0001: better
    CHECK(opt3.lr(0) == 1.0);
    max_sched.step(1.5);  // worse, patience 0 -> 0.1
    CHECK(opt3.lr(0) == doctest::Approx(0.1).epsilon(1e-15));
  }
}

// ---- gradient clipping --------------------------------------------------------------------------

TEST_CASE("clip_grad_norm_ scales by max_norm / (norm + 1e-6) and returns the norm") {
  // Gradients (3, 4) and (12): 2-norm sqrt(9 + 16 + 144) = 13, 1-norm 19, inf-norm 12.
  auto make = [] { return std::vector<Tensor>{param({0, 0}, {3, 4}), param({0}, {12}), param({0})}; };
  std::vector<Tensor> ps = make();
  CHECK(optim::clip_grad_norm_(ps, 6.5) == 13.0);
  double c = 6.5 / (13 + 1e-6);
  check_close(ps[0].grad(), f64({3 * c, 4 * c}, {2}), 1e-15, 0);
  check_close(ps[1].grad(), f64({12 * c}, {1}), 1e-15, 0);

  ps = make();
  CHECK(optim::clip_grad_norm_(ps, 100.0, 1.0) == 19.0);
  CHECK(ps[0].grad().to_vector<double>() == std::vector<double>{3, 4});  // under the limit: unchanged

  ps = make();
  CHECK(optim::clip_grad_norm_(ps, 6.0, optim::kInfNorm) == 12.0);
  check_close(ps[1].grad(), f64({12 * 6 / (12 + 1e-6)}, {1}), 1e-15, 0);
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(ps, 1.0, 0.0), doctest::Contains("norm_type"), Error);
}

TEST_CASE("clip_grad_norm_ with a non-finite gradient behaves as PyTorch's error_if_nonfinite=false") {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Tensor> ps = {param({0, 0}, {inf, 2}), param({0}, {1})};
  CHECK(std::isinf(optim::clip_grad_norm_(ps, 1.0)));
  // scale = 1 / inf = 0: finite entries become 0, the infinite one NaN
  std::vector<double> g = ps[0].grad().to_vector<double>();
  CHECK(std::isnan(g[0]));
  CHECK(g[1] == 0);
  CHECK(ps[1].grad().item<double>() == 0);

  std::vector<Tensor> nan_ps = {param({0, 0}, {std::nan(""), 2})};
  CHECK(std::isnan(optim::clip_grad_norm_(nan_ps, 1.0, optim::kInfNorm)));
  CHECK(std::isnan(nan_ps[0].grad().to_vector<double>()[1]));
  std::vector<Tensor> strict = {param({0}, {inf})};
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(strict, 1.0, 2.0, true), doctest::Contains("is inf"), Error);
}

// Gradients of many runs (clip_grad_norm_ sums CPU gradients in runs of 2^15 elements over the pool):
// 0.5 everywhere gives a sum of squares exact in any order (0.25 per element), so the norm is the
// square root of n / 4 to the bit; random ones give the same bits on 1 and 4 threads, and stay within
// 1e-12 of one float64 loop over every element (each order's rounding is about 1e-16 per addition).
TEST_CASE("clip_grad_norm_ over many runs of elements: exact sums exact, the same bits on any thread count") {
  auto with_grad = [](const Tensor& grad) {
    Tensor p = Tensor::empty(grad.shape(), grad.dtype()).set_requires_grad();
    p.set_grad(grad);
    return p;
  };
  const int64_t n = 100003;
  std::vector<Tensor> halves = {with_grad(full({n}, 0.5, DType::Float32)), with_grad(full({7}, 0.5))};
  CHECK(optim::clip_grad_norm_(halves, 1e9) == std::sqrt(static_cast<double>(n + 7) / 4));

  ThreadCountGuard restore_threads;
  auto norm_on = [&](int threads) {
    set_num_threads(threads);
    Generator gen(5);
    std::vector<Tensor> ps = {with_grad(randn({250000}, DType::Float32, Device::cpu(), &gen)),
                              with_grad(randn({3, 1000}, DType::Float64, Device::cpu(), &gen))};
    return optim::clip_grad_norm_(ps, 1e9, 3.0);
  };
  const double serial = norm_on(1);
  CHECK(serial == norm_on(4));
  Generator gen(5);
  double naive = 0;
  for (float x : randn({250000}, DType::Float32, Device::cpu(), &gen).to_vector<float>())
    naive += std::pow(std::abs(double{x}), 3);
  for (double x : randn({3, 1000}, DType::Float64, Device::cpu(), &gen).to_vector<double>())
    naive += std::pow(std::abs(x), 3);
  CHECK(std::abs(serial - std::cbrt(naive)) <= 1e-12 * std::cbrt(naive));
}

// The per-gradient terms that gradients off the CPU get from ops on their device, checked on every
// device against naive loops: |g|^p summed, or max |g|, NaN when an element is NaN (an infinite one
// gives inf, not NaN), 0 for an empty gradient.
TEST_CASE("clip_grad_norm_'s terms computed by ops where the gradients are match naive loops") {
  const double inf = std::numeric_limits<double>::infinity();
  for (Device device : testing::test_devices()) {
    CAPTURE(device);
    const std::vector<Tensor> grads = {f64({3, -4}, {2}).to(device),
                                       f64({1, -2, 0.5}, {3}).to(DType::Float32).to(device),
                                       Tensor::empty({0}, DType::Float32, device)};
    CHECK(optim::detail::norm_terms_where_they_are(grads, 2) == std::vector<double>{25, 5.25, 0});
    CHECK(optim::detail::norm_terms_where_they_are(grads, 1) == std::vector<double>{7, 3.5, 0});
    CHECK(optim::detail::norm_terms_where_they_are(grads, 3) == std::vector<double>{91, 9.125, 0});
    CHECK(optim::detail::norm_terms_where_they_are(grads, inf) == std::vector<double>{4, 2, 0});
    const std::vector<Tensor> odd = {f64({1, -inf}, {2}).to(device), f64({std::nan(""), 2}, {2}).to(device)};
    const std::vector<double> largest = optim::detail::norm_terms_where_they_are(odd, inf);
    CHECK(largest[0] == inf);
    CHECK(std::isnan(largest[1]));
    CHECK(optim::detail::norm_terms_where_they_are({}, 2).empty());
  }
}

TEST_CASE("clip_grad_norm_ with error_if_nonfinite names the norm and the gradient that made it") {
  const double inf = std::numeric_limits<double>::infinity();
  // Gradient 0 is finite, gradient 1 holds NaN: the 2-norm sqrt(9 + 16 + NaN) is NaN.
  std::vector<Tensor> ps = {param({0, 0}, {3, 4}), param({0, 0}, {1, std::nan("")})};
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(ps, 1.0, 2.0, true),
                       "clip_grad_norm_: the total 2-norm of the gradients is nan (from gradient 1 of 2, shape [2]), "
                       "so it cannot be clipped; pass error_if_nonfinite = false to scale by it anyway", Error);
  CHECK(ps[0].grad().to_vector<double>() == std::vector<double>{3, 4});  // left alone when refused
  // The max-norm of (-inf, 1) is inf; a finite set clips by max |g|: max(|-7|, 3, 5) = 7.
  std::vector<Tensor> inf_ps = {param({0}, {5}), param({0, 0}, {-inf, 1})};
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(inf_ps, 1.0, optim::kInfNorm, true),
                       doctest::Contains("the total inf-norm of the gradients is inf (from gradient 1 of 2"), Error);
  // The 0.5-norm (sum sqrt|g|)^2 of two gradients of 1e308: the sum 2e154 is finite, its square is not.
  std::vector<Tensor> huge = {param({0}, {1e308}), param({0}, {1e308})};
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(huge, 1.0, 0.5, true),
                       doctest::Contains("is inf (the root of a finite sum overflowed)"), Error);
  std::vector<Tensor> finite = {param({0, 0}, {-7, 3}), param({0}, {5})};
  CHECK(optim::clip_grad_norm_(finite, 3.5, optim::kInfNorm, true) == 7.0);
  double c = 3.5 / (7 + 1e-6);
  check_close(finite[0].grad(), f64({-7 * c, 3 * c}, {2}), 1e-15, 0);
  check_close(finite[1].grad(), f64({5 * c}, {1}), 1e-15, 0);
}

TEST_CASE("clip_grad_value_ clamps every element") {
  std::vector<Tensor> ps = {param({0, 0, 0}, {-3, 0.5, 2}), param({0})};
  optim::clip_grad_value_(ps, 1.0);
  CHECK(ps[0].grad().to_vector<double>() == std::vector<double>{-1, 0.5, 1});
}

// ---- learning a real task -----------------------------------------------------------------------

TEST_CASE("an MLP learns the XOR-of-signs problem with Adam") {
  // Points uniform on [-1, 1]^2, class 1 when x * y > 0: not linearly separable.
  Generator gen(7);
  const int64_t n = 400;
  Tensor x = uniform({n, 2}, -1, 1, DType::Float32, Device::cpu(), &gen);
  std::vector<float> xy = x.to_vector<float>();
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(xy[2 * i] * xy[2 * i + 1] > 0 ? 1 : 0);
  Tensor y = from_vector(labels);
  auto layer = [&](int64_t in, int64_t out) {
    double bound = 1 / std::sqrt(static_cast<double>(in));
    return std::vector<Tensor>{uniform({in, out}, -bound, bound, DType::Float32, Device::cpu(), &gen).set_requires_grad(),
                               zeros({out}).set_requires_grad()};
  };
  std::vector<Tensor> params;
  for (auto [in, out] : {std::pair<int64_t, int64_t>{2, 32}, {32, 32}, {32, 2}})
    for (Tensor& t : layer(in, out)) params.push_back(t);
  auto forward = [&] {
    Tensor h = x;
    for (size_t i = 0; i < params.size(); i += 2) {
      h = matmul(h, params[i]) + params[i + 1];
      if (i + 2 < params.size()) h = h.tanh();
    }
    return h;  // [N, 2]
  };
  optim::Adam opt(params, {.lr = 0.01});
  for (int step = 0; step < 400; ++step) {
    opt.zero_grad();
    cross_entropy(forward(), y).backward();
    opt.step();
  }
  NoGradGuard no_grad;
  double accuracy = forward().argmax(1).eq(y).to(DType::Float32).mean().item<double>();
  CHECK(accuracy > 0.95);
}
