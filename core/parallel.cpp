#include "core/parallel.h"

#include "core/error.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mf {
namespace {

thread_local bool inside_parallel_region = false;
thread_local KernelSettings settings_here;

constexpr int kMaxThreads = 4096;  // chunks per run fit the 16 bits the pool counts them in

// Workers spin for a short while after each task before they sleep: the ops of a model step come
// microseconds apart, and a condition-variable wake-up costs more than many small kernels. Chunks are
// claimed, not assigned, so the caller takes every chunk no worker has woken up for; it never waits
// on a sleeping thread. A claim is a compare-and-swap on one word holding (run id, chunk count, next
// chunk), so a late worker can never take a chunk of a run that has already moved on, nor judge a
// run's chunks by another run's count.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    stop();
    start(threads);
  }

  // Runs task(i) for each i in [0, count) once, on the caller and whichever workers are awake. The
  // pool serves one caller at a time: a call from another thread meanwhile (DDP's MPI thread, a thread
  // of the user's) runs its chunks itself, in order.
  void run(int count, const std::function<void(int)>& task) {
    std::unique_lock turn(caller_, std::try_to_lock);
    if (!turn.owns_lock()) {
      SerialThreadGuard serial;
      for (int i = 0; i < count; ++i) task(i);
      return;
    }
    task_.store(&task, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    uint64_t run = run_of(claims_.load(std::memory_order_relaxed)) + 1;
    claims_.store(run << 32 | static_cast<uint64_t>(count) << 16, std::memory_order_seq_cst);  // publishes task_
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lock(mutex_);  // a worker between its check and its wait holds the mutex
      wake_.notify_all();
    }
    run_claimed(run);
    for (int spins = 0; finished_.load(std::memory_order_acquire) < count; ++spins) pause(spins);
    std::exception_ptr error;
    {
      std::lock_guard lock(mutex_);
      std::swap(error, error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  static constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);

  static uint64_t run_of(uint64_t claims) { return claims >> 32; }
  static int count_of(uint64_t claims) { return static_cast<int>((claims >> 16) & 0xFFFF); }
  static int next_of(uint64_t claims) { return static_cast<int>(claims & 0xFFFF); }

  // Backs off politely: a CPU pause, and a yield now and then in case the machine is oversubscribed.
  static void pause(int spins) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (spins % 1024 == 1023) std::this_thread::yield();
  }

  // Claims and runs chunks of run `run` until none is left.
  void run_claimed(uint64_t run) {
    uint64_t claims = claims_.load(std::memory_order_acquire);
    while (run_of(claims) == run) {
      int index = next_of(claims);
      if (index >= count_of(claims)) return;
      if (!claims_.compare_exchange_weak(claims, claims + 1, std::memory_order_acq_rel)) continue;
      inside_parallel_region = true;
      try {
        (*task_.load(std::memory_order_relaxed))(index);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      inside_parallel_region = false;
      finished_.fetch_add(1, std::memory_order_acq_rel);
      claims = claims_.load(std::memory_order_acquire);
    }
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
    uint64_t seen = run_of(claims_.load(std::memory_order_acquire));
    while (true) {
      auto fresh = [&] { return run_of(claims_.load(std::memory_order_seq_cst)) != seen; };
      auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
      for (int spins = 0; !fresh() && !quit_.load(std::memory_order_relaxed); ++spins) {
        pause(spins);
        if (spins % 64 == 63 && std::chrono::steady_clock::now() > spin_until) break;
      }
      if (!fresh()) {
        std::unique_lock lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return quit_.load(std::memory_order_relaxed) || fresh(); });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
      if (quit_.load(std::memory_order_relaxed)) return;
      seen = run_of(claims_.load(std::memory_order_acquire));
      run_claimed(seen);
    }
  }

  std::mutex caller_;  // held by the thread whose run the pool is serving
  std::mutex mutex_;   // guards error_ and the sleep / wake-up handshake
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  // The current run's task, published by the store to claims_ that starts the run.
  std::atomic<const std::function<void(int)>*> task_{nullptr};
  std::atomic<uint64_t> claims_{0};  // run id << 32 | chunk count << 16 | next unclaimed chunk
  std::atomic<int> finished_{0};     // chunks of the current run that have run
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  std::exception_ptr error_;
};

ThreadPool& pool() {
  static ThreadPool instance(std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads));
  return instance;
}

}  // namespace

int intra_op_threads() { return pool().size(); }

void set_intra_op_threads(int n) {
  MF_CHECK(n >= 1, "set_num_threads: thread count must be at least 1, got {}", n);
  MF_CHECK(n <= kMaxThreads, "set_num_threads: thread count must be at most {}, got {}", kMaxThreads, n);
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
  const KernelSettings callers = settings_here;
  pool().run(static_cast<int>(chunks), [&](int chunk) {
    int64_t lo = begin + chunk * per_chunk;
    int64_t hi = std::min(end, lo + per_chunk);
    KernelSettingsGuard same_as_the_caller(callers);
    if (lo < hi) fn(lo, hi);
  });
}

const KernelSettings& kernel_settings() { return settings_here; }

KernelSettingsGuard::KernelSettingsGuard(KernelSettings settings) : previous_(settings_here) {
  settings_here = settings;
}
KernelSettingsGuard::~KernelSettingsGuard() { settings_here = previous_; }

SerialThreadGuard::SerialThreadGuard() : previous_(inside_parallel_region) { inside_parallel_region = true; }
SerialThreadGuard::~SerialThreadGuard() { inside_parallel_region = previous_; }

}  // namespace mf
