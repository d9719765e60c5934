#include "nn/kv_cache.h"

#include "core/error.h"

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

KVCache* KVCache::active() { return in_use; }

KVCache::Use::Use(KVCache& cache) : previous_(in_use) { in_use = &cache; }
KVCache::Use::~Use() { in_use = previous_; }

int64_t cache_position() { return in_use != nullptr ? in_use->position() : 0; }

}  // namespace mf::nn
