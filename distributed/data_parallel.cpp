#include "distributed/data_parallel.h"

#include "core/error.h"
#include "distributed/broadcast_text.h"
#include "ops/functional.h"

#include <fmt/format.h>

#include <algorithm>

namespace mf::distributed {

/// Gradients of one dtype and device, packed back to back in `flat`; or one large parameter's,
/// reduced where it is, in its .grad (`in_place`: packing it would copy it twice for nothing).
struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;   // indices into params_
  std::vector<int64_t> offsets;  // of each parameter's gradient in flat
  bool in_place = false;
  DType dtype = DType::Float32;
  Device device;
  int64_t elements = 0;
  Tensor flat;
  Tensor compressed;            // with bfloat16 compression: flat rounded, what travels
  Tensor gathered;              // deterministic mode: [world_size, flat.numel()] of what travels
  std::vector<bool> filled;     // per slot, this step
  size_t unfilled = 0;
  std::shared_ptr<Work> work;   // set once launched this step
};

namespace {

/// FNV-1a of a parameter's name, dtype and shape: what the ranks compare.
int64_t signature(const std::string& description) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : description) hash = (hash ^ c) * 1099511628211ull;
  return static_cast<int64_t>(hash >> 1) | 1;  // never 0, which stands for "no such parameter"
}

std::string describe(const nn::NamedTensor& p) {
  return fmt::format("'{}' ({} {} on {})", p.name, dtype_name(p.tensor.dtype()), shape_str(p.tensor.shape()),
                     p.tensor.device().str());
}

