#include "core/storage.h"

#include "core/error.h"

namespace mf {

// Set by the CUDA layer when it is built; a build without CUDA leaves it empty.
Allocator* (*cuda_allocator_hook)(int device_index) = nullptr;

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  MF_CHECK(cuda_allocator_hook != nullptr, "device {} is not available: miniflow was built without CUDA",
           device.str());
  return *cuda_allocator_hook(device.index);
}

Storage::Storage(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

}  // namespace mf
