// Datasets and the DataLoader: batches hold the examples the order names, every epoch visits each
// example once, shuffled orders follow (seed, epoch) alone, worker threads change nothing but timing
// (batches come in order however their builds finish), a collate function makes the batches, and
// errors in a dataset reach the loop where it reaches the batch.
#include <doctest/doctest.h>

#include "helpers.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>
#include <thread>

using namespace mf;

namespace {

/// 10 examples: input row i is [i, 10 i], target i is i (int64), so a batch says which examples it holds.
data::TensorDataset numbered(int64_t n = 10) {
  std::vector<double> inputs;
  for (int64_t i = 0; i < n; ++i) {
    inputs.push_back(static_cast<double>(i));
    inputs.push_back(static_cast<double>(10 * i));
  }
  return data::TensorDataset(from_vector(inputs, {n, 2}).to(DType::Float32), arange(n));
}

/// The target column of every batch of one epoch, in order.
std::vector<std::vector<int64_t>> epoch_of(data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (const data::Example& batch : loader) {
    // The input rows are those of the targets' examples: [i, 10 i].
    std::vector<int64_t> targets = batch.target.to_vector<int64_t>();
    std::vector<float> inputs = batch.input.to_vector<float>();
    REQUIRE(batch.input.shape() == Shape{static_cast<int64_t>(targets.size()), 2});
    for (size_t k = 0; k < targets.size(); ++k) {
      CHECK(inputs[2 * k] == static_cast<float>(targets[k]));
      CHECK(inputs[2 * k + 1] == static_cast<float>(10 * targets[k]));
    }
    batches.push_back(targets);
  }
  return batches;
}

/// A dataset whose example 5 cannot be read.
struct Broken : data::Dataset {
  int64_t size() const override { return 8; }
  data::Example get(int64_t index) const override {
    MF_CHECK(index != 5, "Broken: example {} is unreadable", index);
    return {full({2}, static_cast<double>(index)), scalar_tensor(static_cast<double>(index), DType::Int64)};
  }
};

}  // namespace

