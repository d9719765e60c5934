// Shapes and strides: sizes are int64 element counts, strides are in elements (not bytes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mf {

using Shape = std::vector<int64_t>;

/// Product of the sizes (1 for a scalar's empty shape).
int64_t shape_numel(std::span<const int64_t> shape);

/// shape_numel for shapes from user input: throws mf::Error on a negative size, or when the element
/// count (times `element_size` bytes) does not fit in int64, where shape_numel would overflow.
int64_t checked_numel(std::span<const int64_t> shape, int64_t element_size = 1);

/// Row-major strides of a contiguous tensor with this shape (non-negative sizes). Throws mf::Error
/// naming the shape when they do not fit int64: when the product of the sizes, each 0 counted as 1,
/// exceeds 2^63 - 1 (so an empty [0, 2^32, 2^32] is refused too).
Shape contiguous_strides(std::span<const int64_t> shape);

/// "[2, 3]"; a scalar prints as "[]".
std::string shape_str(std::span<const int64_t> shape);

/// NumPy broadcasting of two shapes; throws mf::Error naming both when they do not broadcast.
Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b);

/// Whether a tensor of `shape` broadcasts to `target` without changing it: no more dims, and each of
/// its dims (right-aligned) 1 or equal to target's.
bool broadcasts_to(std::span<const int64_t> shape, std::span<const int64_t> target);

/// Maps a possibly negative dim into [0, ndim); throws mf::Error naming the op when out of range.
int64_t normalize_dim(int64_t dim, int64_t ndim);

/// Strides that make a tensor of `shape`/`strides` read as `target` (broadcast: stride 0 on new or size-1 dims).
Shape broadcast_strides(std::span<const int64_t> shape, std::span<const int64_t> strides,
                        std::span<const int64_t> target);

}  // namespace mf
