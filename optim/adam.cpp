#include "optim/adam.h"

#include "core/parallel.h"
#include "ops/functional.h"
#include "ops/cpu/simd.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>

namespace mf::optim {

namespace {

constexpr const char* adam_name(bool decoupled) { return decoupled ? "AdamW" : "Adam"; }

/// The buffer `name` of `state`, created as zeros like `param` (its dtype and device) on first use.
Tensor& buffer(ParamState& state, const char* name, const Tensor& param) {
  auto it = state.buffers.find(name);
  if (it == state.buffers.end()) it = state.buffers.emplace(name, zeros_like(param)).first;
  return it->second;
}

/// The larger of a and b as std::max picks it (a unless a < b, so a NaN in a stays), for CPU elements
/// and for tensors.
template <std::floating_point T>
MF_INLINE T larger(T a, T b) {
  return std::max(a, b);
}
Tensor larger(const Tensor& a, const Tensor& b) { return where(lt(a, b), b, a); }

/// One step's scalars, as S: the element type for the fused loop, double for tensor ops (which round
/// a scalar to the tensor's dtype, as the loop's casts do).
template <typename S>
struct AdamScalars {
  S decay, b1, b2, c1, c2, eps, bc2, neg_step;
};

/// Scalars in double, as torch.optim computes them in Python, then cast to S.
template <bool Decoupled, typename S>
AdamScalars<S> adam_scalars(const AdamOptionsT<Decoupled>& o, int64_t t) {
  const auto step = static_cast<double>(t);
  const double step_size = o.lr / (1 - std::pow(o.beta1, step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(o.beta2, step));
  return {static_cast<S>(Decoupled ? 1 - o.lr * o.weight_decay : o.weight_decay), static_cast<S>(o.beta1),
          static_cast<S>(o.beta2), static_cast<S>(1 - o.beta1), static_cast<S>(1 - o.beta2), static_cast<S>(o.eps),
          static_cast<S>(bias_correction2_sqrt), static_cast<S>(-step_size)};
}

/// Adam's update of one element (V = T) or one whole tensor (V = Tensor), in torch.optim's order of
/// operations (addcmul: v + (c * g) * g; addcdiv: p + (c * m) / denom). `l2`: Adam's weight decay
/// is on; v_max is null without amsgrad.
template <bool Decoupled, typename V, typename S>
MF_INLINE void adam_rule(V& p, V g, V& m, V& v, V* v_max, bool l2, const AdamScalars<S>& s) {
  using std::sqrt;
  if constexpr (Decoupled) {
    p = p * s.decay;
  } else if (l2) {
    g = g + s.decay * p;
  }
  m = m * s.b1 + s.c1 * g;
  v = v * s.b2 + (s.c2 * g) * g;
  V v_hat = v;
  if (v_max != nullptr) v_hat = *v_max = larger(*v_max, v);
  p = p + (s.neg_step * m) / (sqrt(v_hat) / s.bc2 + s.eps);
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
void BasicAdam<Decoupled>::update(size_t group, Tensor& param, const Tensor& grad, ParamState& state, bool fused) {
  const Options& o = this->groups_[group].options;
  Tensor& exp_avg = buffer(state, "exp_avg", param);
  Tensor& exp_avg_sq = buffer(state, "exp_avg_sq", param);
  Tensor* max_exp_avg_sq = o.amsgrad ? &buffer(state, "max_exp_avg_sq", param) : nullptr;
  const bool l2 = !Decoupled && o.weight_decay != 0;
  if (!fused) {
    Tensor p = param, m = exp_avg, v = exp_avg_sq, v_max = max_exp_avg_sq ? *max_exp_avg_sq : Tensor();
    adam_rule<Decoupled>(p, grad, m, v, max_exp_avg_sq ? &v_max : nullptr, l2,
                         adam_scalars<Decoupled, double>(o, state.step));
    param.copy_(p);
    exp_avg.copy_(m);
    exp_avg_sq.copy_(v);
    if (max_exp_avg_sq) max_exp_avg_sq->copy_(v_max);
    return;
  }
  visit_floating(param.dtype(), [&]<typename T>() {
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* m = exp_avg.data_ptr<T>();
    T* v = exp_avg_sq.data_ptr<T>();
    T* v_max = max_exp_avg_sq ? max_exp_avg_sq->data_ptr<T>() : nullptr;
    const AdamScalars<T> s = adam_scalars<Decoupled, T>(o, state.step);
    // The options become constants of the loop, so that it has no branches and vectorises on the
    // widest ISA (sqrt too: this library builds with -fno-math-errno).
    parallel_for(0, param.numel(), this->kGrain, [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int>() MF_LAMBDA_INLINE {
        auto run = [&]<bool L2, bool AmsGrad>() MF_LAMBDA_INLINE {
          T* __restrict pr = p;
          const T* __restrict gr = g;
          T *__restrict mr = m, *__restrict vr = v, *__restrict vmax = v_max;
          for (int64_t i = begin; i < end; ++i)
            adam_rule<Decoupled>(pr[i], gr[i], mr[i], vr[i], AmsGrad ? &vmax[i] : nullptr, L2, s);
        };
        if (v_max)
          l2 ? run.template operator()<true, true>() : run.template operator()<false, true>();
        else
          l2 ? run.template operator()<true, false>() : run.template operator()<false, false>();
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
