// Memory for tensors. The CPU allocator hands out 64-byte aligned blocks and keeps freed blocks in a
// pool keyed by size, so a training loop that allocates the same shapes every step stops calling malloc.
#pragma once

#include <cstddef>

namespace mf {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // handed out and not yet returned
  size_t cached_bytes = 0;          // held in the pool for reuse
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  size_t system_allocations = 0;    // calls that reached the system allocator
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// A block of at least `nbytes` (a zero-byte request still returns a unique non-null pointer).
  virtual void* allocate(size_t nbytes) = 0;
  /// Returns a block from allocate() with the same `nbytes`.
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  /// Gives every cached block back to the system.
  virtual void empty_cache() = 0;
  virtual AllocatorStats stats() const = 0;
};

/// The process-wide caching CPU allocator.
Allocator& cpu_allocator();

inline constexpr size_t kCpuAlignment = 64;

}  // namespace mf
