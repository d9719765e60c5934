// The distributed layer: collectives and data-parallel training. Meson runs this suite under
// `mpirun -np 2` when the build has MPI, and as one process (the local group) otherwise; every test
// holds for any world size. The expected values are worked out from the rank-dependent inputs by
// hand (sums of arithmetic series), and data-parallel training is compared with one process
// accumulating the same shards' gradients, which each rank also computes on its own.
#include <doctest/doctest.h>

#include "helpers.h"

#include "core/profiler.h"
#include "cuda/cuda.h"
#include "distributed/backends.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "nn/checkpoint.h"
#include "optim/adam.h"
#include "train/toy_corpus.h"
#include "train/train_loop.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <numeric>
#include <unistd.h>

using namespace mf;
using mf::testing::check_close;
namespace dist = mf::distributed;

namespace {

/// The job's group: MPI under a launcher (a short timeout, so that a broken test ends instead of
/// hanging), the local group otherwise.
dist::ProcessGroup& world() {
  static std::shared_ptr<dist::ProcessGroup> group = [] {
    bool mpi = dist::launched_by_mpi() && dist::backend_available(dist::Backend::Mpi);
    return dist::init_process_group(mpi ? dist::Backend::Mpi : dist::Backend::Local,
                                    {.timeout = std::chrono::seconds(60)});
  }();
  return *group;
}

/// [rank + 1, rank + 2, ...]: element i summed over W ranks is W * i + W * (W + 1) / 2.
Tensor ramp(int64_t n, DType dtype) {
  std::vector<double> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), world().rank() + 1.0);
  return from_vector(values, {n}).to(dtype);
}

double ramp_sum(int64_t i) {
  const double w = world().world_size();
  return w * static_cast<double>(i) + w * (w + 1) / 2;
}

Tensor expected_sums(int64_t n, DType dtype) {
  std::vector<double> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(ramp_sum(i));
  return from_vector(values, {n}).to(dtype);
}

/// Two layers with dropout between: enough for buckets, dropout streams and an unused parameter.
class Mlp : public nn::Module {
 public:
  explicit Mlp(int64_t hidden = 16) : Module("Mlp") {
    first = register_module("first", std::make_shared<nn::LinearImpl>(nn::LinearOptions{.in_features = 6,
                                                                                     .out_features = hidden}));
    drop = register_module("drop", std::make_shared<nn::DropoutImpl>(nn::DropoutOptions{.p = 0.25}));
    second = register_module("second", std::make_shared<nn::LinearImpl>(nn::LinearOptions{.in_features = hidden,
                                                                                       .out_features = 3}));
    spare = register_module("spare", std::make_shared<nn::LinearImpl>(nn::LinearOptions{.in_features = 3,
                                                                                     .out_features = 3}));
  }
  Tensor forward(const Tensor& x) override { return second->forward(drop->forward(relu(first->forward(x)))); }
  std::shared_ptr<nn::LinearImpl> first, second, spare;  // spare takes no part in forward
  std::shared_ptr<nn::DropoutImpl> drop;
};

/// A model with seed-fixed weights, whatever the rank (DistributedDataParallel copies rank 0's anyway).
std::shared_ptr<Mlp> make_model(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Mlp>();
}

/// The batch of step `step`: 2W + 1 rows (shards of unequal size), the same on every rank.
std::pair<Tensor, Tensor> batch(int64_t step) {
  manual_seed(1000 + static_cast<uint64_t>(step));
  int64_t rows = 2 * world().world_size() + 1;
  return {randn({rows, 6}), randn({rows, 3})};
}

/// Rows [start, end) of shard `shard` of `rows` rows split `shards` ways.
std::pair<int64_t, int64_t> shard_rows(int64_t rows, int64_t shard, int64_t shards) {
  return {rows * shard / shards, rows * (shard + 1) / shards};
}

/// Runs shard `shard` of step `step` forward and backward: the summed squared error of its rows over
/// the batch's row count (so that the shards' gradients add up to the mean loss's), with dropout
/// drawn from a stream of its own.
void shard_backward(Mlp& model, int64_t step, int64_t shard) {
  auto [x, y] = batch(step);
  auto [start, end] = shard_rows(x.size(0), shard, world().world_size());
  manual_seed(5000 + static_cast<uint64_t>(step) * 100 + static_cast<uint64_t>(shard));
  Tensor out = model.forward(x.narrow(0, start, end - start));
  Tensor diff = out - y.narrow(0, start, end - start);
  (sum(diff * diff) / static_cast<double>(x.size(0))).backward();
}