/// Throws, on every rank, when the ranks' parameter lists differ, naming the first difference.
void check_same_parameters(ProcessGroup& group, const std::vector<nn::NamedTensor>& params) {
  const int64_t count = static_cast<int64_t>(params.size());
  auto gathered = [&](const std::vector<int64_t>& values) {
    Tensor mine = from_vector(values, {static_cast<int64_t>(values.size())}).to(group.device());
    return group.all_gather(mine).to(Device::cpu()).to_vector<int64_t>();
  };
  const std::vector<int64_t> all_counts = gathered({count});
  const int64_t longest = *std::max_element(all_counts.begin(), all_counts.end());
  std::vector<int64_t> mine(static_cast<size_t>(longest), 0);
  for (size_t i = 0; i < params.size(); ++i) mine[i] = signature(describe(params[i]));
  const std::vector<int64_t> all = gathered(mine);
  for (int64_t i = 0; i < longest; ++i) {
    for (int r = 1; r < group.world_size(); ++r) {
      if (all[static_cast<size_t>(r * longest + i)] == all[static_cast<size_t>(i)]) continue;
      auto text_of = [&](int rank) {
        std::string own = i < count ? describe(params[static_cast<size_t>(i)]) : "no such parameter";
        return detail::broadcast_text(group, own, rank);
      };
      std::string first = text_of(0), other = text_of(r);
      fail("DistributedDataParallel: the ranks' models differ at parameter {}: rank 0 has {}, rank {} has {} "
           "(ranks have {} parameters); every rank must build the same model", i, first, r, other,
           fmt::join(all_counts, " / "));
    }
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(const nn::Module& module, std::shared_ptr<ProcessGroup> group,
                                                 DataParallelOptions options)
    : group_(std::move(group)), options_(options) {
  MF_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null");
  MF_CHECK(options_.bucket_bytes > 0, "DistributedDataParallel: bucket_bytes must be positive, got {}",
           options_.bucket_bytes);
  std::vector<nn::NamedTensor> named = module.named_parameters();
  check_same_parameters(*group_, named);
  {
    NoGradGuard no_grad;
    for (nn::NamedTensor& p : named) group_->broadcast(p.tensor, 0);
    if (options_.broadcast_buffers)
      for (nn::NamedTensor& b : module.named_buffers()) group_->broadcast(b.tensor, 0);
  }
  for (nn::NamedTensor& p : named) params_.push_back(p.tensor);

  std::vector<size_t> reversed(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) reversed[k] = params_.size() - 1 - k;
  assign_buckets(reversed);
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].requires_grad())
      hooks_.push_back(autograd::register_post_accumulate_grad_hook(params_[k], [this, k](Tensor&) {
        on_gradient_ready(k);
      }));
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::assign_buckets(const std::vector<size_t>& order) {
  // A new bucket when the dtype or device changes or the bytes would pass bucket_bytes; a parameter
  // of a quarter bucket or more gets one of its own.
  buckets_.clear();
  where_.assign(params_.size(), {0, 0});
  for (size_t k : order) {
    const Tensor& p = params_[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool alone = 4 * bytes >= options_.bucket_bytes;
    Bucket* last = buckets_.empty() ? nullptr : buckets_.back().get();
    bool fits = !alone && last && !last->in_place && last->dtype == p.dtype() && last->device == p.device() &&
                last->elements * static_cast<int64_t>(p.element_size()) + bytes <= options_.bucket_bytes;
    if (!fits) {
      buckets_.push_back(std::make_unique<Bucket>());
      last = buckets_.back().get();
      last->in_place = alone;
      last->dtype = p.dtype();
      last->device = p.device();
    }
    where_[k] = {buckets_.size() - 1, last->params.size()};
    last->offsets.push_back(last->elements);
    last->params.push_back(k);
    last->elements += p.numel();
  }
  for (auto& bucket : buckets_) {
    if (!bucket->in_place) bucket->flat = zeros({bucket->elements}, bucket->dtype, bucket->device);
    bucket->filled.assign(bucket->params.size(), false);
    bucket->unfilled = bucket->params.size();
  }
}

void DistributedDataParallel::rebuild_buckets_in_ready_order() {
  // Rank 0's order, led by its length: a rank 0 that ran no backward (nothing recorded) leaves the
  // buckets as they are until a step where it does.
  NoGradGuard no_grad;
  std::vector<int64_t> order(params_.size() + 1, 0);
  order[0] = static_cast<int64_t>(ready_order_.size());
  for (size_t i = 0; i < ready_order_.size(); ++i) order[i + 1] = static_cast<int64_t>(ready_order_[i]);
  Tensor shared = from_vector(order, {static_cast<int64_t>(order.size())}).to(group_->device());
  group_->broadcast(shared, 0);
  order = shared.to(Device::cpu()).to_vector<int64_t>();
  ready_order_.clear();
  if (order[0] == 0) return;

  std::vector<size_t> rebuilt;
  std::vector<bool> placed(params_.size(), false);
  for (int64_t i = 1; i <= order[0]; ++i) {
    const size_t k = static_cast<size_t>(order[static_cast<size_t>(i)]);
    rebuilt.push_back(k);
    placed[k] = true;
  }
  for (size_t k = params_.size(); k-- > 0;)
    if (!placed[k]) rebuilt.push_back(k);
  assign_buckets(rebuilt);
  for (auto& bucket : buckets_) {  // the gradients just reduced move into their new buckets
    if (bucket->in_place) continue;
    for (size_t slot = 0; slot < bucket->params.size(); ++slot) {
      Tensor& p = params_[bucket->params[slot]];
      Tensor region = bucket->flat.narrow(0, bucket->offsets[slot], p.numel());
      region.copy_(p.grad().reshape({p.numel()}));
      p.set_grad(region.reshape(p.shape()));
    }
  }
  buckets_rebuilt_ = true;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_parameters() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& bucket : buckets_) out.push_back(bucket->params);
  return out;
}

void DistributedDataParallel::fill(Bucket& bucket, size_t slot) {
  const Tensor& p = params_[bucket.params[slot]];
  Tensor grad = p.grad();
  NoGradGuard no_grad;
  if (bucket.in_place) {
    bucket.flat = !grad.defined()        ? zeros({p.numel()}, p.dtype(), p.device())
                  : grad.is_contiguous() ? grad.reshape({p.numel()})
                                         : grad.contiguous().reshape({p.numel()});
    bucket.filled[slot] = true;
    --bucket.unfilled;
    return;
  }
  Tensor region = bucket.flat.narrow(0, bucket.offsets[slot], p.numel());
  if (!grad.defined())
    region.zero_();
  else if (grad.raw_data() != region.raw_data())  // else .grad is still the bucket's view (accumulation)
    region.copy_(grad.reshape({p.numel()}));
  bucket.filled[slot] = true;
  --bucket.unfilled;
}

void DistributedDataParallel::on_gradient_ready(size_t param) {
  if (!syncing_) return;
  auto [b, slot] = where_[param];
  Bucket& bucket = *buckets_[b];
  MF_CHECK(!bucket.filled[slot], "DistributedDataParallel: backward ran again before finish_gradient_sync() ended "
           "the previous one (accumulate gradients inside no_sync())");
  if (options_.rebuild_buckets && !buckets_rebuilt_) ready_order_.push_back(param);
  fill(bucket, slot);
  if (options_.overlap) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->unfilled == 0) launch(*buckets_[next_launch_++]);
}

