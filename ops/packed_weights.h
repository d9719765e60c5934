// Weights packed once for the CPU GEMMs and kept while they are unchanged: linear_int8's int8
// weights (ops/quantized.cpp) and, in products under NoGradGuard, float weights (ops/matmul.cpp).
#pragma once

#include "core/isa.h"
#include "core/storage.h"
#include "core/tensor.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace mf {

/// The packings of the weights an op has met, by the tensors they came from: a weight is packed on
/// its first call (or its second, through get_if_seen) and the packing reused while its tensors are
/// the same views of unchanged storage and the kernel path is the same. An entry goes once any of its
/// storage is freed or written to (checked at every call, and by sweep()), so a model trained between
/// inference calls is packed anew.
template <typename Packed, size_t Tensors>
class PackedWeightCache {
 public:
  /// The packing of `tensors`, made by pack() if there is none yet.
  template <typename Pack>
  std::shared_ptr<const Packed> get(const std::array<const Tensor*, Tensors>& tensors, Pack&& pack) {
    return find_or_pack(tensors, pack, true);
  }

  /// get() for tensors met before; the first call only records them and returns nullptr (the caller
  /// multiplies unpacked), so that a tensor multiplied once, as an activation is, is never packed.
  template <typename Pack>
  std::shared_ptr<const Packed> get_if_seen(const std::array<const Tensor*, Tensors>& tensors, Pack&& pack) {
    return find_or_pack(tensors, pack, false);
  }

  /// Drops the packings of weights that were freed or written to (get() does so too). Costs one
  /// atomic load while the cache is empty, as it is while a model trains.
  void sweep() {
    if (count_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(mutex_);
    erase_stale();
  }

 private:
  struct View {
    const Storage* storage;
    int64_t offset;
    Shape shape, strides;
    uint32_t version;
    bool operator==(const View&) const = default;
  };
  struct Key {
    std::array<View, Tensors> views;
    Isa isa;
    bool operator==(const Key&) const = default;
  };
  struct Entry {
    Key key;
    std::array<std::weak_ptr<Storage>, Tensors> storages;
    std::shared_ptr<const Packed> packed;  // null while met only once (get_if_seen)
    /// Whether every storage is alive and unwritten since the packing.
    bool current() const {
      for (size_t i = 0; i < Tensors; ++i) {
        std::shared_ptr<Storage> storage = storages[i].lock();
        if (!storage || storage->version() != key.views[i].version) return false;
      }
      return true;
    }
  };

  template <typename Pack>
  std::shared_ptr<const Packed> find_or_pack(const std::array<const Tensor*, Tensors>& tensors, Pack& pack,
                                             bool pack_when_new) {
    Key key = key_of(tensors);
    std::lock_guard lock(mutex_);
    erase_stale();
    for (Entry& e : entries_)
      if (e.key == key) {
        if (!e.packed) e.packed = std::make_shared<const Packed>(pack());
        return e.packed;
      }
    Entry entry{key, {}, pack_when_new ? std::make_shared<const Packed>(pack()) : nullptr};
    for (size_t i = 0; i < Tensors; ++i) entry.storages[i] = tensors[i]->storage();
    entries_.push_back(entry);
    count_.store(entries_.size(), std::memory_order_relaxed);
    return entry.packed;
  }

  /// Drops the entries that are no longer current; needs mutex_.
  void erase_stale() {
    std::erase_if(entries_, [](const Entry& e) { return !e.current(); });
    count_.store(entries_.size(), std::memory_order_relaxed);
  }

  static Key key_of(const std::array<const Tensor*, Tensors>& tensors) {
    Key key{.views = {}, .isa = kernel_isa()};
    for (size_t i = 0; i < Tensors; ++i) {
      const Tensor& t = *tensors[i];
      key.views[i] = {t.storage().get(), t.offset(), t.shape(), t.strides(), t.storage()->version()};
    }
    return key;
  }

  std::mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<size_t> count_{0};  // entries_.size(), for sweep()'s check without the lock
};

}  // namespace mf
