#include "data/data_loader.h"

#include "core/graph.h"
#include "core/parallel.h"
#include "ops/functional.h"
#include "ops/sampling.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

namespace mf::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  MF_CHECK(inputs_.defined() && targets_.defined() && inputs_.dim() > 0 && targets_.dim() > 0 &&
               inputs_.size(0) == targets_.size(0),
           "TensorDataset: inputs and targets need the same first dim, got {} and {}",
           inputs_.defined() ? shape_str(inputs_.shape()) : "undefined",
           targets_.defined() ? shape_str(targets_.shape()) : "undefined");
}

Example TensorDataset::get(int64_t index) const { return {inputs_.select(0, index), targets_.select(0, index)}; }

// One epoch's walk: the batches' indices, the batch in hand, and with prefetching a worker thread that
// keeps up to kAhead batches ready in order.
struct DataLoader::Iterator::Run {
  Run(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches, bool prefetch)
      : dataset_(std::move(dataset)), batches_(std::move(batches)), prefetch_(prefetch) {
    if (batches_.empty()) return;
    if (prefetch_) worker_ = std::thread([this] { produce(); });
    current_ = next();
  }

  ~Run() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }

  bool done() const { return position_ >= batches_.size(); }
  const Example& current() const {
    MF_CHECK(!done(), "DataLoader: the iterator is past the last batch");
    return current_;
  }
  void advance() {
    MF_CHECK(!done(), "DataLoader: the iterator is past the last batch");
    if (++position_ < batches_.size()) current_ = next();
  }

 private:
  static constexpr size_t kAhead = 2;

  Example next() { return prefetch_ ? take() : collate(batches_[position_]); }

  /// The examples at `indices`, stacked along a new first dim.
  Example collate(const std::vector<int64_t>& indices) const {
    std::vector<Tensor> inputs, targets;
    for (int64_t index : indices) {
      Example example = dataset_->get(index);
      inputs.push_back(std::move(example.input));
      targets.push_back(std::move(example.target));
    }
    return {stack(inputs), targets.front().defined() ? stack(targets) : Tensor()};
  }

  Example take() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);
    Example batch = std::move(ready_.front());
    ready_.pop_front();
    changed_.notify_all();
    return batch;
  }

  void produce() {
    SerialThreadGuard serial;  // the intra-op pool belongs to the thread running the model
    NoGradGuard no_grad;
    for (const std::vector<int64_t>& indices : batches_) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return ready_.size() < kAhead || stop_; });
        if (stop_) return;
      }
      try {
        Example batch = collate(indices);
        std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
      } catch (...) {
        std::lock_guard lock(mutex_);
        error_ = std::current_exception();
      }
      changed_.notify_all();
      if (error_) return;  // written under the lock above, by this thread only
    }
  }

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  bool prefetch_;
  size_t position_ = 0;
  Example current_;

  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Example> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
};

const Example& DataLoader::Iterator::operator*() const { return run_->current(); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  run_->advance();
  return *this;
}

bool DataLoader::Iterator::operator==(std::default_sentinel_t) const { return run_->done(); }

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  MF_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  MF_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got {}", options_.batch_size);
  if (options_.seed) {
    seed_ = *options_.seed;
  } else {
    Generator& source = default_generator();
    seed_ = sampling::element_bits(source.seed(), source.reserve(1), 0);  // words 0 and 1 of the next block
  }
}

int64_t DataLoader::size() const {
  int64_t n = dataset_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void DataLoader::set_epoch(int64_t epoch) {
  MF_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got {}", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> DataLoader::order(int64_t epoch) const {
  int64_t n = dataset_->size();
  if (!options_.shuffle) {
    std::vector<int64_t> indices(static_cast<size_t>(n));
    std::iota(indices.begin(), indices.end(), int64_t{0});
    return indices;
  }
  // Epoch e draws from blocks [e m, (e + 1) m) of the seed's Philox stream, m the blocks randperm uses.
  Generator generator(seed_);
  generator.set_offset(static_cast<uint64_t>(epoch) * static_cast<uint64_t>((n + 1) / 2));
  return randperm(n, Device::cpu(), &generator).to_vector<int64_t>();
}

DataLoader::Iterator DataLoader::begin() {
  std::vector<int64_t> indices = order(epoch_++);
  std::vector<std::vector<int64_t>> batches;
  for (size_t start = 0; start < indices.size(); start += static_cast<size_t>(options_.batch_size)) {
    size_t end = std::min(indices.size(), start + static_cast<size_t>(options_.batch_size));
    if (options_.drop_last && end - start < static_cast<size_t>(options_.batch_size)) break;
    batches.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(start),
                         indices.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return Iterator(std::make_shared<Iterator::Run>(dataset_, std::move(batches), options_.prefetch));
}

}  // namespace mf::data
