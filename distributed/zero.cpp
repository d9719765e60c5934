#include "distributed/zero.h"

#include "core/error.h"
#include "core/graph.h"
#include "distributed/broadcast_text.h"
#include "ops/functional.h"

#include <algorithm>
#include <numeric>

namespace mf::distributed {

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> group)
    : optimizer_(optimizer), group_(std::move(group)) {
  MF_CHECK(group_ != nullptr, "ZeroRedundancyOptimizer: the process group is null");
  for (size_t g = 0; g < optimizer_.num_param_groups(); ++g)
    for (const Tensor& p : optimizer_.group_params(g)) params_.push_back(p);
  std::vector<size_t> largest_first(params_.size());
  std::iota(largest_first.begin(), largest_first.end(), size_t{0});
  std::stable_sort(largest_first.begin(), largest_first.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(group_->world_size()), 0);
  owners_.assign(params_.size(), 0);
  for (size_t index : largest_first) {
    auto lightest = std::min_element(load.begin(), load.end());
    owners_[index] = static_cast<int>(lightest - load.begin());
    *lightest += params_[index].numel();
  }
  // Each rank's parameters in packs of one dtype and device, broadcast from it after every step.
  for (int rank = 0; rank < group_->world_size(); ++rank) {
    std::vector<size_t> owned;
    for (size_t i = 0; i < params_.size(); ++i)
      if (owners_[i] == rank) owned.push_back(i);
    while (!owned.empty()) {
      const Tensor& first = params_[owned.front()];
      std::vector<size_t> same, rest;
      for (size_t i : owned)
        (params_[i].dtype() == first.dtype() && params_[i].device() == first.device() ? same : rest).push_back(i);
      packs_.push_back({rank, std::move(same)});
      owned = std::move(rest);
    }
  }
  shard_state();
}

int64_t ZeroRedundancyOptimizer::owned_elements() const {
  int64_t elements = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] == group_->rank()) elements += params_[i].numel();
  return elements;
}

void ZeroRedundancyOptimizer::shard_state() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] != group_->rank()) optimizer_.set_param_state(i, {});
}

void ZeroRedundancyOptimizer::step() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] != group_->rank()) params_[i].set_grad(Tensor());
  optimizer_.step();
  NoGradGuard no_grad;
  for (const Pack& pack : packs_) {
    std::vector<Tensor> flat_parts;
    for (size_t i : pack.params) flat_parts.push_back(params_[i].reshape({params_[i].numel()}));
    Tensor packed = cat(flat_parts, 0);
    group_->broadcast(packed, pack.owner);
    if (pack.owner == group_->rank()) continue;
    int64_t offset = 0;
    for (size_t i : pack.params) {
      params_[i].copy_(packed.narrow(0, offset, params_[i].numel()).reshape(params_[i].shape()));
      offset += params_[i].numel();
    }
  }
}

void ZeroRedundancyOptimizer::consolidate_state(int to) {
  MF_CHECK(to >= 0 && to < group_->world_size(), "ZeroRedundancyOptimizer: rank {} is outside the world of {}", to,
           group_->world_size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const int from = owners_[i];
    if (from == to) continue;
    const optim::ParamState& own = optimizer_.param_state(i);
    Tensor header =
        from_vector(std::vector<int64_t>{own.step, static_cast<int64_t>(own.buffers.size())}, {2}).to(group_->device());
    group_->broadcast(header, from);
    const std::vector<int64_t> values = header.to(Device::cpu()).to_vector<int64_t>();
    optim::ParamState received{.step = values[0], .buffers = {}};
    auto buffer = own.buffers.begin();
    for (int64_t b = 0; b < values[1]; ++b) {
      const bool sending = group_->rank() == from;
      std::string name = detail::broadcast_text(*group_, sending ? buffer->first : std::string(), from);
      Tensor tensor = sending ? buffer->second.contiguous() : empty_like(params_[i]);
      group_->broadcast(tensor, from);
      if (sending) ++buffer;
      received.buffers[name] = tensor;
    }
    if (group_->rank() == to) optimizer_.set_param_state(i, std::move(received));
  }
}

}  // namespace mf::distributed
