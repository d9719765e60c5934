#include "core/allocator.h"

#include "core/error.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mf {
namespace {

// Rounding sizes up makes blocks of nearly equal size share one free list.
size_t bucket_size(size_t nbytes) {
  size_t granule = nbytes < (1u << 20) ? kCpuAlignment : 4096;
  return (std::max<size_t>(nbytes, 1) + granule - 1) / granule * granule;
}

class CachingCpuAllocator final : public Allocator {
 public:
  ~CachingCpuAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes) override {
    size_t size = bucket_size(nbytes);
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= size;
        note_allocated(size);
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kCpuAlignment, size);
    if (ptr == nullptr) {
      empty_cache();  // memory held in the pool may be what the system is missing
      ptr = std::aligned_alloc(kCpuAlignment, size);
    }
    MF_CHECK(ptr != nullptr, "out of memory: cannot allocate {} bytes on cpu", nbytes);
    std::lock_guard lock(mutex_);
    ++stats_.system_allocations;
    note_allocated(size);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    size_t size = bucket_size(nbytes);
    std::lock_guard lock(mutex_);
    free_[size].push_back(ptr);
    stats_.allocated_bytes -= size;
    stats_.cached_bytes += size;
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_)
      for (void* ptr : blocks) std::free(ptr);
    free_.clear();
    stats_.cached_bytes = 0;
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  void note_allocated(size_t size) {
    stats_.allocated_bytes += size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors in static storage may outlive any destruction order we could pick.
  static auto* allocator = new CachingCpuAllocator();
  return *allocator;
}

}  // namespace mf