/// `steps` Adam steps of one process that accumulates every shard's gradient in shard order.
std::shared_ptr<Mlp> train_alone(int64_t steps) {
  auto model = make_model(7);
  optim::Adam adam(model->parameters(), {.lr = 0.01});
  for (int64_t step = 0; step < steps; ++step) {
    adam.zero_grad();
    for (int64_t shard = 0; shard < world().world_size(); ++shard) shard_backward(*model, step, shard);
    adam.step();
  }
  return model;
}

/// The same steps with each rank taking its own shard and DistributedDataParallel summing them.
std::shared_ptr<Mlp> train_parallel(int64_t steps, dist::DataParallelOptions options) {
  auto model = make_model(7 + static_cast<uint64_t>(world().rank()));  // rank 0's weights must win
  options.reduce = dist::ReduceOp::Sum;
  dist::DistributedDataParallel ddp(*model, std::shared_ptr<dist::ProcessGroup>(&world(), [](auto*) {}), options);
  optim::Adam adam(model->parameters(), {.lr = 0.01});
  for (int64_t step = 0; step < steps; ++step) {
    adam.zero_grad();
    shard_backward(*model, step, world().rank());
    ddp.finish_gradient_sync();
    adam.step();
  }
  return model;
}

void check_same_parameters(const Mlp& a, const Mlp& b, double tolerance) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    check_close(pa[i].tensor, pb[i].tensor, tolerance, tolerance);
  }
}

std::shared_ptr<dist::ProcessGroup> shared_world() {
  return std::shared_ptr<dist::ProcessGroup>(&world(), [](auto*) {});
}

}  // namespace

TEST_CASE("all_reduce sums, averages and takes the maximum for every dtype the trainer uses") {
  INFO("world size ", world().world_size(), ", backend ", world().backend());
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64}) {
    CAPTURE(dtype_name(dtype));
    for (int64_t n : {0, 1, 1001}) {  // empty, one element, odd-sized
      Tensor t = ramp(n, dtype);
      world().all_reduce(t);
      check_close(t, expected_sums(n, dtype), 0, 0);
      Tensor m = ramp(n, dtype);
      world().all_reduce(m, dist::ReduceOp::Max);
      check_close(m, ramp(n, dtype) + (world().world_size() - 1 - world().rank()), 0, 0);
    }
    if (is_floating(dtype)) {
      Tensor a = ramp(5, dtype);
      world().all_reduce(a, dist::ReduceOp::Average);
      check_close(a, expected_sums(5, dtype) / static_cast<double>(world().world_size()), 1e-7, 0);
    }
  }
}

TEST_CASE("a large all_reduce (32 MiB) and several in flight at once") {
  Tensor big = ramp(int64_t{8} << 20, DType::Float32);
  Tensor small = ramp(3, DType::Float64);
  auto first = world().all_reduce_async(big);
  auto second = world().all_reduce_async(small);
  second->wait();  // completing in either order
  first->wait();
  CHECK(first->completed());
  check_close(small, expected_sums(3, DType::Float64), 0, 0);
  // Sums of integers below 2^24 are exact in float32.
  CHECK(big.narrow(0, 0, 4).to_vector<float>() == expected_sums(4, DType::Float32).to_vector<float>());
  CHECK(big.narrow(0, (int64_t{8} << 20) - 1, 1).item<float>() == static_cast<float>(ramp_sum((8 << 20) - 1)));
}

TEST_CASE("the profiler records a collective's run on the MPI thread and the wait for it") {
  Tensor t = ramp(1000, DType::Float32);
  std::vector<profiler::Event> events;
  {
    profiler::Profiler p({.record_shapes = true});
    world().all_reduce_async(t)->wait();
    p.stop();
    events = p.events();
  }
  const profiler::Event *run = nullptr, *wait = nullptr;
  for (const profiler::Event& e : events) {
    if (e.name == "all_reduce (mpi)") run = &e;
    if (e.name == "wait for all_reduce") wait = &e;
  }
  if (world().backend() != "mpi") {  // the local group has nothing to run: no events
    CHECK(run == nullptr);
    CHECK(wait == nullptr);
    return;
  }
  REQUIRE(run != nullptr);
  REQUIRE(wait != nullptr);
  CHECK(run->kind == profiler::EventKind::Collective);
  CHECK(run->input_shapes == "[1000]");
  CHECK(run->thread != wait->thread);  // the MPI thread runs it; this one waits
  // The wait ends after the run began (the result cannot come before).
  CHECK(wait->start_us + wait->duration_us >= run->start_us);
  check_close(t, expected_sums(1000, DType::Float32), 0, 0);
}

