// The Transformer configurations the benchmarks time (bench_transformer, bench_distributed), with
// the synthetic batch each step trains on.
#pragma once

#include "models/transformer.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace mf::tools {

struct BenchConfig {
  const char* name;
  int64_t d_model, layers, heads, d_ff, vocab, batch, length;

  /// The model: dropout 0.1, sequences up to `length` (at least 64) tokens.
  models::TransformerConfig model() const {
    return {.src_vocab = vocab, .tgt_vocab = vocab, .d_model = d_model, .heads = heads, .encoder_layers = layers,
            .decoder_layers = layers, .d_ff = d_ff, .dropout = 0.1, .max_len = std::max<int64_t>(length, 64) + 1};
  }
};

inline constexpr BenchConfig kBenchConfigs[] = {
    {"seed", 512, 6, 8, 2048, 32, 6, 20},
    {"small", 256, 3, 4, 1024, 8000, 32, 32},
    {"base", 512, 6, 8, 2048, 16000, 16, 64},
};

/// The config called `name`, or nullptr.
inline const BenchConfig* find_bench_config(const std::string& name) {
  for (const BenchConfig& c : kBenchConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace mf::tools
