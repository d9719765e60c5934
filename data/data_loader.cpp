#include "data/data_loader.h"

#include "core/graph.h"
#include "core/parallel.h"
#include "ops/functional.h"
#include "ops/sampling.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
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

Example stack_examples(std::vector<Example> examples) {
  MF_CHECK(!examples.empty(), "stack_examples: no examples to stack");
  std::vector<Tensor> inputs, targets;
  for (Example& example : examples) {
    inputs.push_back(std::move(example.input));
    targets.push_back(std::move(example.target));
  }
  return {stack(inputs), targets.front().defined() ? stack(targets) : Tensor()};
}

// One epoch's walk: the batches' indices, the batch in hand, and with workers the threads that build
// the next batches, each taking the next one not yet started, and the built ones waiting by number
// until the loop takes them in order.
struct DataLoader::Iterator::Run {
  Run(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches, int64_t workers,
      std::function<Example(std::vector<Example>)> collate)
      : dataset_(std::move(dataset)), batches_(std::move(batches)), collate_(std::move(collate)),
        workers_(static_cast<size_t>(std::min<int64_t>(workers, static_cast<int64_t>(batches_.size())))) {
    if (batches_.empty()) return;
    for (size_t w = 0; w < workers_; ++w) threads_.emplace_back([this] { work(); });
    try {
      current_ = next();
    } catch (...) {
      stop();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ~Run() { stop(); }

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
  static constexpr size_t kAheadPerWorker = 2;

  /// A built batch, or the error building it threw.
  struct Built {
    Example batch;
    std::exception_ptr error;
  };

  Example next() { return workers_ == 0 ? build(position_) : take(position_); }

  /// Batch `b`: the examples at its indices, collated.
  Example build(size_t b) const {
    std::vector<Example> examples;
    for (int64_t index : batches_[b]) examples.push_back(dataset_->get(index));
    return collate_ ? collate_(std::move(examples)) : stack_examples(std::move(examples));
  }

  Example take(size_t b) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return built_.count(b) > 0; });
    Built built = std::move(built_.at(b));
    built_.erase(b);
    taken_ = b + 1;
    changed_.notify_all();
    if (built.error) std::rethrow_exception(built.error);
    return std::move(built.batch);
  }

  void work() {
    SerialThreadGuard serial;  // the intra-op pool belongs to the thread running the model
    NoGradGuard no_grad;
    for (;;) {
      size_t b = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] {
          return stop_ || next_batch_ >= batches_.size() || next_batch_ < taken_ + kAheadPerWorker * workers_;
        });
        if (stop_ || next_batch_ >= batches_.size()) return;
        b = next_batch_++;
      }
      Built built;
      try {
        built.batch = build(b);
      } catch (...) {
        built.error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        built_.emplace(b, std::move(built));
      }
      changed_.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  std::function<Example(std::vector<Example>)> collate_;
  size_t workers_;
  size_t position_ = 0;  // the batch in hand (the loop's thread only)
  Example current_;

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<size_t, Built> built_;  // by batch number
  size_t next_batch_ = 0;           // the next batch a worker starts
  size_t taken_ = 0;                // batches the loop has taken
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
  MF_CHECK(options_.num_workers >= 0, "DataLoader: num_workers must be >= 0, got {}", options_.num_workers);
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
  return Iterator(std::make_shared<Iterator::Run>(dataset_, std::move(batches), options_.num_workers, options_.collate));
}

}  // namespace mf::data
