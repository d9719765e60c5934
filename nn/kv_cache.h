// Keys and values kept across calls, for incremental decoding of decoder-only models built from
// nn::MultiHeadAttention (GPT-style generation; generation::generate drives one).
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <unordered_map>

namespace mf::nn {

/// While a KVCache is in use on a thread (KVCache::Use), every MultiHeadAttention called there as
/// self-attention, forward(x), projects keys and values for x's positions only, appends them to its
/// own entry, and attends over every position cached so far; with options.causal, new position t sees
/// the cached positions and the new ones up to t. So a model fed only its newest token computes what
/// it would for the whole sequence. A model numbers its positions from position() (cache_position()).
class KVCache {
 public:
  /// Positions cached so far: the position of the next token fed.
  int64_t position() const { return position_; }
  /// Records that the last model call fed `count` new positions.
  void advance(int64_t count);
  /// Forgets every position.
  void clear();
  /// Keeps and reorders the cached rows of every entry: row i becomes old row index[i] (`index`: [B']
  /// int64, entries of [0, B), repeats allowed), as a beam forks and drops hypotheses.
  void select_rows(const Tensor& index);

  /// One attention module's keys and values, [B, H, S, D] each.
  struct Entry {
    Tensor keys, values;
  };
  /// The entry of the attention module at `module` (empty on first use).
  Entry& entry(const void* module) { return entries_[module]; }

  /// This thread's cache in use, or null.
  static KVCache* active();
  /// Puts `cache` in use on this thread for the guard's lifetime.
  class Use {
   public:
    explicit Use(KVCache& cache);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    KVCache* previous_;
  };

 private:
  std::unordered_map<const void*, Entry> entries_;
  int64_t position_ = 0;
};

/// The position of the next token fed: the cache in use's position(), 0 when none is. A model with
/// learned positions embeds arange(cache_position(), cache_position() + T).
int64_t cache_position();

}  // namespace mf::nn
