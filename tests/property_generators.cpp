// Valid random calls for every op of the registry, one generator per op family. Each keeps what the
// op's sample fixes (input count, dtypes, value ranges, attributes such as eps or p) and draws the
// shapes and shape-dependent attributes (dims, k, indices) at random, size-0 and size-1 dims included.
#include "property_support.h"

#include "ops/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mf::props {

int64_t random_size(Rng& rng, int64_t max) {
  int64_t roll = rng.integer(0, 99);
  if (roll < 6) return 0;
  if (roll < 26) return 1;
  return rng.integer(2, max);
}

Shape random_shape(Rng& rng, int64_t min_rank, int64_t max_rank, bool small) {
  Shape shape(static_cast<size_t>(rng.integer(min_rank, max_rank)));
  for (int64_t& size : shape) size = random_size(rng, small ? 3 : 5);
  return shape;
}

int64_t random_alias(Rng& rng, int64_t dim, int64_t rank) { return rank > 0 && rng.chance(0.5) ? dim - rank : dim; }

bool integer_valued(const Tensor& t) {
  if (!is_floating(t.dtype())) return false;
  for (double v : t.to_vector<double>())
    if (std::isfinite(v) && v != std::floor(v)) return false;
  return true;
}

namespace {

/// Range of the finite values of t, or [-2, 2] when it has none.
std::pair<double, double> finite_range(const Tensor& t) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : t.to_vector<double>())
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  return lo <= hi ? std::pair{lo, hi} : std::pair{-2.0, 2.0};
}

bool has_neg_inf(const Tensor& t) {
  if (!is_floating(t.dtype())) return false;
  for (double v : t.to_vector<double>())
    if (v == -std::numeric_limits<double>::infinity()) return true;
  return false;
}

}  // namespace

Tensor draw_like(const Tensor& like, const Shape& shape, Rng& rng) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  auto [lo, hi] = finite_range(like);
  bool integers = like.dtype() == DType::Int64 || like.dtype() == DType::Int8 || integer_valued(like);
  bool masked = has_neg_inf(like);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (double& v : values) {
    if (like.dtype() == DType::Bool) {
      v = rng.chance(0.5) ? 1 : 0;
    } else if (integers) {
      v = static_cast<double>(rng.integer(static_cast<int64_t>(lo), static_cast<int64_t>(hi)));
    } else {
      v = lo + (hi - lo) * static_cast<double>(rng.integer(0, 1 << 30)) / (1 << 30);
      if (masked && rng.chance(0.2)) v = -std::numeric_limits<double>::infinity();
    }
  }
  return reference::make(shape, like.dtype(), values);
}

Tensor random_indices(const Shape& shape, int64_t high, Rng& rng) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (double& v : values) v = static_cast<double>(rng.integer(0, high - 1));
  return reference::make(shape, DType::Int64, values);
}

namespace {

Tensor draw(const Sample& s, size_t k, const Shape& shape, Rng& rng) { return draw_like(s.inputs[k], shape, rng); }

/// Same dtypes and values as the sample, inputs of random shapes (elementwise ops, fills).
Case unary(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 4, small);
  Case c{.inputs = {draw(s, 0, shape, rng)}, .attrs = s.attrs, .gradcheck = s.gradcheck};
  PhiloxStream stream{.seed = rng.seed(), .counter = static_cast<uint64_t>(rng.integer(0, 100))};
  std::visit([&](auto& params) {
    if constexpr (requires { params.stream; }) params.stream = stream;  // the random ops
  }, c.attrs);
  return c;
}

/// n operands that broadcast: each a suffix of one random shape with some dims set to 1.
Case broadcasting(const Sample& s, Rng& rng, bool small) {
  Shape common = random_shape(rng, 0, 4, small);
  Case c{.attrs = s.attrs, .no_grad = s.no_grad_inputs, .gradcheck = s.gradcheck};
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    Shape shape(common.begin() + rng.integer(0, static_cast<int64_t>(common.size())), common.end());
    for (int64_t& size : shape)
      if (rng.chance(0.3)) size = 1;
    c.inputs.push_back(draw(s, k, shape, rng));
  }
  return c;
}