TEST_CASE("broadcast, all_gather, reduce_scatter and barrier") {
  const int w = world().world_size(), r = world().rank();
  Tensor b = ramp(4, DType::Float32);
  world().broadcast(b, w - 1);  // from the last rank
  check_close(b, from_vector(std::vector<double>{1.0 * w, w + 1.0, w + 2.0, w + 3.0}, {4}).to(DType::Float32), 0, 0);

  Tensor gathered = world().all_gather(full({2, 3}, r, DType::Int64));
  CHECK(gathered.shape() == Shape{w, 2, 3});
  for (int k = 0; k < w; ++k) check_close(gathered.select(0, k), full({2, 3}, k, DType::Int64), 0, 0);

  Tensor mine = world().reduce_scatter(ramp(2 * w, DType::Float64).reshape({2 * w}));
  CHECK(mine.shape() == Shape{2});
  check_close(mine, expected_sums(2 * w, DType::Float64).narrow(0, 2 * r, 2), 0, 0);
  world().barrier();

  Tensor empty = world().all_gather(Tensor::empty({0}, DType::Float32));
  CHECK(empty.shape() == Shape{w, 0});
}

TEST_CASE("bfloat16 tensors: sums rounded to bfloat16, maxima, broadcast, all_gather and reduce_scatter") {
  const int w = world().world_size(), r = world().rank();
  // Integers up to 256 are exact in bfloat16, so these sums are too: as for the other dtypes.
  const int64_t n = (256 - w * (w + 1) / 2) / w;
  Tensor t = ramp(n, DType::BFloat16);
  world().all_reduce(t);
  check_close(t.to(DType::Float32), expected_sums(n, DType::Float32), 0, 0);
  Tensor m = ramp(n, DType::BFloat16);
  world().all_reduce(m, dist::ReduceOp::Max);
  check_close(m.to(DType::Float32), ramp(n, DType::Float32) + (w - 1 - r), 0, 0);
  if (w == 2) {
    // A sum between two bfloat16 values rounds to nearest, ties to even (8 significant bits):
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to 1; 1 + 3 * 2^-8 lies halfway between
    // 1 + 2^-7 and 1 + 2^-6 and goes to 1 + 2^-6; 1 + 2^-7 + 2^-9 is nearer 1 + 2^-7.
    const std::vector<double> mine = r == 0 ? std::vector<double>{1, 1 + 0x1p-7, 1 + 0x1p-7}
                                            : std::vector<double>{0x1p-8, 0x1p-8, 0x1p-9};
    Tensor sums = from_vector(mine, {3}).to(DType::BFloat16);
    world().all_reduce(sums);
    CHECK(sums.to(DType::Float64).to_vector<double>() == std::vector<double>{1, 1 + 0x1p-6, 1 + 0x1p-7});
  }
  Tensor b = ramp(4, DType::BFloat16);
  world().broadcast(b, w - 1);
  check_close(b.to(DType::Float32), ramp(4, DType::Float32) + (w - 1 - r), 0, 0);
  Tensor gathered = world().all_gather(full({3}, r + 0.5, DType::BFloat16));
  CHECK(gathered.shape() == Shape{w, 3});
  CHECK(gathered.dtype() == DType::BFloat16);
  for (int k = 0; k < w; ++k) check_close(gathered.select(0, k).to(DType::Float32), full({3}, k + 0.5), 0, 0);
  Tensor share = world().reduce_scatter(ramp(2 * w, DType::BFloat16));
  check_close(share.to(DType::Float32), expected_sums(2 * w, DType::Float32).narrow(0, 2 * r, 2), 0, 0);
}

TEST_CASE("collectives refuse what they cannot do, naming it") {
  Tensor strided = zeros({4, 4}).t();
  CHECK_THROWS_WITH_AS(world().all_reduce(strided), doctest::Contains("must be contiguous"), Error);
  Tensor ints = zeros({3}, DType::Int64);
  CHECK_THROWS_WITH_AS(world().all_reduce(ints, dist::ReduceOp::Average),
                       doctest::Contains("average needs a float32 or float64 tensor, got int64"), Error);
  Tensor halves = zeros({3}, DType::BFloat16);
  CHECK_THROWS_WITH_AS(world().all_reduce(halves, dist::ReduceOp::Average),
                       doctest::Contains("average needs a float32 or float64 tensor, got bfloat16"), Error);
  Tensor bytes = zeros({3}, DType::Int8);
  CHECK_THROWS_WITH_AS(world().all_reduce(bytes), doctest::Contains("the tensor is int8, a storage type"), Error);
  CHECK_THROWS_WITH_AS(world().reduce_scatter(zeros({})), doctest::Contains("must be a multiple of the world size"),
                       Error);
  if (world().world_size() > 1)
    CHECK_THROWS_WITH_AS(world().reduce_scatter(zeros({world().world_size() + 1})),
                         doctest::Contains("must be a multiple of the world size"), Error);
  Tensor b = zeros({1});
  CHECK_THROWS_WITH_AS(world().broadcast(b, world().world_size()), doctest::Contains("root rank"), Error);
  CHECK_THROWS_WITH_AS(world().all_gather_async(zeros({2}), zeros({2})), doctest::Contains("the output must be"),
                       Error);
  // Nothing was started: the next collective still lines up on every rank.
  Tensor t = ramp(2, DType::Float32);
  world().all_reduce(t);
  check_close(t, expected_sums(2, DType::Float32), 0, 0);
}

