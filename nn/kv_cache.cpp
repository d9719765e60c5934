#include "nn/kv_cache.h"

#include "core/error.h"
#include "ops/functional.h"

namespace mf::nn {

namespace {
thread_local KVCache* in_use = nullptr;
}  // namespace

void KVCache::advance(int64_t count) {
  MF_CHECK(count >= 0, "KVCache: cannot advance by {} positions", count);
  position_ += count;
}

void KVCache::clear() {
  entries_.clear();
  position_ = 0;
}

void KVCache::select_rows(const Tensor& index) {
  for (auto& [module, entry] : entries_) {
    const Tensor rows = index.to(entry.keys.device());
    entry.keys = index_select(entry.keys, 0, rows);
    entry.values = index_select(entry.values, 0, rows);
  }
}

KVCache* KVCache::active() { return in_use; }

KVCache::Use::Use(KVCache& cache) : previous_(in_use) { in_use = &cache; }
KVCache::Use::~Use() { in_use = previous_; }

int64_t cache_position() { return in_use != nullptr ? in_use->position() : 0; }

}  // namespace mf::nn