Case masked_fill_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 4, small);
  Shape mask(shape.begin() + rng.integer(0, static_cast<int64_t>(shape.size())), shape.end());
  for (int64_t& size : mask)
    if (rng.chance(0.3)) size = 1;
  return {.inputs = {draw(s, 0, shape, rng), draw(s, 1, mask, rng)}, .attrs = s.attrs, .no_grad = {false, true}};
}

Case arange_case(const Sample& s, Rng& rng, bool) {
  return {.inputs = {draw(s, 0, {random_size(rng, 9)}, rng)}, .attrs = s.attrs};
}

/// A random subset of dims (empty = all), each written as itself or its negative alias.
Shape random_dims(Rng& rng, int64_t rank) {
  Shape dims;
  for (int64_t d = 0; d < rank; ++d)
    if (rng.chance(0.5)) dims.push_back(random_alias(rng, d, rank));
  std::shuffle(dims.begin(), dims.end(), std::mt19937_64(rng.seed()));
  return dims;
}

bool reduces(const Shape& dims, int64_t d, int64_t rank) {
  return dims.empty() || std::any_of(dims.begin(), dims.end(), [&](int64_t e) { return (e + rank) % rank == d; });
}

/// needs_elements: max / min of nothing has no value; variance: no gradcheck where N - correction <= 0
/// makes the result inf or nan.
Case reduction(const Sample& s, Rng& rng, bool small, bool needs_elements, bool variance) {
  Shape shape = random_shape(rng, 0, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  Attrs attrs = s.attrs;
  ReduceParams& reduce = variance ? std::get<VarParams>(attrs) : std::get<ReduceParams>(attrs);
  reduce.dims = random_dims(rng, rank);
  reduce.keepdim = rng.chance(0.5);
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (reduces(reduce.dims, d, rank)) {
      if (needs_elements && shape[d] == 0) shape[d] = rng.integer(1, 3);
      count *= shape[d];
    }
  Case c{.inputs = {draw(s, 0, shape, rng)}, .attrs = attrs, .gradcheck = s.gradcheck};
  if (variance && count <= std::get<VarParams>(attrs).correction) c.gradcheck = false;
  return c;
}

/// One dim of a random shape (rank >= min_rank) whose size is at least 1, for ops along one dim.
std::pair<Shape, int64_t> shape_and_dim(Rng& rng, int64_t min_rank, bool small) {
  Shape shape = random_shape(rng, min_rank, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  int64_t dim = rank == 0 ? 0 : rng.integer(0, rank - 1);
  if (rank > 0 && shape[dim] == 0) shape[dim] = rng.integer(1, 4);
  return {shape, dim};
}

Case along_dim(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 0, small);
  ReduceDimParams params{.dim = random_alias(rng, dim, static_cast<int64_t>(shape.size())), .keepdim = rng.chance(0.5)};
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params, .gradcheck = s.gradcheck};
}

/// A new shape for the same element count: dims merged, split and moved around, maybe one -1.
Shape reshaped(const Shape& shape, Rng& rng) {
  std::vector<int64_t> factors;
  for (int64_t size : shape) {
    for (int64_t f = 2; f <= size; ++f)
      while (size % f == 0 && size > 1) {
        factors.push_back(f);
        size /= f;
      }
    if (size == 0) factors.push_back(0);
  }
  std::shuffle(factors.begin(), factors.end(), std::mt19937_64(rng.seed()));
  Shape out;
  for (int64_t f : factors) {
    if (!out.empty() && rng.chance(0.5))
      out.back() *= f;
    else
      out.push_back(f);
    if (rng.chance(0.2)) out.push_back(1);
  }
  bool zero = std::count(out.begin(), out.end(), 0) > 0;
  if (!out.empty() && !zero && rng.chance(0.3)) out[static_cast<size_t>(rng.integer(0, out.size() - 1))] = -1;
  return out;
}