TEST_CASE("shard_range: shards are disjoint, cover every item once, and differ in size by at most one") {
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{7}, size_t{64}, size_t{1001}}) {
    for (int64_t shards : {1, 2, 3, 4, 8, 13}) {
      CAPTURE(count);
      CAPTURE(shards);
      size_t next = 0, smallest = count, largest = 0;
      for (int64_t shard = 0; shard < shards; ++shard) {
        dist::ShardRange range = dist::shard_range(count, shard, shards);
        CHECK(range.begin == next);  // contiguous and in order: disjoint, nothing skipped
        next = range.end;
        smallest = std::min(smallest, range.size());
        largest = std::max(largest, range.size());
      }
      CHECK(next == count);
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK_THROWS_WITH_AS(dist::shard_range(10, 2, 2), doctest::Contains("shard 2 of 2 is out of range"), Error);
}

TEST_CASE("data parallel: W ranks at B / W rows equal one process accumulating the W shards, with dropout") {
  auto alone = train_alone(4);
  // The ranks' sum is rank 0's + rank 1's + ..., as the single process accumulates them: bit for bit.
  check_same_parameters(*train_parallel(4, {.deterministic = true}), *alone, 0);
  // The backend's own reduction order: within float rounding.
  check_same_parameters(*train_parallel(4, {}), *alone, 1e-5);
}

TEST_CASE("data parallel: buckets of any size, rebuilt or not, and overlap on or off give the same bits") {
  auto reference = train_parallel(3, {.overlap = false, .rebuild_buckets = false});
  for (int64_t bucket_bytes : {int64_t{64}, int64_t{1} << 10, int64_t{1} << 30}) {
    CAPTURE(bucket_bytes);
    check_same_parameters(*train_parallel(3, {.bucket_bytes = bucket_bytes}), *reference, 0);
  }
}

TEST_CASE("data parallel: buckets cover every parameter once, the last layer's first") {
  auto model = make_model(3);
  dist::DistributedDataParallel ddp(*model, shared_world(), {.bucket_bytes = 256});
  std::vector<size_t> seen;
  for (const auto& bucket : ddp.bucket_parameters()) seen.insert(seen.end(), bucket.begin(), bucket.end());
  std::vector<size_t> reversed(model->parameters().size());
  std::iota(reversed.rbegin(), reversed.rend(), size_t{0});
  CHECK(seen == reversed);
  CHECK(ddp.bucket_parameters().size() > 2);
}

TEST_CASE("data parallel: after a step of rank 0's, the buckets follow the order its gradients became final") {
  // That order recorded independently, on a copy, by hooks of the engine's own; the parameter that
  // forward leaves out (spare's) follows in reverse registration order.
  auto copy = make_model(3);
  const std::vector<Tensor> copy_params = copy->parameters();
  std::vector<size_t> expected;
  std::vector<autograd::HookHandle> hooks;
  for (size_t k = 0; k < copy_params.size(); ++k)
    hooks.push_back(autograd::register_post_accumulate_grad_hook(copy_params[k], [&expected, k](Tensor&) {
      expected.push_back(k);
    }));
  shard_backward(*copy, 1, 0);
  std::vector<size_t> reversed(copy_params.size());
  std::iota(reversed.rbegin(), reversed.rend(), size_t{0});
  for (size_t k : reversed)
    if (std::find(expected.begin(), expected.end(), k) == expected.end()) expected.push_back(k);
  REQUIRE(expected != reversed);  // else the test could not tell a rebuild from none

  // One parameter a bucket (each reduced in its own .grad), then all in one (packed side by side).
  for (int64_t bucket_bytes : {int64_t{4}, int64_t{1} << 30}) {
    CAPTURE(bucket_bytes);
    auto model = make_model(3);
    dist::DistributedDataParallel ddp(*model, shared_world(),
                                      {.bucket_bytes = bucket_bytes, .reduce = dist::ReduceOp::Sum});
    auto order = [&] {
      std::vector<size_t> seen;
      for (const auto& bucket : ddp.bucket_parameters()) seen.insert(seen.end(), bucket.begin(), bucket.end());
      return seen;
    };
    CHECK(ddp.bucket_parameters().size() == (bucket_bytes == 4 ? reversed.size() : 1));
    CHECK(order() == reversed);
    if (world().rank() > 0) shard_backward(*model, 0, world().rank());  // rank 0 sits this step out
    ddp.finish_gradient_sync();
    CHECK(order() == reversed);
    model->zero_grad();
    if (world().rank() == 0) shard_backward(*model, 1, 0);  // now only rank 0 runs backward
    ddp.finish_gradient_sync();
    CHECK(order() == expected);  // on every rank
    // The reduced gradients moved into the new buckets: rank 0's own (the others added zeros).
    const std::vector<Tensor> params = model->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      CAPTURE(k);
      check_close(params[k].grad(), copy_params[k].grad().defined() ? copy_params[k].grad() : zeros_like(params[k]),
                  0, 0);
    }
  }
}

