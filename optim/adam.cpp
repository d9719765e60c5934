#include "optim/adam.h"

#include "core/parallel.h"
#include "ops/ops.h"
#include "ops/simd.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace mf::optim {

namespace {

constexpr const char* adam_name(bool decoupled) { return decoupled ? "AdamW" : "Adam"; }

template <typename T>
struct AdamBuffers {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
  T* max_exp_avg_sq;  // amsgrad only
};

template <typename T>
struct AdamScalars {
  T decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, bias_correction2_sqrt, neg_step;
};

/// Adam's update of elements [begin, end), one pass each, in torch.optim's order of operations
/// (addcmul: v + (c * g) * g; addcdiv: p + (c * m) / denom). The options arrive as template flags so
/// that the loop has no branches and vectorises (sqrt too: this library builds with -fno-math-errno).
template <bool Decoupled, bool CoupledDecay, bool AmsGrad, typename T>
MF_INLINE void adam_run(const AdamBuffers<T>& q, const AdamScalars<T>& k, int64_t begin, int64_t end) {
  T* __restrict p = q.param;
  const T* __restrict g = q.grad;
  T* __restrict m = q.exp_avg;
  T* __restrict v = q.exp_avg_sq;
  T* __restrict v_max = q.max_exp_avg_sq;
  for (int64_t i = begin; i < end; ++i) {
    T gi = g[i];
    if constexpr (Decoupled) p[i] = p[i] * k.decay;
    if constexpr (CoupledDecay) gi = gi + k.decay * p[i];
    m[i] = m[i] * k.beta1 + k.one_minus_beta1 * gi;
    v[i] = v[i] * k.beta2 + (k.one_minus_beta2 * gi) * gi;
    T v_hat = v[i];
    if constexpr (AmsGrad) v_hat = v_max[i] = std::max(v_max[i], v[i]);
    p[i] = p[i] + (k.neg_step * m[i]) / (std::sqrt(v_hat) / k.bias_correction2_sqrt + k.eps);
  }
}

/// The buffer `name` of `state`, created as zeros like `param` on first use.
Tensor& buffer(ParamState& state, const char* name, const Tensor& param) {
  auto it = state.buffers.find(name);
  if (it == state.buffers.end()) it = state.buffers.emplace(name, zeros_like(param)).first;
  return it->second;
}

}  // namespace

template <bool Decoupled>
void validate(const AdamOptionsT<Decoupled>& o) {
  const char* name = adam_name(Decoupled);
  MF_CHECK(o.lr >= 0, "{}: lr must be >= 0, got {}", name, o.lr);
  MF_CHECK(o.eps >= 0, "{}: eps must be >= 0, got {}", name, o.eps);
  MF_CHECK(o.beta1 >= 0 && o.beta1 < 1, "{}: beta1 must be in [0, 1), got {}", name, o.beta1);
  MF_CHECK(o.beta2 >= 0 && o.beta2 < 1, "{}: beta2 must be in [0, 1), got {}", name, o.beta2);
  MF_CHECK(o.weight_decay >= 0, "{}: weight_decay must be >= 0, got {}", name, o.weight_decay);
}

template <bool Decoupled>
BasicAdam<Decoupled>::BasicAdam(std::vector<Tensor> params, Options options)
    : BasicAdam(std::vector<ParamGroup<Options>>{{std::move(params), options}}) {}

template <bool Decoupled>
BasicAdam<Decoupled>::BasicAdam(std::vector<ParamGroup<Options>> groups)
    : OptimizerWithOptions<Options>(adam_name(Decoupled), std::move(groups)) {}

template <bool Decoupled>
void BasicAdam<Decoupled>::update(size_t group, Tensor& param, const Tensor& grad, ParamState& state) {
  const Options& o = this->groups_[group].options;
  Tensor& exp_avg = buffer(state, "exp_avg", param);
  Tensor& exp_avg_sq = buffer(state, "exp_avg_sq", param);
  Tensor max_exp_avg_sq = o.amsgrad ? buffer(state, "max_exp_avg_sq", param) : Tensor();
  // Step scalars in double, as torch.optim computes them in Python.
  const auto step = static_cast<double>(state.step);
  const double step_size = o.lr / (1 - std::pow(o.beta1, step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(o.beta2, step));
  visit_floating(param.dtype(), [&]<typename T>() {
    AdamBuffers<T> q{param.data_ptr<T>(), grad.data_ptr<T>(), exp_avg.data_ptr<T>(), exp_avg_sq.data_ptr<T>(),
                     o.amsgrad ? max_exp_avg_sq.data_ptr<T>() : nullptr};
    AdamScalars<T> k{.decay = static_cast<T>(Decoupled ? 1 - o.lr * o.weight_decay : o.weight_decay),
                     .beta1 = static_cast<T>(o.beta1), .beta2 = static_cast<T>(o.beta2),
                     .one_minus_beta1 = static_cast<T>(1 - o.beta1), .one_minus_beta2 = static_cast<T>(1 - o.beta2),
                     .eps = static_cast<T>(o.eps), .bias_correction2_sqrt = static_cast<T>(bias_correction2_sqrt),
                     .neg_step = static_cast<T>(-step_size)};
    bool coupled_decay = !Decoupled && o.weight_decay != 0;
    parallel_for(0, param.numel(), this->kGrain, [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int>() MF_LAMBDA_INLINE {
        if (o.amsgrad)
          coupled_decay ? adam_run<Decoupled, true, true>(q, k, begin, end) : adam_run<Decoupled, false, true>(q, k, begin, end);
        else
          coupled_decay ? adam_run<Decoupled, true, false>(q, k, begin, end) : adam_run<Decoupled, false, false>(q, k, begin, end);
      });
    });
  });
}

template <bool Decoupled>
std::string BasicAdam<Decoupled>::options_json(size_t group) const {
  const Options& o = this->groups_.at(group).options;
  return nlohmann::json{{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps},
                        {"weight_decay", o.weight_decay}, {"amsgrad", o.amsgrad}}
      .dump();
}

template <bool Decoupled>
void BasicAdam<Decoupled>::set_options_json(size_t group, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  Options o{.lr = j.at("lr"), .beta1 = j.at("betas").at(0), .beta2 = j.at("betas").at(1), .eps = j.at("eps"),
            .weight_decay = j.at("weight_decay"), .amsgrad = j.at("amsgrad")};
  validate(o);
  this->groups_.at(group).options = o;
}

template void validate(const AdamOptionsT<false>&);
template void validate(const AdamOptionsT<true>&);
template class BasicAdam<false>;
template class BasicAdam<true>;

}  // namespace mf::optim
