#include "core/parallel.h"

#include "core/error.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mf {
namespace {

thread_local bool inside_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    stop();
    start(threads);
  }

  // Runs task(i) for i in [0, count): the caller takes i = 0, workers the rest.
  void run(int count, const std::function<void(int)>& task) {
    std::unique_lock lock(mutex_);
    task_ = &task;
    pending_ = count - 1;
    next_ = 1;
    count_ = count;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    std::exception_ptr error = run_guarded(task, 0);
    lock.lock();
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    if (!error) error = worker_error_;
    worker_error_ = nullptr;
    lock.unlock();
    if (error) std::rethrow_exception(error);
  }

 private:
  static std::exception_ptr run_guarded(const std::function<void(int)>& task, int index) {
    inside_parallel_region = true;
    std::exception_ptr error;
    try {
      task(index);
    } catch (...) {
      error = std::current_exception();
    }
    inside_parallel_region = false;
    return error;
  }

  void start(int threads) {
    quit_ = false;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
    workers_.clear();
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return quit_ || (generation_ != seen && next_ < count_); });
      if (quit_) return;
      int index = next_++;
      if (next_ >= count_) seen = generation_;
      const auto* task = task_;
      lock.unlock();
      std::exception_ptr error = run_guarded(*task, index);
      lock.lock();
      if (error && !worker_error_) worker_error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* task_ = nullptr;
  int next_ = 0, count_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
  std::exception_ptr worker_error_;
};

ThreadPool& pool() {
  static ThreadPool instance(std::max(1u, std::thread::hardware_concurrency()));
  return instance;
}

}  // namespace

int intra_op_threads() { return pool().size(); }

void set_intra_op_threads(int n) {
  MF_CHECK(n >= 1, "set_num_threads: thread count must be at least 1, got {}", n);
  if (n != pool().size()) pool().resize(n);
}

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  int64_t total = end - begin;
  if (total <= 0) return;
  int64_t chunks = std::min<int64_t>(intra_op_threads(), (total + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || inside_parallel_region) {
    fn(begin, end);
    return;
  }
  int64_t per_chunk = (total + chunks - 1) / chunks;
  pool().run(static_cast<int>(chunks), [&](int chunk) {
    int64_t lo = begin + chunk * per_chunk;
    int64_t hi = std::min(end, lo + per_chunk);
    if (lo < hi) fn(lo, hi);
  });
}

}  // namespace mf