TEST_CASE("data parallel: rank 0's weights reach every rank, and unused parameters reduce as zeros") {
  auto model = make_model(11 + static_cast<uint64_t>(world().rank()));
  dist::DistributedDataParallel ddp(*model, shared_world(), {.reduce = dist::ReduceOp::Sum});
  auto rank0 = make_model(11);
  check_same_parameters(*model, *rank0, 0);
  // Rank 0 skips backward (a rank with no rows this step), the others run one.
  if (world().rank() > 0) shard_backward(*model, 0, world().rank());
  ddp.finish_gradient_sync();
  CHECK(model->spare->weight.grad().defined());
  check_close(model->spare->weight.grad(), zeros({3, 3}), 0, 0);
  Tensor expected = zeros_like(model->first->weight);
  for (int r = 1; r < world().world_size(); ++r) {
    auto copy = make_model(11);
    shard_backward(*copy, 0, r);
    expected = expected + copy->first->weight.grad();
  }
  check_close(model->first->weight.grad(), expected, 1e-6, 1e-7);
}

TEST_CASE("data parallel: no_sync accumulates locally; the next backward reduces the sum") {
  auto model = make_model(5);
  dist::DistributedDataParallel ddp(*model, shared_world(), {.reduce = dist::ReduceOp::Sum, .deterministic = true});
  {
    auto guard = ddp.no_sync();
    shard_backward(*model, 0, world().rank());
  }
  shard_backward(*model, 1, world().rank());
  ddp.finish_gradient_sync();
  // By hand: every rank's two steps, accumulated rank by rank (rank 0's pair, then rank 1's, ...).
  Tensor expected;
  for (int r = 0; r < world().world_size(); ++r) {
    auto copy = make_model(5);
    shard_backward(*copy, 0, r);
    shard_backward(*copy, 1, r);
    expected = r == 0 ? copy->second->weight.grad() : expected + copy->second->weight.grad();
  }
  check_close(model->second->weight.grad(), expected, 0, 0);
}

TEST_CASE("data parallel: bfloat16 compression reduces each rank's gradient rounded to bfloat16") {
  // By hand, from each rank's gradients (computed here for every rank): rounded to bfloat16, summed a
  // pair at a time in float32 and rounded again (the backend's bfloat16 sum), divided by the world
  // size in float32; deterministic mode adds the rounded shares in float32, in rank order. Past two
  // ranks the backend picks the order of its pairwise sums, so the check allows bfloat16's rounding.
  const int w = world().world_size();
  auto rounded = [](const Tensor& t) { return t.to(DType::BFloat16).to(DType::Float32); };
  std::vector<std::vector<Tensor>> grads(static_cast<size_t>(w));  // [rank][parameter]
  for (int r = 0; r < w; ++r) {
    auto copy = make_model(13);
    shard_backward(*copy, 0, r);
    for (const Tensor& p : copy->parameters())
      grads[static_cast<size_t>(r)].push_back(p.grad().defined() ? p.grad() : zeros_like(p));
  }
  for (bool deterministic : {false, true}) {
    CAPTURE(deterministic);
    auto model = make_model(13);
    dist::DistributedDataParallel ddp(*model, shared_world(),
                                      {.reduce = deterministic ? dist::ReduceOp::Sum : dist::ReduceOp::Average,
                                       .deterministic = deterministic,
                                       .compression = dist::GradientCompression::BFloat16});
    shard_backward(*model, 0, world().rank());
    ddp.finish_gradient_sync();
    const std::vector<Tensor> params = model->parameters();
    double largest_rounding = 0;
    for (size_t k = 0; k < params.size(); ++k) {
      CAPTURE(k);
      Tensor expected = rounded(grads[0][k]), exact = grads[0][k];
      for (size_t r = 1; r < grads.size(); ++r) {
        expected = deterministic ? expected + rounded(grads[r][k]) : rounded(expected + rounded(grads[r][k]));
        exact = exact + grads[r][k];
      }
      if (!deterministic) {
        expected = expected / static_cast<double>(w);
        exact = exact / static_cast<double>(w);
      }
      check_close(params[k].grad(), expected, w <= 2 || deterministic ? 0 : 1e-2, 0);
      largest_rounding = std::max(largest_rounding, amax(abs(params[k].grad() - exact)).item<double>());
    }
    CHECK(largest_rounding > 0);  // the gradients did travel as bfloat16
  }
}