TEST_CASE("batches in order, the last one short unless drop_last") {
  for (int64_t workers : {0, 1, 3}) {
    CAPTURE(workers);
    data::DataLoader loader(numbered(), {.batch_size = 4, .num_workers = workers});
    CHECK(loader.size() == 3);
    CHECK(epoch_of(loader) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
    data::DataLoader dropping(numbered(), {.batch_size = 4, .drop_last = true, .num_workers = workers});
    CHECK(dropping.size() == 2);
    CHECK(epoch_of(dropping) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  }
  data::DataLoader empty(numbered(0), {.batch_size = 3});
  CHECK(empty.size() == 0);
  CHECK(epoch_of(empty).empty());
}

TEST_CASE("shuffling: each epoch a new permutation, fixed by the seed and the epoch alone") {
  data::DataLoader loader(numbered(), {.batch_size = 3, .shuffle = true, .seed = 17});
  std::vector<std::vector<int64_t>> first = epoch_of(loader), second = epoch_of(loader);
  CHECK(loader.epoch() == 2);
  auto flat = [](const std::vector<std::vector<int64_t>>& batches) {
    std::vector<int64_t> all;
    for (const auto& batch : batches) all.insert(all.end(), batch.begin(), batch.end());
    return all;
  };
  for (const auto& epoch : {first, second}) {
    std::vector<int64_t> sorted = flat(epoch);
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expected(10);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(sorted == expected);  // every example once
  }
  CHECK(flat(first) != flat(second));
  CHECK(flat(first) == loader.order(0));

  // Resuming at epoch 1, on any number of workers, repeats epoch 1.
  data::DataLoader resumed(numbered(), {.batch_size = 3, .shuffle = true, .seed = 17, .num_workers = 0});
  resumed.set_epoch(1);
  CHECK(epoch_of(resumed) == second);

  // Without a seed, manual_seed fixes the one the loader draws.
  manual_seed(5);
  data::DataLoader a(numbered(), {.shuffle = true});
  manual_seed(5);
  data::DataLoader b(numbered(), {.shuffle = true});
  CHECK(a.seed() == b.seed());
  CHECK(a.order(3) == b.order(3));
}

TEST_CASE("leaving an epoch early stops the background thread; a dataset's error reaches the loop") {
  data::DataLoader loader(numbered(100), {.batch_size = 2});
  int seen = 0;
  for (const data::Example& batch : loader) {
    CHECK(batch.target.shape() == Shape{2});
    if (++seen == 3) break;  // the worker is ahead; the iterator's end joins it
  }
  CHECK(seen == 3);

  for (int64_t workers : {0, 1, 3}) {
    CAPTURE(workers);
    data::DataLoader broken(Broken(), {.batch_size = 2, .num_workers = workers});
    std::vector<int64_t> read;
    auto run = [&] {
      for (const data::Example& batch : broken)
        for (int64_t t : batch.target.to_vector<int64_t>()) read.push_back(t);
    };
    CHECK_THROWS_WITH_AS(run(), "Broken: example 5 is unreadable", Error);
    CHECK(read == std::vector<int64_t>{0, 1, 2, 3});  // the batches before the broken one arrived
  }

  CHECK_THROWS_WITH_AS(data::DataLoader(numbered(), {.batch_size = 0}),
                       "DataLoader: batch_size must be at least 1, got 0", Error);
  CHECK_THROWS_WITH_AS(data::DataLoader(numbered(), {.num_workers = -1}), "DataLoader: num_workers must be >= 0, got -1",
                       Error);
  // The first batch broken: the error leaves the loop's first step, and the workers are stopped.
  data::DataLoader first_broken(Broken(), {.batch_size = 6, .num_workers = 2});
  CHECK_THROWS_WITH_AS(first_broken.begin(), "Broken: example 5 is unreadable", Error);
  CHECK_THROWS_WITH_AS(data::TensorDataset(zeros({3, 2}), zeros({4})),
                       "TensorDataset: inputs and targets need the same first dim, got [3, 2] and [4]", Error);
}

namespace {

/// Example i sleeps (20 - 2 i) ms before it returns, so that with several workers later batches are
/// built before earlier ones; it records the most gets running at once.
struct Slow : data::Dataset {
  int64_t size() const override { return 10; }
  data::Example get(int64_t index) const override {
    int now = ++running;
    for (int seen = most; now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 - 2 * index));
    --running;
    return {full({2}, static_cast<double>(index)), scalar_tensor(static_cast<double>(index), DType::Int64)};
  }
  mutable std::atomic<int> running{0}, most{0};
};

}  // namespace

TEST_CASE("several workers build batches side by side, and the loop gets them in order") {
  auto slow = std::make_shared<Slow>();
  data::DataLoader loader(slow, {.batch_size = 1, .num_workers = 4});
  std::vector<std::vector<int64_t>> expected;
  for (int64_t i = 0; i < 10; ++i) expected.push_back({i});
  // Each batch's input is [i, i]: epoch_of checks [i, 10 i], so read the targets here.
  std::vector<std::vector<int64_t>> got;
  for (const data::Example& batch : loader) got.push_back(batch.target.to_vector<int64_t>());
  CHECK(got == expected);
  CHECK(slow->most.load() > 1);  // built side by side
}

// A collate function of one's own: sequences of different lengths padded to the batch's longest with
// -1, as a collate_fn with pad_sequence does in PyTorch.
TEST_CASE("a collate function makes the batches, on the workers") {
  struct Ragged : data::Dataset {  // example i: i + 1 copies of i
    int64_t size() const override { return 5; }
    data::Example get(int64_t index) const override { return {full({index + 1}, static_cast<double>(index)), {}}; }
  };
  auto pad = [](std::vector<data::Example> examples) {
    int64_t longest = 0;
    for (const data::Example& e : examples) longest = std::max(longest, e.input.size(0));
    Tensor batch = full({static_cast<int64_t>(examples.size()), longest}, -1.0);
    for (size_t r = 0; r < examples.size(); ++r)
      batch.select(0, static_cast<int64_t>(r)).narrow(0, 0, examples[r].input.size(0)).copy_(examples[r].input);
    return data::Example{batch, {}};
  };
  for (int64_t workers : {0, 2}) {
    CAPTURE(workers);
    data::DataLoader loader(Ragged(), {.batch_size = 2, .num_workers = workers, .collate = pad});
    std::vector<std::vector<float>> batches;
    for (const data::Example& batch : loader) batches.push_back(batch.input.to_vector<float>());
    CHECK(batches == std::vector<std::vector<float>>{{0, -1, 1, 1}, {2, 2, 2, -1, 3, 3, 3, 3}, {4, 4, 4, 4, 4}});
  }
  // The default collate stacks, and is there to build on.
  data::Example stacked = data::stack_examples({{ones({2}), {}}, {zeros({2}), {}}});
  CHECK(stacked.input.to_vector<float>() == std::vector<float>{1, 1, 0, 0});
  CHECK(!stacked.target.defined());
}
