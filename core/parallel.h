// The one intra-op thread pool. Kernels split work with parallel_for; the pool's workers sleep on a
// condition variable between jobs, so they never compete with OpenBLAS's threads for the cores.
#pragma once

#include <cstdint>
#include <functional>

namespace mf {

/// Threads parallel_for uses (the caller counts as one). Defaults to the number of cores.
int intra_op_threads();

/// Resizes the pool (n >= 1). Not to be called while a parallel_for runs. Programs call
/// mf::set_num_threads (ops/functional.h, PyTorch's name), which sets this same pool: there is one
/// thread setting, and this is its name in the layers below ops.
void set_intra_op_threads(int n);

/// Runs fn(chunk_begin, chunk_end) over [begin, end) split into at most intra_op_threads() contiguous
/// chunks of at least `grain` items. Chunks are fixed by the range and thread count alone, so results
/// are reproducible run after run. Calls from inside a chunk run serially. Exceptions propagate.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// While alive, parallel_for on this thread runs every range serially on the thread itself. For
/// threads besides the one that drives the model (a DataLoader's background thread): the pool
/// serves one caller at a time.
class SerialThreadGuard {
 public:
  SerialThreadGuard();
  ~SerialThreadGuard();
  SerialThreadGuard(const SerialThreadGuard&) = delete;
  SerialThreadGuard& operator=(const SerialThreadGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace mf