TEST_CASE("data parallel: a second backward before finish_gradient_sync is an error") {
  auto model = make_model(5);
  dist::DistributedDataParallel ddp(*model, shared_world(), {.bucket_bytes = int64_t{1} << 30});
  shard_backward(*model, 0, world().rank());
  // The second backward would add into gradients the first has already handed to the reduction.
  CHECK_THROWS_WITH_AS(shard_backward(*model, 0, world().rank()), doctest::Contains("before finish_gradient_sync"),
                       Error);
  ddp.finish_gradient_sync();
}

TEST_CASE("data parallel: ranks whose models differ get an error naming the parameter and the ranks") {
  if (world().world_size() < 2) return;
  auto model = std::make_shared<Mlp>(world().rank() == 1 ? 8 : 16);  // rank 1's hidden layer is narrower
  CHECK_THROWS_WITH_AS(dist::DistributedDataParallel(*model, shared_world()),
                       doctest::Contains("differ at parameter 0: rank 0 has 'first.weight' (float32 [16, 6] on cpu), "
                                         "rank 1 has 'first.weight' (float32 [8, 6] on cpu)"),
                       Error);
}

// ---- the training loop -------------------------------------------------------------------------

namespace {

/// A directory every rank names alike (rank 0's pid), for checkpoints one rank writes and all read.
std::filesystem::path shared_directory() {
  Tensor pid = from_vector(std::vector<int64_t>{static_cast<int64_t>(getpid())}, {1});
  world().broadcast(pid, 0);
  auto dir = std::filesystem::temp_directory_path() / fmt::format("mf_test_distributed_{}", pid.item<int64_t>());
  std::filesystem::create_directories(dir);
  return dir;
}

struct LoopRun {
  std::vector<double> losses;
  std::vector<Tensor> parameters;
};

/// `steps` steps of the toy corpus (with dropout, so that the shares' dropout streams matter), from
/// `resume_from` when it is not empty, saving to `save_to`.
LoopRun run_loop(std::shared_ptr<dist::ProcessGroup> group, int64_t accumulate, int64_t steps,
                 const std::filesystem::path& resume_from = {}, const std::filesystem::path& save_to = {},
                 bool shard_optimizer = false) {
  train::TrainingOptions options = train::toy_options();
  options.model.dropout = 0.1;
  options.optim.max_tokens = 64;
  options.group = std::move(group);
  options.data_parallel.deterministic = true;
  options.accumulate = accumulate;
  options.shard_optimizer = shard_optimizer;
  options.max_steps = steps;
  options.checkpoint = save_to;
  LoopRun run;
  options.on_step = [&](int64_t, double loss) { run.losses.push_back(loss); };
  text::Corpus corpus = train::make_toy_corpus(20, {.tokenizer = options.tokenizer, .max_length = 15});
  manual_seed(static_cast<uint64_t>(options.optim.seed));
  models::Translator translator = train::build_translator(corpus, options);
  if (!resume_from.empty()) {
    std::filesystem::copy_file(resume_from, save_to, std::filesystem::copy_options::overwrite_existing);
    options.resume = true;
  }
  train::ParallelData data = train::encode_corpus(translator, corpus, 0);
  CHECK(train::train_translator(translator, data, {}, options) == 0);
  for (const Tensor& p : translator.model().parameters()) run.parameters.push_back(p.clone());
  return run;
}

void check_same_run(const LoopRun& a, const LoopRun& b) {
  CHECK(a.losses == b.losses);
  REQUIRE(a.parameters.size() == b.parameters.size());
  for (size_t i = 0; i < a.parameters.size(); ++i) check_close(a.parameters[i], b.parameters[i], 0, 0);
}

}  // namespace

TEST_CASE("training loop: W ranks x 1 share train as 1 process x W shares, bit for bit") {
  const int64_t w = world().world_size();
  LoopRun parallel = run_loop(shared_world(), 1, 4);
  LoopRun alone = run_loop(dist::local_process_group(), w, 4);  // every rank alone, accumulating all W shares
  CHECK(parallel.losses.size() == 4);
  check_same_run(parallel, alone);
}

