#include "core/shape.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace mf {

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t size : shape) n *= size;
  return n;
}

int64_t checked_numel(std::span<const int64_t> shape, int64_t element_size) {
  for (int64_t size : shape) MF_CHECK(size >= 0, "negative size in shape {}", shape_str(shape));
  // The product with zeros read as ones is what contiguous_strides multiplies out: it must fit even
  // for an empty tensor.
  int64_t extent = 1, bytes = 0;
  bool overflow = false;
  for (int64_t size : shape) overflow |= __builtin_mul_overflow(extent, std::max<int64_t>(size, 1), &extent);
  MF_CHECK(!overflow, "shape {} has too many elements (their count does not fit in 64 bits)", shape_str(shape));
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  MF_CHECK(!__builtin_mul_overflow(extent, element_size, &bytes),
           "shape {} has too many elements (its size in bytes does not fit in 64 bits)", shape_str(shape));
  return extent;
}

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    // Sizes of 0 leave the other dims free, so an empty tensor can still claim strides past int64.
    MF_CHECK(!__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride),
             "shape {} is too large: its strides overflow int64", shape_str(shape));
  }
  return strides;
}

std::string shape_str(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b) {
  size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    int64_t sa = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    int64_t sb = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    MF_CHECK(sa == sb || sa == 1 || sb == 1, "shapes {} and {} do not broadcast (dim {}: {} vs {})", shape_str(a),
             shape_str(b), i, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

bool broadcasts_to(std::span<const int64_t> shape, std::span<const int64_t> target) {
  if (shape.size() > target.size()) return false;
  size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1 && shape[i] != target[lead + i]) return false;
  return true;
}

int64_t normalize_dim(int64_t dim, int64_t ndim) {
  int64_t bound = std::max<int64_t>(ndim, 1);  // a scalar accepts dim 0 and -1, as in PyTorch
  MF_CHECK(dim >= -bound && dim < bound, "dim {} is out of range for a tensor with {} dims", dim, ndim);
  return dim < 0 ? dim + bound : dim;
}

Shape broadcast_strides(std::span<const int64_t> shape, std::span<const int64_t> strides,
                        std::span<const int64_t> target) {
  Shape out(target.size(), 0);
  size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) out[lead + i] = shape[i] == 1 ? 0 : strides[i];
  return out;
}

}  // namespace mf