Case view_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 4, small);
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = ShapeParams{.shape = reshaped(shape, rng)}};
}

Case permute_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  Shape order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(rng.seed()));
  for (int64_t& d : order) d = random_alias(rng, d, rank);
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = PermuteParams{.dims = order}};
}

Case slice_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 1, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  int64_t dim = rng.integer(0, rank - 1), size = shape[dim];
  SliceParams params{.dim = random_alias(rng, dim, rank),
                     .start = rng.integer(-size - 2, size + 2),
                     .end = rng.integer(-size - 2, size + 2),
                     .step = rng.integer(1, 3)};
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params};
}

Case select_case(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 1, small);
  auto rank = static_cast<int64_t>(shape.size());
  SelectParams params{.dim = random_alias(rng, dim, rank),
                      .index = random_alias(rng, rng.integer(0, shape[dim] - 1), shape[dim])};
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params};
}

Case expand_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 3, small);
  Shape target;
  for (int64_t lead = rng.integer(0, 2); lead > 0; --lead) target.push_back(random_size(rng, 3));
  for (int64_t size : shape) target.push_back(size == 1 ? random_size(rng, 4) : (rng.chance(0.3) ? -1 : size));
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = ShapeParams{.shape = target}};
}

Case cat_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 1, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  int64_t dim = rng.integer(0, rank - 1);
  Case c{.attrs = DimParams{.dim = random_alias(rng, dim, rank)}};
  for (int64_t n = rng.integer(1, 3); n > 0; --n) {
    shape[dim] = random_size(rng, 4);
    c.inputs.push_back(draw(s, 0, shape, rng));
  }
  return c;
}

Case index_select_case(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 1, small);
  Shape index_shape = rng.chance(0.2) ? Shape{} : Shape{random_size(rng, 5)};
  return {.inputs = {draw(s, 0, shape, rng), random_indices(index_shape, shape[dim], rng)},
          .attrs = DimParams{.dim = random_alias(rng, dim, static_cast<int64_t>(shape.size()))},
          .no_grad = {false, true}};
}

/// Index shape for gather / scatter_add: at most x's size in every dim but `dim`.
Shape narrower(const Shape& shape, int64_t dim, Rng& rng) {
  Shape index = shape;
  for (size_t d = 0; d < shape.size(); ++d)
    index[d] = static_cast<int64_t>(d) == dim ? random_size(rng, 5) : rng.integer(0, shape[d]);
  return index;
}

Case gather_case(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 1, small);
  Shape index = narrower(shape, dim, rng);
  return {.inputs = {draw(s, 0, shape, rng), random_indices(index, shape[dim], rng)},
          .attrs = DimParams{.dim = random_alias(rng, dim, static_cast<int64_t>(shape.size()))},
          .no_grad = {false, true}};
}

Case scatter_add_case(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 1, small);
  Shape index = narrower(shape, dim, rng), src = index;
  for (int64_t& size : src) size += rng.chance(0.3) ? 1 : 0;
  return {.inputs = {draw(s, 0, shape, rng), random_indices(index, shape[dim], rng), draw(s, 2, src, rng)},
          .attrs = DimParams{.dim = random_alias(rng, dim, static_cast<int64_t>(shape.size()))},
          .no_grad = {false, true, false}};
}

Case topk_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 1, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  int64_t dim = rng.integer(0, rank - 1);
  TopKParams params{.dim = random_alias(rng, dim, rank)};
  params.k = rng.integer(0, shape[dim]);
  params.largest = rng.chance(0.5);
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params, .gradcheck = s.gradcheck};
}

Case sort_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 1, 4, small);
  auto rank = static_cast<int64_t>(shape.size());
  SortParams params{.dim = random_alias(rng, rng.integer(0, rank - 1), rank), .descending = rng.chance(0.5)};
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params, .gradcheck = s.gradcheck};
}