bool DistributedDataParallel::compresses(const Bucket& bucket) const {
  return options_.compression == GradientCompression::BFloat16 && bucket.dtype == DType::Float32;
}

void DistributedDataParallel::launch(Bucket& bucket) {
  Tensor payload = bucket.flat;
  ReduceOp op = options_.reduce;
  if (compresses(bucket)) {
    NoGradGuard no_grad;
    if (!bucket.compressed.defined() || bucket.compressed.numel() != bucket.flat.numel())
      bucket.compressed = Tensor::empty({bucket.flat.numel()}, DType::BFloat16, bucket.flat.device());
    bucket.compressed.copy_(bucket.flat);
    payload = bucket.compressed;
    if (op == ReduceOp::Average) op = ReduceOp::Sum;  // bfloat16 has no average: the sum is divided in float32
  }
  if (options_.deterministic) {
    if (!bucket.gathered.defined() || bucket.gathered.size(1) != payload.numel())
      bucket.gathered = Tensor::empty({group_->world_size(), payload.numel()}, payload.dtype(), payload.device());
    bucket.work = group_->all_gather_async(payload, bucket.gathered);
  } else {
    bucket.work = group_->all_reduce_async(payload, op);
  }
}

void DistributedDataParallel::finish_gradient_sync() {
  for (auto& bucket : buckets_)
    for (size_t slot = 0; slot < bucket->params.size(); ++slot)
      if (!bucket->filled[slot]) fill(*bucket, slot);
  launch_ready_buckets();
  for (auto& bucket : buckets_) bucket->work->wait();
  NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    const bool compressed = compresses(*bucket);
    bool divide = false;  // the average still to take
    if (options_.deterministic) {  // rank 0's + rank 1's + ..., as one process would accumulate them
      bucket->flat.copy_(bucket->gathered.select(0, 0));
      for (int r = 1; r < group_->world_size(); ++r) {
        const Tensor share = bucket->gathered.select(0, r);
        bucket->flat.add_(compressed ? share.to(DType::Float32) : share);
      }
      divide = options_.reduce == ReduceOp::Average;
    } else if (compressed) {
      bucket->flat.copy_(bucket->compressed);
      divide = options_.reduce == ReduceOp::Average;
    }
    if (divide) bucket->flat.div_(scalar_tensor(group_->world_size(), bucket->flat.dtype(), bucket->flat.device()));
    for (size_t slot = 0; slot < bucket->params.size(); ++slot) {
      Tensor& p = params_[bucket->params[slot]];
      // .grad becomes a view of the bucket (PyTorch's gradient_as_bucket_view): no copy back. The
      // next backward's gradients replace it, or add into it when they are not zeroed in between.
      p.set_grad(bucket->flat.narrow(0, bucket->offsets[slot], p.numel()).reshape(p.shape()));
    }
    bucket->filled.assign(bucket->params.size(), false);
    bucket->unfilled = bucket->params.size();
    bucket->work.reset();
  }
  next_launch_ = 0;
  if (options_.rebuild_buckets && !buckets_rebuilt_) rebuild_buckets_in_ready_order();
}

}  // namespace mf::distributed
