#include "optim/sgd.h"

#include "core/parallel.h"
#include "ops/functional.h"

#include <nlohmann/json.hpp>

namespace mf::optim {

void validate(const SGDOptions& o) {
  MF_CHECK(o.lr >= 0, "SGD: lr must be >= 0, got {}", o.lr);
  MF_CHECK(o.momentum >= 0, "SGD: momentum must be >= 0, got {}", o.momentum);
  MF_CHECK(o.dampening >= 0, "SGD: dampening must be >= 0, got {}", o.dampening);
  MF_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got {}", o.weight_decay);
  MF_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
           "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", o.momentum, o.dampening);
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup<SGDOptions>>{{std::move(params), options}}) {}

SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups) : OptimizerWithOptions("SGD", std::move(groups)) {}

namespace {

/// One step's scalars, as S: the element type for the fused loop, double for tensor ops (which round
/// a scalar to the tensor's dtype, as the loop's casts do).
template <typename S>
struct SGDScalars {
  S lr, wd, mom, keep;
};

template <typename S>
SGDScalars<S> sgd_scalars(const SGDOptions& o) {
  return {static_cast<S>(o.lr), static_cast<S>(o.weight_decay), static_cast<S>(o.momentum),
          static_cast<S>(1 - o.dampening)};
}

/// SGD's update of one element (V = T) or one whole tensor (V = Tensor), in torch.optim.SGD's order
/// of operations. `b` is the momentum buffer (null without momentum), `first` its first step.
template <typename V, typename S>
void sgd_rule(V& p, const V& g, V* b, bool first, const SGDOptions& o, const SGDScalars<S>& s) {
  V d = o.weight_decay != 0 ? g + s.wd * p : g;
  if (b != nullptr) {
    *b = first ? d : *b * s.mom + s.keep * d;
    d = o.nesterov ? d + s.mom * *b : *b;
  }
  p = p + -s.lr * d;
}

}  // namespace

void SGD::update(size_t group, Tensor& param, const Tensor& grad, ParamState& state, bool fused) {
  const SGDOptions& o = groups_[group].options;
  bool first = false;
  Tensor* buffer = nullptr;
  if (o.momentum != 0) {
    auto it = state.buffers.find("momentum_buffer");
    first = it == state.buffers.end();
    if (first) it = state.buffers.emplace("momentum_buffer", zeros_like(param)).first;
    buffer = &it->second;
  }
  if (!fused) {
    Tensor p = param, b = buffer ? *buffer : Tensor();
    sgd_rule(p, grad, buffer ? &b : nullptr, first, o, sgd_scalars<double>(o));
    param.copy_(p);
    if (buffer) buffer->copy_(b);
    return;
  }
  visit_floating(param.dtype(), [&]<typename T>() {
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* b = buffer ? buffer->data_ptr<T>() : nullptr;
    const SGDScalars<T> s = sgd_scalars<T>(o);
    parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sgd_rule(p[i], g[i], b ? &b[i] : nullptr, first, o, s);
    });
  });
}

std::string SGD::options_json(size_t group) const {
  const SGDOptions& o = groups_.at(group).options;
  return nlohmann::json{{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
                        {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov}}
      .dump();
}

void SGD::set_options_json(size_t group, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  SGDOptions o{.lr = j.at("lr"), .momentum = j.at("momentum"), .dampening = j.at("dampening"),
               .weight_decay = j.at("weight_decay"), .nesterov = j.at("nesterov")};
  validate(o);
  groups_.at(group).options = o;
}

}  // namespace mf::optim
