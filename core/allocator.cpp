#include "core/allocator.h"

#include "core/error.h"
#include "core/storage.h"

#include <bit>
#include <cstdlib>
#include <sys/mman.h>

namespace mf {

size_t CachingAllocator::block_size(size_t nbytes) const {
  size_t size = std::max<size_t>(nbytes, 1);
  if (size > 4) {
    const size_t step = std::bit_floor(size - 1) / 4;  // a quarter of the power of two below size
    size = (size + step - 1) / step * step;
  }
  return (size + granule_ - 1) / granule_ * granule_;
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t size = block_size(nbytes);
  {
    std::lock_guard lock(mutex_);
    // Best fit, but not more than twice the size: a small tensor must not pin a large block.
    if (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size) {
      const size_t found = it->first;
      void* ptr = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      stats_.cached_bytes -= found;
      count_allocation(ptr, found, true);
      return ptr;
    }
  }
  void* ptr = system_allocate(size);
  if (ptr == nullptr && empty_cache() > 0) ptr = system_allocate(size);  // the pool may hold what is missing
  std::lock_guard lock(mutex_);
  MF_CHECK(ptr != nullptr, "out of memory: cannot allocate {} bytes on {} ({} bytes allocated, {} cached)", nbytes,
           device_, stats_.allocated_bytes, stats_.cached_bytes);
  count_allocation(ptr, size, false);
  return ptr;
}

void CachingAllocator::count_allocation(void* ptr, size_t size, bool from_pool) {
  in_use_.emplace(ptr, size);
  ++stats_.allocations;
  ++(from_pool ? stats_.cache_hits : stats_.system_allocations);
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

void CachingAllocator::deallocate(void* ptr, size_t) {
  std::lock_guard lock(mutex_);
  auto node = in_use_.extract(ptr);
  MF_CHECK(!node.empty(), "{} allocator: freeing a block it did not hand out", device_);
  const size_t size = node.mapped();
  free_[size].push_back(ptr);
  stats_.allocated_bytes -= size;
  stats_.cached_bytes += size;
}

std::vector<void*> CachingAllocator::take_cached() {
  std::vector<void*> blocks;
  for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
  free_.clear();
  stats_.system_frees += blocks.size();
  stats_.cached_bytes = 0;
  return blocks;
}

size_t CachingAllocator::empty_cache() {
  std::vector<void*> blocks;
  size_t released = 0;
  {
    std::lock_guard lock(mutex_);
    released = stats_.cached_bytes;
    blocks = take_cached();
  }
  system_free(blocks);
  return released;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

class CachingCpuAllocator final : public CachingAllocator {
 public:
  CachingCpuAllocator() : CachingAllocator("cpu", kCpuAlignment) {}

 protected:
  // Blocks of 2 MiB and more are laid on transparent huge pages (where the kernel offers them on
  // request, as Debian's does by default): a GEMM that packs A^T reads each row of a block from a
  // new 4 KiB page, and the activations of a step span more pages than the TLB holds.
  void* system_allocate(size_t size) override {
    if (size < kHugePage) return std::aligned_alloc(kCpuAlignment, size);
    size_t pages = (size + kHugePage - 1) / kHugePage;
    void* ptr = std::aligned_alloc(kHugePage, pages * kHugePage);
#if defined(MADV_HUGEPAGE)
    if (ptr != nullptr) madvise(ptr, pages * kHugePage, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
    return ptr;
  }

  void system_free(std::span<void* const> blocks) override {
    for (void* block : blocks) std::free(block);
  }
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors in static storage may outlive any destruction order we could pick.
  static auto* allocator = new CachingCpuAllocator();
  return *allocator;
}

size_t empty_cache(Device device) { return allocator_for(device).empty_cache(); }

AllocatorStats memory_stats(Device device) { return allocator_for(device).stats(); }

void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak_stats(); }

}  // namespace mf