TEST_CASE("training loop: ZeRO-1 takes the steps and writes the checkpoints of unsharded Adam, bit for bit") {
  const std::filesystem::path dir = shared_directory();
  LoopRun sharded = run_loop(shared_world(), 1, 3, {}, dir / "sharded.safetensors", true);
  LoopRun plain = run_loop(shared_world(), 1, 3, {}, dir / "plain.safetensors");
  check_same_run(sharded, plain);
  nn::TensorFile a = nn::load_tensors(dir / "sharded.safetensors"), b = nn::load_tensors(dir / "plain.safetensors");
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    CAPTURE(a.tensors[i].name);
    CHECK(a.tensors[i].name == b.tensors[i].name);
    check_close(a.tensors[i].tensor, b.tensors[i].tensor, 0, 0);
  }
  CHECK(a.metadata == b.metadata);
  // Resumed sharded, at this world size, from either.
  check_same_run(run_loop(shared_world(), 1, 2, dir / "plain.safetensors", dir / fmt::format("r.{}", world().rank()), true),
                 run_loop(shared_world(), 1, 2, dir / "sharded.safetensors", dir / fmt::format("s.{}", world().rank())));
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("ZeRO-1: each rank keeps the state of its share of the parameters") {
  auto model = make_model(3);
  optim::Adam adam(model->parameters(), {.lr = 0.01});
  dist::ZeroRedundancyOptimizer zero(adam, shared_world());
  int64_t total = model->parameter_count();
  Tensor owned = from_vector(std::vector<int64_t>{zero.owned_elements()}, {1});
  world().all_reduce(owned);
  CHECK(owned.item<int64_t>() == total);  // every parameter has one owner
  CHECK(zero.owned_elements() <= total / world().world_size() + 16 * 6);  // balanced within the largest parameter
  shard_backward(*model, 0, 0);
  std::vector<bool> has_gradient;  // all but the spare layer's
  for (const Tensor& p : model->parameters()) has_gradient.push_back(p.grad().defined());
  zero.step();
  for (size_t i = 0; i < has_gradient.size(); ++i)
    CHECK(adam.param_state(i).buffers.empty() == (zero.owner(i) != world().rank() || !has_gradient[i]));
}