Case cumsum_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 0, 4, small);
  auto rank = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  CumsumParams params{.dim = random_alias(rng, rng.integer(0, rank - 1), rank), .reverse = rng.chance(0.5)};
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = params};
}

/// Weights [N] or [B, N] in [0.1, 1) with some zeros, each row keeping enough nonzero ones for the draws.
Case multinomial_case(const Sample& s, Rng& rng, bool small) {
  MultinomialParams params = std::get<MultinomialParams>(s.attrs);
  params.replacement = rng.chance(0.5);
  int64_t categories = rng.integer(1, small ? 4 : 7), rows = rng.integer(0, 3);
  params.num_samples = rng.integer(1, params.replacement ? 6 : categories);
  params.stream = {.seed = rng.seed(), .counter = static_cast<uint64_t>(rng.integer(0, 100))};
  Shape shape = rng.chance(0.3) ? Shape{categories} : Shape{rows, categories};
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t row = 0; row < values.size(); row += static_cast<size_t>(categories)) {
    int64_t zeros = rng.integer(0, categories - (params.replacement ? 1 : params.num_samples));
    for (int64_t j = 0; j < categories; ++j)
      values[row + static_cast<size_t>(j)] = j < zeros ? 0.0 : 0.1 + 0.9 * static_cast<double>(rng.integer(0, 999)) / 1000;
    std::shuffle(values.begin() + static_cast<std::ptrdiff_t>(row),
                 values.begin() + static_cast<std::ptrdiff_t>(row) + categories, std::mt19937_64(rng.seed()));
  }
  // Not expandable: a stride-0 category dim would repeat a row's first weight, maybe a zero.
  return {.inputs = {reference::make(shape, s.inputs[0].dtype(), values)}, .attrs = params, .expandable = false};
}

Case one_hot_case(const Sample&, Rng& rng, bool small) {
  int64_t classes = rng.integer(1, 6);
  return {.inputs = {random_indices(random_shape(rng, 0, 3, small), classes, rng)},
          .attrs = OneHotParams{.num_classes = classes}};
}

Case triangle_case(const Sample& s, Rng& rng, bool small) {
  Shape shape = random_shape(rng, 2, 4, small);
  int64_t rows = shape[shape.size() - 2], cols = shape.back();
  int64_t k =
      rng.chance(0.1)
          ? rng.pick(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()})
          : rng.integer(-rows - 2, cols + 2);
  return {.inputs = {draw(s, 0, shape, rng)}, .attrs = TriangleParams{.diagonal = k}};
}

Case matmul_case(const Sample& s, Rng& rng, bool small) {
  Shape batch = random_shape(rng, 0, 2, small);
  int64_t n = random_size(rng, 4), k = random_size(rng, 4), m = random_size(rng, 4);
  auto operand = [&](int64_t rows, int64_t cols) {
    Shape shape(batch.begin() + rng.integer(0, static_cast<int64_t>(batch.size())), batch.end());
    for (int64_t& size : shape)
      if (rng.chance(0.3)) size = 1;
    shape.push_back(rows);
    shape.push_back(cols);
    return shape;
  };
  return {.inputs = {draw(s, 0, operand(n, k), rng), draw(s, 1, operand(k, m), rng)}};
}

Case linear_case(const Sample& s, Rng& rng, bool small) {
  Shape x_shape = random_shape(rng, 0, 2, small);
  int64_t k = random_size(rng, 4), m = random_size(rng, 4);
  x_shape.push_back(k);
  return {.inputs = {draw(s, 0, x_shape, rng), draw(s, 1, {m, k}, rng), draw(s, 2, {m}, rng)}};
}

/// x [..., k], values [m, k] (int8), scales and bias [m].
Case linear_int8_case(const Sample& s, Rng& rng, bool small) {
  Shape x_shape = random_shape(rng, 0, 2, small);
  int64_t k = random_size(rng, 4), m = random_size(rng, 4);
  x_shape.push_back(k);
  return {.inputs = {draw(s, 0, x_shape, rng), draw(s, 1, {m, k}, rng), draw(s, 2, {m}, rng), draw(s, 3, {m}, rng)}};
}

