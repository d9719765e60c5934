// Datasets and the DataLoader (PyTorch's torch.utils.data, libtorch's torch::data, in a small form):
// examples batched by stacking or a collate function of your own, shuffled per epoch from a seed, and
// prepared on worker threads while the program trains on the previous batch.
//
//   data::DataLoader loader(data::TensorDataset(inputs, targets), {.batch_size = 64, .shuffle = true});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (const data::Example& batch : loader) train_step(batch.input, batch.target);
#pragma once

#include "core/tensor.h"

#include <concepts>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

namespace mf::data {

/// One item of a dataset, or a batch of items stacked along a new first dim (libtorch's Example).
struct Example {
  Tensor input;
  Tensor target;
};

/// Indexable examples. get() runs on the DataLoader's worker threads (several at once with
/// num_workers > 1) while the program runs its own, so it must not change state the program or another
/// call shares (reading tensors and files is fine).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// Example `index`, in [0, size()).
  virtual Example get(int64_t index) const = 0;
};

/// Example i is (inputs[i], targets[i]): rows of two tensors with the same first dim (PyTorch's
/// TensorDataset). The rows are views, so a batch costs one copy, the stacking.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Example get(int64_t index) const override;

 private:
  Tensor inputs_, targets_;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  /// A new order every epoch, a permutation drawn from (seed, epoch) alone.
  bool shuffle = false;
  /// Leave out the last batch of an epoch when it is smaller than batch_size.
  bool drop_last = false;
  /// The shuffle's seed. Unset, the loader draws one from the default generator when it is made, so
  /// mf::manual_seed makes the orders repeatable.
  std::optional<uint64_t> seed = std::nullopt;
  /// Threads building the next batches while the program uses the current one (PyTorch's
  /// num_workers); 0 builds each batch on the program's thread when it is reached. Batches come in
  /// order whichever thread built them, at most two per worker ahead (PyTorch's prefetch_factor); a
  /// batch that failed to build throws its error when the loop reaches it.
  int64_t num_workers = 1;
  /// Makes a batch of its examples (PyTorch's collate_fn), on the thread that builds the batch: to pad
  /// sequences of different lengths, say. Unset, inputs and targets are each stacked along a new first
  /// dim (an undefined target stays undefined).
  std::function<Example(std::vector<Example>)> collate = nullptr;
};

/// The examples' inputs and targets each stacked along a new first dim: the DataLoader's default
/// collate (PyTorch's default_collate), for a collate function that builds on it.
Example stack_examples(std::vector<Example> examples);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  /// Takes a dataset by value: DataLoader(TensorDataset(x, y), {...}).
  template <typename D>
    requires std::derived_from<D, Dataset>
  DataLoader(D dataset, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<const D>(std::move(dataset)), std::move(options)) {}

  /// Batches per epoch.
  int64_t size() const;
  const DataLoaderOptions& options() const { return options_; }
  uint64_t seed() const { return seed_; }
  /// The epoch the next begin() runs: 0 at first, one more after each begin(). Epoch e's order
  /// depends only on the seed and e, so a resumed run sets the epoch it stopped in.
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch);
  /// The dataset indices of `epoch` in the order its batches take them.
  std::vector<int64_t> order(int64_t epoch) const;

  /// Walks one epoch's batches (an input iterator: each batch is made once).
  class Iterator {
   public:
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    struct Run;
    explicit Iterator(std::shared_ptr<Run> run) : run_(std::move(run)) {}
    const Example& operator*() const;
    const Example* operator->() const { return &**this; }
    Iterator& operator++();
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const;

   private:
    std::shared_ptr<Run> run_;
  };
  /// Starts the next epoch (see epoch()).
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  uint64_t seed_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace mf::data
