// Axes: B = batch, T = sequence length, C = d_model.
#include "nn/positional_encoding.h"

#include "ops/functional.h"

#include <fmt/format.h>

#include <cmath>

namespace mf::nn {

PositionalEncodingImpl::PositionalEncodingImpl(const PositionalEncodingOptions& options)
    : Module("PositionalEncoding"), options_(options) {
  MF_CHECK(options.d_model > 0 && options.max_len >= 0,
           "PositionalEncoding: d_model must be positive and max_len >= 0, got {} and {}", options.d_model,
           options.max_len);
  int64_t C = options.d_model;
  std::vector<double> table(static_cast<size_t>(options.max_len * C));
  for (int64_t j = 0; j < C; ++j) {
    // 1 / 10000^(2i/C) for the pair i = j / 2, written as PyTorch's tutorial (and the reference
    // generator) writes it: exp(2i * -ln(10000) / C).
    double inv_freq = std::exp(static_cast<double>(j / 2 * 2) * (-std::log(10000.0) / static_cast<double>(C)));
    for (int64_t p = 0; p < options.max_len; ++p) {
      double angle = static_cast<double>(p) * inv_freq;
      table[static_cast<size_t>(p * C + j)] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  }
  pe = register_buffer("pe", from_vector(table, {options.max_len, C}), /*persistent=*/false);
}

Tensor PositionalEncodingImpl::forward(const Tensor& x, int64_t start) {
  MF_CHECK(x.defined() && x.dim() == 3 && x.size(2) == options_.d_model,
           "PositionalEncoding: input must be [B, T, {}] (d_model {}), got {}", options_.d_model, options_.d_model,
           x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  int64_t T = x.size(1);
  MF_CHECK(start >= 0 && start + T <= options_.max_len,
           "PositionalEncoding: positions {} to {} (start {} + length {}) exceed max_len {}", start, start + T - 1,
           start, T, options_.max_len);
  return x + pe.narrow(0, start, T).to(x.dtype());  // [B, T, C] + [T, C]
}

std::string PositionalEncodingImpl::extra_repr() const {
  return fmt::format("d_model={}, max_len={}", options_.d_model, options_.max_len);
}

}  // namespace mf::nn