Case softmax_case(const Sample& s, Rng& rng, bool small) {
  auto [shape, dim] = shape_and_dim(rng, 0, small);
  Case c{.inputs = {draw(s, 0, shape, rng)},
         .attrs = DimParams{.dim = random_alias(rng, dim, static_cast<int64_t>(shape.size()))}};
  // Logits near +-1000 make log_softmax's outputs so large that finite differences lose their last
  // digits to rounding: those samples check the forward only.
  auto [lo, hi] = finite_range(s.inputs[0]);
  c.gradcheck = !has_neg_inf(s.inputs[0]) && s.gradcheck && std::max(-lo, hi) < 100;
  return c;
}

/// x [*lead, *norm], weight and bias [*norm].
std::pair<Shape, Shape> layer_norm_shapes(Rng& rng, bool small) {
  Shape norm(static_cast<size_t>(rng.integer(1, 2)));
  for (int64_t& size : norm) size = rng.integer(1, small ? 3 : 4);
  Shape x = random_shape(rng, 0, 2, small);
  x.insert(x.end(), norm.begin(), norm.end());
  return {x, norm};
}

/// Layer norm's derivatives grow as rstd^3: rows of several nearly equal values (rstd near
/// 1 / sqrt(eps)) leave finite differences no digits, so gradcheck skips them.
bool well_conditioned(const Tensor& x, const Tensor& weight, const LayerNormParams& params) {
  if (shape_numel(params.normalized_shape) == 1) return true;  // x - mean is exactly 0: nothing to lose
  Tensor rstd = registry()[OpId::layer_norm].reference({x, weight, weight}, params)[2];
  for (double r : rstd.to_vector<double>())
    if (r > 5) return false;
  return true;
}

Case layer_norm_case(const Sample& s, Rng& rng, bool small) {
  auto [x_shape, norm] = layer_norm_shapes(rng, small);
  LayerNormParams params = std::get<LayerNormParams>(s.attrs);
  params.normalized_shape = norm;
  Tensor x = draw(s, 0, x_shape, rng), w = draw(s, 1, norm, rng);
  return {.inputs = {x, w, draw(s, 2, norm, rng)}, .attrs = params, .gradcheck = well_conditioned(x, w, params)};
}

Case layer_norm_backward_case(const Sample& s, Rng& rng, bool small) {
  auto [x_shape, norm] = layer_norm_shapes(rng, small);
  LayerNormParams params = std::get<LayerNormParams>(s.attrs);
  params.normalized_shape = norm;
  Tensor x = draw(s, 1, x_shape, rng), w = draw(s, 4, norm, rng);
  std::vector<Tensor> forward = registry()[OpId::layer_norm].reference({x, w, w}, params);  // mean, rstd
  Shape stats = forward[1].shape();
  // Not expandable: repeating values of x alone would leave mean and rstd describing another x, and
  // with rows of one element (rstd = 1 / sqrt(eps)) finite differences then lose every digit.
  return {.inputs = {draw(s, 0, x_shape, rng), x, forward[1], forward[2], w, draw(s, 5, stats, rng),
                     draw(s, 6, stats, rng)},
          .attrs = params,
          .gradcheck = well_conditioned(x, w, params),
          .expandable = false};
}

Case embedding_case(const Sample& s, Rng& rng, bool small) {
  int64_t rows = rng.integer(1, 6), width = random_size(rng, 4);
  EmbeddingParams params = std::get<EmbeddingParams>(s.attrs);
  if (params.padding_idx >= 0) params.padding_idx = rng.integer(0, rows - 1);
  // The padding row withholds the gradient its forward use implies (PyTorch's padding_idx).
  return {.inputs = {draw(s, 0, {rows, width}, rng), random_indices(random_shape(rng, 0, 3, small), rows, rng)},
          .attrs = params,
          .no_grad = {false, true},
          .gradcheck = params.padding_idx < 0};
}

