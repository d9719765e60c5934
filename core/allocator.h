// Memory for tensors. Each device has one caching allocator: freed blocks stay in a pool for reuse,
// so a training loop stops calling the system allocator after its first steps. Blocks come in size
// classes, four per power of two, and a request takes the smallest cached block of its class or up to
// twice its size: batches of varying shape then reuse each other's blocks, where a pool keyed by exact
// size grows with every new shape. empty_cache() gives the pool back, like torch.cuda.empty_cache().
#pragma once

#include "core/device.h"

#include <cstddef>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace mf {

/// What an allocator holds and has done. Bytes are counted in rounded block sizes, so they can exceed
/// the sum of the requests.
struct AllocatorStats {
  size_t allocated_bytes = 0;       // handed out and not yet returned
  size_t cached_bytes = 0;          // held in the pool for reuse
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the start or reset_peak_stats()
  size_t allocations = 0;           // blocks handed out by allocate()
  size_t cache_hits = 0;            // of those, blocks that came from the pool
  size_t system_allocations = 0;    // and blocks that came from the system (allocations - cache_hits)
  size_t system_frees = 0;          // blocks given back to the system by empty_cache()

  /// Bytes taken from the system and not given back: allocated + cached (PyTorch's "reserved").
  size_t reserved_bytes() const { return allocated_bytes + cached_bytes; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// A block of at least `nbytes` (a zero-byte request still returns a unique non-null pointer).
  virtual void* allocate(size_t nbytes) = 0;
  /// Returns a block from allocate() (`nbytes` as requested).
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  /// Gives every cached block back to the system; returns the bytes released (the cached_bytes before).
  virtual size_t empty_cache() = 0;
  virtual AllocatorStats stats() const = 0;
  /// Starts peak_allocated_bytes again from the bytes allocated now.
  virtual void reset_peak_stats() = 0;
};

/// The pool and statistics that the CPU and CUDA allocators share; a device supplies the system calls.
/// Bytes are counted in block sizes: a request served by a larger cached block counts the whole block.
/// Thread-safe.
class CachingAllocator : public Allocator {
 public:
  /// `device` names the device in out-of-memory errors; every block size is a multiple of `granule`.
  CachingAllocator(std::string device, size_t granule) : device_(std::move(device)), granule_(granule) {}
  ~CachingAllocator() override = default;

  void* allocate(size_t nbytes) final;
  void deallocate(void* ptr, size_t nbytes) final;
  size_t empty_cache() final;
  AllocatorStats stats() const final;
  void reset_peak_stats() final;

  /// The size of the block that serves a request of `nbytes`: its size class (the next of 1.25, 1.5,
  /// 1.75 or 2 times a power of two), rounded up to the granule. Such a request may also be served by
  /// a cached block of up to twice this size.
  size_t block_size(size_t nbytes) const;

 protected:
  /// A fresh block of `size` bytes, or nullptr when the device is out of memory (any other failure
  /// throws mf::Error).
  virtual void* system_allocate(size_t size) = 0;
  /// Gives `blocks` back to the system. Called without the pool's lock held.
  virtual void system_free(std::span<void* const> blocks) = 0;

 private:
  /// Records `ptr`, a block of `size` bytes, as handed out; needs mutex_.
  void count_allocation(void* ptr, size_t size, bool from_pool);
  /// Moves every cached block out of the pool (the caller frees them); needs mutex_.
  std::vector<void*> take_cached();

  std::string device_;
  size_t granule_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // block size -> cached blocks (no empty lists)
  std::unordered_map<void*, size_t> in_use_;   // block -> its size
  AllocatorStats stats_;
};

/// The process-wide caching CPU allocator.
Allocator& cpu_allocator();

inline constexpr size_t kCpuAlignment = 64;

/// Empties the cache of `device`'s allocator (torch.cuda.empty_cache()); returns the bytes released.
/// Memory in use by live tensors is untouched. Throws mf::Error when `device` is not available.
size_t empty_cache(Device device = Device::cpu());

/// The statistics of `device`'s allocator. Throws mf::Error when `device` is not available.
AllocatorStats memory_stats(Device device = Device::cpu());

/// Starts `device`'s peak_allocated_bytes again from the bytes allocated now.
void reset_peak_memory_stats(Device device = Device::cpu());

}  // namespace mf
