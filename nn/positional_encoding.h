// Sinusoidal positional encoding ("Attention Is All You Need", section 3.5).
//
// Axes: B = batch, T = sequence length, C = d_model.
#pragma once

#include "core/tensor.h"
#include "nn/module.h"

#include <string>

namespace mf::nn {

struct PositionalEncodingOptions {
  int64_t d_model = 0;     // C
  int64_t max_len = 5000;  // positions the table covers
};

/// Adds the sinusoidal table PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C)).
/// The table is the buffer "pe" [max_len, C], computed and kept in float64 so that float64 runs see
/// it exactly (converting the module with to(Float32) rounds it); forward casts the rows it uses to
/// the input's dtype.
class PositionalEncodingImpl : public Module {
 public:
  using Options = PositionalEncodingOptions;
  explicit PositionalEncodingImpl(const PositionalEncodingOptions& options);
  /// x [B, T, C] + PE[start : start + T] (start > 0 for incremental decoding). Throws when
  /// start + T exceeds max_len.
  Tensor forward(const Tensor& x, int64_t start);
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  /// "d_model=16, max_len=5000".
  std::string extra_repr() const override;
  const PositionalEncodingOptions& options() const { return options_; }

  Tensor pe;  // [max_len, C]

 private:
  PositionalEncodingOptions options_;
};
MF_MODULE(PositionalEncoding);

}  // namespace mf::nn