Case embedding_backward_case(const Sample& s, Rng& rng, bool small) {
  int64_t rows = rng.integer(1, 6), width = random_size(rng, 4);
  Shape ids = random_shape(rng, 0, 3, small), dout = ids;
  dout.push_back(width);
  EmbeddingBackwardParams params = std::get<EmbeddingBackwardParams>(s.attrs);
  params.num_embeddings = rows;
  params.padding_idx = rng.chance(0.5) ? rng.integer(0, rows - 1) : -1;
  return {.inputs = {draw(s, 0, dout, rng), random_indices(ids, rows, rng)}, .attrs = params, .no_grad = {false, true}};
}

/// Targets in [0, classes), some set to ignore_index.
Tensor targets(int64_t rows, int64_t classes, int64_t ignore_index, Rng& rng) {
  std::vector<double> values;
  for (int64_t n = 0; n < rows; ++n)
    values.push_back(static_cast<double>(rng.chance(0.2) ? ignore_index : rng.integer(0, classes - 1)));
  return reference::make({rows}, DType::Int64, values);
}

Case cross_entropy_case(const Sample& s, Rng& rng, bool small) {
  int64_t rows = random_size(rng, small ? 3 : 5), classes = rng.integer(1, 6);
  return {.inputs = {draw(s, 0, {rows, classes}, rng),
                     targets(rows, classes, std::get<CrossEntropyParams>(s.attrs).ignore_index, rng)},
          .attrs = s.attrs,
          .no_grad = {false, true}};
}

Case cross_entropy_backward_case(const Sample& s, Rng& rng, bool small) {
  int64_t rows = random_size(rng, small ? 3 : 5), classes = rng.integer(1, 6);
  int64_t ignore_index = std::get<CrossEntropyParams>(s.attrs).ignore_index;
  Tensor logits = draw(s, 1, {rows, classes}, rng), target = targets(rows, classes, ignore_index, rng);
  Tensor lse = registry()[OpId::cross_entropy].reference({logits, target}, s.attrs)[1];  // as the forward gives it
  // Not expandable: an expanded layout repeats the logits' first row or column, and lse, computed
  // before, would no longer be their log-sum-exp (large logits then overflow float32's exp).
  return {.inputs = {draw(s, 0, {rows}, rng), logits, target, lse, draw(s, 4, {rows}, rng)},
          .attrs = s.attrs,
          .expandable = false};
}

/// q [B, H, T, D], k and v [B, H, S, D] (D >= 1), drawn like sample inputs first..first + 2,
/// and a mask broadcasting to [B, H, T, S] drawn like q. Not like the samples' masks: their -1e9
/// entries, drawn anywhere in [-1e9, 0], would swamp the scores' last digits in float32 and the
/// finite differences' steps in float64, in the composition of ops as much as in the fused op.
std::vector<Tensor> attention_operands(const Sample& s, size_t first, Rng& rng, bool small) {
  int64_t B = random_size(rng, 3), H = random_size(rng, 3), T = random_size(rng, small ? 3 : 4),
          S = random_size(rng, small ? 3 : 5), D = rng.integer(1, small ? 3 : 4);
  Shape weights{B, H, T, S};
  Shape mask(weights.begin() + rng.integer(0, 4), weights.end());
  for (int64_t& size : mask)
    if (rng.chance(0.3)) size = 1;
  return {draw(s, first, {B, H, T, D}, rng), draw(s, first + 1, {B, H, S, D}, rng),
          draw(s, first + 2, {B, H, S, D}, rng), draw(s, first, mask, rng)};
}

/// A fresh Philox stream where the sample drops weights.
DropoutParams attention_params(const Sample& s, Rng& rng) {
  DropoutParams params = std::get<DropoutParams>(s.attrs);
  if (params.p > 0) {
    params.stream.seed = rng.seed();
    params.stream.counter = static_cast<uint64_t>(rng.integer(0, 100));
  }
  return params;
}