TEST_CASE("training loop: only rank 0 writes the checkpoint and the chart") {
  const std::filesystem::path dir = shared_directory();
  train::TrainingOptions options = train::toy_options();
  options.group = shared_world();
  options.max_steps = 3;
  // The other ranks get paths in a directory that does not exist: any write there would throw.
  const std::filesystem::path base = world().rank() == 0 ? dir : dir / "no-such-directory";
  options.checkpoint = base / "toy.safetensors";
  options.plot = base / "toy.svg";
  text::Corpus corpus = train::make_toy_corpus(20, {.tokenizer = options.tokenizer, .max_length = 15});
  models::Translator translator = train::build_translator(corpus, options);
  train::ParallelData data = train::encode_corpus(translator, corpus, 0);
  CHECK(train::train_translator(translator, data, {}, options) == 0);
  CHECK(std::filesystem::exists(dir / "toy.safetensors"));  // every rank sees it: the loop waits for it
  CHECK(std::filesystem::exists(dir / "toy.svg"));
  CHECK(!std::filesystem::exists(dir / "no-such-directory"));
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("training loop: a checkpoint resumes at another world size as an unbroken run") {
  const int64_t w = world().world_size();
  const std::filesystem::path dir = shared_directory();
  const std::filesystem::path first = dir / "first.safetensors", second = dir / fmt::format("second.{}.safetensors",
                                                                                           world().rank());
  LoopRun unbroken = run_loop(shared_world(), 1, 6);
  run_loop(shared_world(), 1, 2, {}, first);   // W ranks, 2 steps
  run_loop(dist::local_process_group(), w, 2, first, second);  // 1 process x W shares (each rank on its own copy)
  LoopRun resumed = run_loop(shared_world(), 1, 2, second, dir / fmt::format("third.{}.safetensors", world().rank()));
  CHECK(resumed.losses == std::vector<double>(unbroken.losses.end() - 2, unbroken.losses.end()));
  for (size_t i = 0; i < unbroken.parameters.size(); ++i)
    check_close(resumed.parameters[i], unbroken.parameters[i], 0, 0);
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("nccl: collectives and data-parallel gradients on CUDA tensors (a world of this process)") {
  if (!dist::backend_available(dist::Backend::Nccl) || !cuda::is_available() || world().world_size() > 1) {
    MESSAGE("SKIPPED: needs a build with NCCL, a GPU, and this suite run alone (one rank per GPU)");
    return;
  }
  auto nccl = dist::init_process_group(dist::Backend::Nccl, {.timeout = std::chrono::seconds(60)});
  CHECK(nccl->backend() == "nccl");
  const Device gpu = Device::cuda(0);
  Tensor t = ramp(1001, DType::Float32).to(gpu);
  nccl->all_reduce(t, dist::ReduceOp::Average);
  check_close(t.to(Device::cpu()), ramp(1001, DType::Float32), 0, 0);
  Tensor b = ramp(4, DType::Int64).to(gpu);
  nccl->broadcast(b, 0);
  check_close(b.to(Device::cpu()), ramp(4, DType::Int64), 0, 0);
  CHECK(nccl->all_gather(ramp(3, DType::Float64).to(gpu)).to(Device::cpu()).reshape({3}).to_vector<double>() ==
        ramp(3, DType::Float64).to_vector<double>());
  // NCCL takes bfloat16 tensors (as ncclBfloat16); in a world of one their sum is the tensor itself, so
  // this checks that they are accepted and come back whole, not NCCL's arithmetic.
  Tensor halves = ramp(5, DType::BFloat16).to(gpu);
  nccl->all_reduce(halves);
  check_close(halves.to(Device::cpu()).to(DType::Float32), ramp(5, DType::Float32), 0, 0);
  nccl->barrier();
  CHECK_THROWS_WITH_AS(nccl->all_reduce(t = zeros({2})), doctest::Contains("needs tensors on cuda:0"), Error);

  auto model = make_model(5);
  model->to(gpu);
  dist::DistributedDataParallel ddp(*model, nccl, {.bucket_bytes = 256});
  auto reference = make_model(5);
  model->eval();  // no dropout: the CPU reference need not draw the GPU's masks
  reference->eval();
  shard_backward(*reference, 0, 0);
  auto [x, y] = batch(0);
  manual_seed(5000);
  Tensor out = model->forward(x.to(gpu));
  Tensor diff = out - y.to(gpu);
  (sum(diff * diff) / static_cast<double>(x.size(0))).backward();
  ddp.finish_gradient_sync();
  check_close(model->first->weight.grad().to(Device::cpu()), reference->first->weight.grad(), 1e-4, 1e-5);
}

TEST_CASE("an NCCL collective that timed out: the MPI threads say which ranks have not launched it") {
  // What NcclProcessGroup prints when its collective times out, asked of real peers over MPI: each rank
  // records how far its NCCL collectives have been launched (here without a GPU), and the asking rank
  // hears every other rank's MPI thread, busy in a barrier or idle, answer.
  auto* mpi = dynamic_cast<dist::detail::MpiProcessGroupBase*>(&world());
  if (mpi == nullptr || world().world_size() < 2) {
    MESSAGE("SKIPPED: needs the suite under mpirun with 2 or more ranks");
    return;
  }
  const int w = world().world_size();
  mpi->note_nccl_launch(world().rank() == 0 ? 5 : 3);  // rank 0 waits in #5; the others are back at #3
  world().barrier();
  if (world().rank() == 0) {
    std::vector<std::string> behind;
    for (int peer = 1; peer < w; ++peer)
      behind.push_back(fmt::format("rank {} has not reached it (the last NCCL collective it launched is #3)", peer));
    CHECK(mpi->nccl_ranks_missing(5) == fmt::format("{}", fmt::join(behind, "; ")));
    CHECK(mpi->nccl_ranks_missing(3) == "every rank has launched it, yet it did not complete (a GPU or the link "
                                        "between them stalled)");
  }
  world().barrier();
  mpi->note_nccl_launch(0);
}

TEST_CASE("validation scores: the ranks' shards, their counts summed, score as one process scoring them all") {
  train::TrainingOptions options = train::toy_options();
  text::Corpus corpus = train::make_toy_corpus(3, {.tokenizer = options.tokenizer, .max_length = 15});
  manual_seed(11);
  models::Translator translator = train::build_translator(corpus, options);  // untrained: imperfect translations
  translator.model().eval();
  const train::ParallelData data = train::encode_corpus(translator, corpus, 0);
  const train::ValidationScores alone = train::validation_scores(translator, data, 0);
  const train::ValidationScores shared = train::validation_scores(translator, data, 0, shared_world().get());
  CHECK(shared.bleu == alone.bleu);
  CHECK(shared.chrf == alone.chrf);
  // The same scores as sacreBLEU's corpus scores of those translations (text/sacrebleu.h, tested against
  // Python's sacrebleu): validation scores what translate would print.
  const std::vector<std::string> hypotheses = translator.translate_greedy(corpus.source_text, 100);
  CHECK(alone.bleu == doctest::Approx(text::corpus_sacrebleu(hypotheses, corpus.target_text).score).epsilon(1e-12));
  CHECK(alone.chrf == doctest::Approx(text::corpus_chrf(hypotheses, corpus.target_text).score).epsilon(1e-12));
}
