// Printing tensors the way PyTorch does:
//
//   tensor([[ 1.0000,  2.5000],
//           [-3.0000,  4.0000]], dtype=float64, requires_grad=True)
//
// Columns align, floats get 4 decimals (whole numbers print as "1.", and scientific notation takes
// over when magnitudes span more than 1000x, exceed 1e8 or go below 1e-4), tensors over 1000
// elements show the first and last 3 entries of each dim around "...", and the suffixes name what
// differs from the defaults: device, dtype (float32, int64 and bool are implied), grad_fn or
// requires_grad.
#pragma once

#include "core/tensor.h"

#include <fmt/format.h>

#include <iosfwd>
#include <string>

namespace mf {

/// The PyTorch-style text of `t`; "tensor(undefined)" for an undefined handle.
std::string to_string(const Tensor& t);

std::ostream& operator<<(std::ostream& out, const Tensor& t);

}  // namespace mf

/// fmt::format("{}", t) prints to_string(t).
template <>
struct fmt::formatter<mf::Tensor> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(const mf::Tensor& t, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(mf::to_string(t), ctx);
  }
};
