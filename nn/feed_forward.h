// The Transformer's position-wise feed-forward block ("Attention Is All You Need", section 3.3).
//
// Axes: C = d_model, F = feed-forward width (d_ff).
#pragma once

#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/module.h"

#include <memory>

namespace mf::nn {

enum class Activation { ReLU, GELU };

struct PositionwiseFeedForwardOptions {
  int64_t d_model = 0;  // C
  int64_t d_ff = 0;     // F
  /// Dropout after the activation (training mode only).
  double dropout = 0.0;
  Activation activation = Activation::ReLU;
};

/// linear2(dropout(activation(linear1(x)))): [..., C] -> [..., F] -> [..., C]. Children "linear1"
/// (Linear(C, F)), "dropout", "linear2" (Linear(F, C)), as in torch.nn.TransformerEncoderLayer.
class PositionwiseFeedForwardImpl : public Module {
 public:
  using Options = PositionwiseFeedForwardOptions;
  explicit PositionwiseFeedForwardImpl(const PositionwiseFeedForwardOptions& options);
  Tensor forward(const Tensor& x) override;
  const PositionwiseFeedForwardOptions& options() const { return options_; }

  Linear linear1{nullptr};
  Dropout dropout{nullptr};
  Linear linear2{nullptr};

 private:
  PositionwiseFeedForwardOptions options_;
};
MF_MODULE(PositionwiseFeedForward);

}  // namespace mf::nn