Case attention_case(const Sample& s, Rng& rng, bool small) {
  return {.inputs = attention_operands(s, 0, rng, small),
          .attrs = attention_params(s, rng),
          .no_grad = {false, false, false, true}};
}

Case attention_backward_case(const Sample& s, Rng& rng, bool small) {
  DropoutParams params = attention_params(s, rng);
  std::vector<Tensor> operands = attention_operands(s, 2, rng, small);  // q, k, v, mask
  const Tensor &q = operands[0], &k = operands[1];
  Tensor weights = registry()[OpId::attention].reference(operands, params)[1];
  Shape dout{q.size(0), q.size(2), q.size(1), q.size(3)};
  Tensor dweights = rng.chance(0.5) ? draw(s, 0, weights.shape(), rng) : Tensor::empty({0}, q.dtype());
  return {.inputs = {draw(s, 0, dout, rng), dweights, q, k, operands[2], weights}, .attrs = params};
}

}  // namespace

ValidGenerator valid_generator(OpId id) {
  using enum OpId;
  switch (id) {
    case neg:
    case abs:
    case exp:
    case log:
    case sqrt:
    case rsqrt:
    case relu:
    case gelu:
    case gelu_tanh:
    case tanh:
    case sigmoid:
    case clamp:
    case pow_scalar:
    case logical_not:
    case cast:
    case copy:
    case to_device:
    case dropout: return unary;
    case fill:
    case uniform:
    case normal:
    case bernoulli: {
      // Outputs written through a stride-0 view would alias: the fills write distinct elements.
      return [](const Sample& s, Rng& rng, bool small) {
        Case c = unary(s, rng, small);
        c.expandable = false;
        return c;
      };
    }
    case arange:
    case randperm:
      return [](const Sample& s, Rng& rng, bool small) {
        Case c = arange_case(s, rng, small);
        c.expandable = false;
        return c;
      };
    case add:
    case sub:
    case mul:
    case div:
    case pow:
    case relu_backward:
    case gelu_backward:
    case gelu_tanh_backward:
    case eq:
    case ne:
    case lt:
    case le:
    case gt:
    case ge:
    case logical_and:
    case logical_or:
    case where: return broadcasting;
    case masked_fill: return masked_fill_case;
    case sum:
    case mean: return [](const Sample& s, Rng& rng, bool small) { return reduction(s, rng, small, false, false); };
    case var: return [](const Sample& s, Rng& rng, bool small) { return reduction(s, rng, small, false, true); };
    case amax:
    case amin: return [](const Sample& s, Rng& rng, bool small) { return reduction(s, rng, small, true, false); };
    case max_dim:
    case min_dim:
    case argmax: return along_dim;
    case view: return view_case;
    case permute: return permute_case;
    case slice: return slice_case;
    case select: return select_case;
    case expand: return expand_case;
    case cat: return cat_case;
    case index_select: return index_select_case;
    case gather: return gather_case;
    case scatter_add: return scatter_add_case;
    case topk:
    case log_softmax_topk: return topk_case;
    case sort: return sort_case;
    case cumsum: return cumsum_case;
    case multinomial: return multinomial_case;
    case one_hot: return one_hot_case;
    case tril:
    case triu: return triangle_case;
    case matmul: return matmul_case;
    case linear:
    case linear_relu: return linear_case;
    case linear_int8: return linear_int8_case;
    case softmax:
    case log_softmax: return softmax_case;
    case layer_norm: return layer_norm_case;
    case layer_norm_backward: return layer_norm_backward_case;
    case embedding: return embedding_case;
    case embedding_backward: return embedding_backward_case;
    case cross_entropy: return cross_entropy_case;
    case cross_entropy_backward: return cross_entropy_backward_case;
    case attention: return attention_case;
    case attention_backward: return attention_backward_case;
  }
  return {};
}

}  // namespace mf::props
