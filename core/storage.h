// A reference-counted block of device memory that tensors view.
#pragma once

#include "core/allocator.h"
#include "core/device.h"

#include <cstddef>
#include <cstdint>
#include <memory>

namespace mf {

class Storage {
 public:
  /// Allocates `nbytes` on `device` (uninitialised).
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  /// Bumped by every in-place write, so autograd can tell that a tensor it saved has changed.
  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  uint32_t version_ = 0;
};

/// The allocator that serves `device`; throws mf::Error when that device is not available.
Allocator& allocator_for(Device device);

}  // namespace mf
