#include "optim/sgd.h"

#include "core/parallel.h"
#include "ops/ops.h"

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

void SGD::update(size_t group, Tensor& param, const Tensor& grad, ParamState& state) {
  const SGDOptions& o = groups_[group].options;
  bool first = false;
  Tensor buffer;
  if (o.momentum != 0) {
    auto it = state.buffers.find("momentum_buffer");
    first = it == state.buffers.end();
    if (first) it = state.buffers.emplace("momentum_buffer", zeros_like(param)).first;
    buffer = it->second;
  }
  // One pass per element, in torch.optim.SGD's order of operations.
  visit_floating(param.dtype(), [&]<typename T>() {
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* b = buffer.defined() ? buffer.data_ptr<T>() : nullptr;
    const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay), mom = static_cast<T>(o.momentum),
            keep = static_cast<T>(1 - o.dampening);
    parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T d = o.weight_decay != 0 ? g[i] + wd * p[i] : g[i];
        if (b != nullptr) {
          b[i] = first ? d : b[i] * mom + keep * d;
          d = o.nesterov ? d + mom * b[i] : b[i];
        }
        p[i] = p[i] + -lr * d;
      }
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
