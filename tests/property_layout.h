// Random memory layouts for the property suite: the same logical values reached through a permuted,
// step-sliced, offset window of a larger buffer, and through stride-0 expanded dims.
#pragma once

#include "property_support.h"

#include <string>
#include <vector>

namespace mf::props {

/// How one input is laid out. Dims listed in `expanded` hold one value repeated (stride 0).
struct Recipe {
  std::vector<bool> expanded;  // per logical dim
  Shape order;                 // buffer dim i holds logical dim order[i]
  Shape step, offset;          // per buffer dim
};

/// An input laid out by a recipe: `view` over `buffer`, whose other elements hold junk (NaN, or
/// values out of every index range), so that a kernel reading outside the view shows.
struct Laid {
  Tensor buffer;
  Tensor view;
};

/// A random recipe for `shape`; `expand` allows stride-0 dims, `slice` steps and offsets.
Recipe random_recipe(const Shape& shape, Rng& rng, bool expand, bool slice);
/// The values `x` takes under the recipe: index 0 repeated along the expanded dims.
Tensor collapsed(const Tensor& x, const Recipe& recipe);
/// `x` (already collapsed) laid out by the recipe.
Laid lay_out(const Tensor& x, const Recipe& recipe);
/// The view the recipe makes of a buffer (the same steps lay_out takes), for gradcheck's leaves.
Tensor view_of_buffer(const Tensor& buffer, const Recipe& recipe, const Shape& shape);
/// "[2, 3] strides [1, 2] offset 4 float32" for failure messages.
std::string describe(const Tensor& t);
/// Empty when `actual` matches `expected` (shape, dtype, |a - e| <= atol + rtol |e|, equal
/// infinities and NaNs, exact for integers and bools), else what differs.
std::string mismatch(const Tensor& actual, const Tensor& expected, double rtol, double atol);
/// Whether two tensors hold bit-identical values (NaN equal to NaN).
bool same_values(const Tensor& a, const Tensor& b);

}  // namespace mf::props
