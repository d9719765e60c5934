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
/// are reproducible run after run. Calls from inside a chunk run serially. The pool serves one caller
/// at a time: a call from another thread while it is busy runs its chunks on that thread, in order.
/// Exceptions propagate.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// How kernels are asked to compute, per thread. The dispatcher sets it for an op that autocast
/// lowers (ops/functional.h's AutocastGuard), and parallel_for carries the caller's settings to the
/// threads that run its chunks, so a kernel computes alike on every thread it splits over.
struct KernelSettings {
  /// float32 GEMMs round their operands to bfloat16 and sum the products in float32.
  bool bfloat16_products = false;
};
const KernelSettings& kernel_settings();

/// Sets this thread's kernel settings for its scope.
class KernelSettingsGuard {
 public:
  explicit KernelSettingsGuard(KernelSettings settings);
  ~KernelSettingsGuard();
  KernelSettingsGuard(const KernelSettingsGuard&) = delete;
  KernelSettingsGuard& operator=(const KernelSettingsGuard&) = delete;

 private:
  KernelSettings previous_;
};

/// While alive, parallel_for on this thread runs every range serially on the thread itself. For
/// threads besides the one that drives the model (a DataLoader's background thread, DDP's MPI
/// thread): they then never take the pool from the model's thread.
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
