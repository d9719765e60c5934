// Axes: C = d_model, F = feed-forward width.
#include "nn/feed_forward.h"

#include "ops/functional.h"

namespace mf::nn {

PositionwiseFeedForwardImpl::PositionwiseFeedForwardImpl(const PositionwiseFeedForwardOptions& options)
    : Module("PositionwiseFeedForward"), options_(options) {
  MF_CHECK(options.d_model > 0 && options.d_ff > 0,
           "PositionwiseFeedForward: d_model and d_ff must be positive, got {} and {}", options.d_model, options.d_ff);
  linear1 = register_module("linear1", Linear(LinearOptions{options.d_model, options.d_ff}));
  dropout = register_module("dropout", Dropout(DropoutOptions{options.dropout}));
  linear2 = register_module("linear2", Linear(LinearOptions{options.d_ff, options.d_model}));
}

Tensor PositionwiseFeedForwardImpl::forward(const Tensor& x) {
  Tensor hidden;  // [..., F]
  if (options_.activation == Activation::GELU)
    hidden = gelu(linear1->forward(x));
  else if (linear1->is_quantized())
    hidden = relu(linear1->forward(x));
  else
    hidden = linear_relu(x, linear1->weight, linear1->bias);  // the ReLU fused into the GEMM
  return linear2->forward(dropout->forward(hidden));  // [..., C]
}

}  // namespace mf::nn
