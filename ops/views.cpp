// View ops: new shapes and strides over the same storage, no copies, no kernels. Their backward rules
// route the gradient back into the input's layout.
#include "core/graph.h"
#include "ops/families.h"
#include "ops/functional.h"
#include "ops/reference.h"

#include <algorithm>
#include <numeric>

namespace mf {
namespace {

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(base.storage(), std::move(shape), std::move(strides), offset,
                                             base.dtype()));
}

/// Resolves one -1 entry and checks the element count.
Shape infer_view_shape(const Shape& requested, int64_t numel) {
  Shape shape = requested, sizes = requested;  // sizes: the -1 entry as 1
  auto wildcard = shape.end();
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    if (*it == -1) {
      MF_CHECK(wildcard == shape.end(), "shape {} has more than one -1", shape_str(requested));
      wildcard = it;
      sizes[static_cast<size_t>(it - shape.begin())] = 1;
    } else {
      MF_CHECK(*it >= 0, "shape {} has a negative size", shape_str(requested));
    }
  }
  int64_t known = checked_numel(sizes);
  if (wildcard != shape.end()) {
    MF_CHECK(known != 0 && numel % known == 0, "shape {} is invalid for {} elements", shape_str(requested), numel);
    *wildcard = numel / known;
  } else {
    MF_CHECK(known == numel, "shape {} is invalid for {} elements", shape_str(requested), numel);
  }
  return shape;
}

/// Strides that let `shape` view a tensor of old shape/strides, if any exist (PyTorch's computeStride):
/// each run of old dims that is contiguous in memory may be re-split freely.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (shape_numel(old_shape) <= 1) return contiguous_strides(shape);  // no layout to preserve
  Shape strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride);
    if (chunk_ends) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

// ---- view ---------------------------------------------------------------------------------------

Tensor view_view(const Tensor& x, const Attrs& attrs) {
  const Shape& requested = std::get<ShapeParams>(attrs).shape;
  Shape shape = infer_view_shape(requested, x.numel());
  std::optional<Shape> strides = view_strides(x.shape(), x.strides(), shape);
  MF_CHECK(strides.has_value(), "shape {} cannot view a tensor of shape {} with strides {} without a copy "
           "(use reshape)", shape_str(requested), shape_str(x.shape()), shape_str(x.strides()));
  return make_view(x, shape, *strides, x.offset());
}

std::vector<Tensor> view_backward(const GradContext& ctx) { return {ctx.grads[0].reshape(ctx.inputs[0].shape())}; }

std::vector<Tensor> reference_view(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape shape = infer_view_shape(std::get<ShapeParams>(attrs).shape, in[0].numel());
  return {reference::make(shape, in[0].dtype(), in[0].to_vector<double>())};
}

// ---- permute ------------------------------------------------------------------------------------

Shape checked_permutation(const Shape& dims, int64_t ndim) {
  MF_CHECK(static_cast<int64_t>(dims.size()) == ndim, "permutation {} has {} entries for a tensor with {} dims",
           shape_str(dims), dims.size(), ndim);
  Shape normalized;
  for (int64_t d : dims) normalized.push_back(normalize_dim(d, ndim));
  Shape sorted = normalized;
  std::sort(sorted.begin(), sorted.end());
  MF_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "permutation {} repeats a dim",
           shape_str(dims));
  return normalized;
}

Tensor view_permute(const Tensor& x, const Attrs& attrs) {
  Shape order = checked_permutation(std::get<PermuteParams>(attrs).dims, x.dim());
  Shape shape, strides;
  for (int64_t d : order) {
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  return make_view(x, shape, strides, x.offset());
}

std::vector<Tensor> permute_backward(const GradContext& ctx) {
  const Shape& dims = std::get<PermuteParams>(ctx.attrs).dims;
  Shape order = checked_permutation(dims, static_cast<int64_t>(dims.size()));
  Shape inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return {ctx.grads[0].permute(inverse)};
}

std::vector<Tensor> reference_permute(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape order = checked_permutation(std::get<PermuteParams>(attrs).dims, in[0].dim());
  Shape shape;
  for (int64_t d : order) shape.push_back(in[0].shape()[d]);
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape source(index.size());
    for (size_t i = 0; i < order.size(); ++i) source[order[i]] = index[i];
    values.push_back(in[0].at<double>(source));
  });
  return {reference::make(shape, in[0].dtype(), values)};
}

// ---- slice (dim, start, end, step) --------------------------------------------------------------

struct SliceRange {
  int64_t dim, start, length, step;
};

SliceRange checked_slice(const Tensor& x, const Attrs& attrs) {
  MF_CHECK(x.dim() > 0, "cannot slice a 0-dim tensor");
  const SliceParams& slice = std::get<SliceParams>(attrs);
  int64_t dim = normalize_dim(slice.dim, x.dim()), size = x.shape()[dim];
  MF_CHECK(slice.step > 0, "step must be positive, got {}", slice.step);
  auto clamp_index = [&](int64_t i) { return std::clamp(i < 0 ? i + size : i, int64_t{0}, size); };
  int64_t start = clamp_index(slice.start), end = std::max(start, clamp_index(slice.end));
  // Not (end - start + step - 1) / step, which overflows for a step near INT64_MAX.
  return {dim, start, end > start ? (end - start - 1) / slice.step + 1 : 0, slice.step};
}

Tensor view_slice(const Tensor& x, const Attrs& attrs) {
  SliceRange range = checked_slice(x, attrs);
  Shape shape = x.shape(), strides = x.strides();
  shape[range.dim] = range.length;
  if (range.length > 1) strides[range.dim] *= range.step;  // then step < size: no overflow
  return make_view(x, shape, strides, x.offset() + range.start * x.strides()[range.dim]);
}

// The input's gradient is zero outside the window. Where the engine already holds a gradient summed
// for the input (another chunk of a split, such as attention's q, k and v), this one is added into
// that sum's window in place: no zeroed input-sized tensor and no input-sized add per chunk.
std::vector<Tensor> slice_backward(const GradContext& ctx) {
  bool into_sum = ctx.sums[0].defined();
  Tensor dinp = into_sum ? ctx.sums[0] : zeros(ctx.inputs[0].shape(), ctx.grads[0].dtype(), ctx.grads[0].device());
  Tensor window = call1<OpId::slice>({dinp}, std::get<SliceParams>(ctx.attrs), ctx.site);
  if (into_sum)
    window.add_(ctx.grads[0]);
  else
    window.copy_(ctx.grads[0]);
  return {dinp};
}

std::vector<Tensor> reference_slice(const std::vector<Tensor>& in, const Attrs& attrs) {
  SliceRange range = checked_slice(in[0], attrs);
  Shape shape = in[0].shape();
  shape[range.dim] = range.length;
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape source = index;
    source[range.dim] = range.start + index[range.dim] * range.step;
    values.push_back(in[0].at<double>(source));
  });
  return {reference::make(shape, in[0].dtype(), values)};
}

// ---- select (dim, index) ----------------------------------------------------------------------

Tensor view_select(const Tensor& x, const Attrs& attrs) {
  MF_CHECK(x.dim() > 0, "cannot select from a 0-dim tensor");
  const SelectParams& select = std::get<SelectParams>(attrs);
  int64_t dim = normalize_dim(select.dim, x.dim()), size = x.shape()[dim];
  int64_t index = select.index < 0 ? select.index + size : select.index;
  MF_CHECK(index >= 0 && index < size, "index {} is out of range for dim {} of size {} (shape {})", select.index, dim,
           size, shape_str(x.shape()));
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return make_view(x, shape, strides, x.offset() + index * x.strides()[dim]);
}

std::vector<Tensor> select_backward(const GradContext& ctx) {
  Tensor dinp = zeros(ctx.inputs[0].shape(), ctx.grads[0].dtype(), ctx.grads[0].device());
  call1<OpId::select>({dinp}, std::get<SelectParams>(ctx.attrs), ctx.site).copy_(ctx.grads[0]);
  return {dinp};
}

std::vector<Tensor> reference_select(const std::vector<Tensor>& in, const Attrs& attrs) {
  const SelectParams& select = std::get<SelectParams>(attrs);
  int64_t dim = normalize_dim(select.dim, in[0].dim());
  int64_t index = select.index < 0 ? select.index + in[0].shape()[dim] : select.index;
  Shape shape = in[0].shape();
  shape.erase(shape.begin() + dim);
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& out_index) {
    Shape source = out_index;
    source.insert(source.begin() + dim, index);
    values.push_back(in[0].at<double>(source));
  });
  return {reference::make(shape, in[0].dtype(), values)};
}

// ---- expand -------------------------------------------------------------------------------------

Tensor view_expand(const Tensor& x, const Attrs& attrs) {
  const Shape& target = std::get<ShapeParams>(attrs).shape;
  MF_CHECK(target.size() >= x.shape().size(), "cannot expand shape {} to fewer dims {}", shape_str(x.shape()),
           shape_str(target));
  size_t lead = target.size() - x.shape().size();
  Shape shape(target.size()), strides(target.size(), 0);
  for (size_t d = 0; d < target.size(); ++d) {
    int64_t own = d < lead ? 1 : x.shape()[d - lead];
    int64_t want = target[d] == -1 ? own : target[d];
    MF_CHECK(d >= lead || target[d] != -1, "-1 is not allowed for the new leading dim {} in {}", d,
             shape_str(target));
    MF_CHECK(want >= 0, "cannot expand shape {} to {} (dim {}: negative size {})", shape_str(x.shape()),
             shape_str(target), d, want);
    MF_CHECK(own == want || own == 1, "cannot expand shape {} to {} (dim {}: {} vs {})", shape_str(x.shape()),
             shape_str(target), d, own, want);
    shape[d] = want;
    if (d >= lead && own == want) strides[d] = x.strides()[d - lead];
  }
  checked_numel(shape);  // every later numel() of the view must not overflow
  return make_view(x, shape, strides, x.offset());
}

// The engine sums the gradient back to the input's shape.
std::vector<Tensor> expand_backward(const GradContext& ctx) { return {ctx.grads[0]}; }

std::vector<Tensor> reference_expand(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape shape = view_expand(in[0], attrs).shape();
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    values.push_back(reference::value_at_broadcast(in[0], index));
  });
  return {reference::make(shape, in[0].dtype(), values)};
}

}  // namespace

void register_view_ops(Registry& r) {
  r.define(OpId::view, {.name = "view", .view = view_view, .backward = view_backward, .samples = [] {
    return std::vector<Sample>{
        {"merge dims", {reference::randn({2, 3, 4}, 31)}, ShapeParams{.shape = {6, 4}}},
        {"split with -1", {reference::randn({6, 4}, 32)}, ShapeParams{.shape = {2, -1, 2}}},
        {"to scalar", {reference::randn({1, 1}, 33)}, ShapeParams{.shape = {}}},
    };
  }, .reference = reference_view});
  r.define(OpId::permute, {.name = "permute", .view = view_permute, .backward = permute_backward, .samples = [] {
    return std::vector<Sample>{
        {"transpose", {reference::randn({3, 4}, 34)}, PermuteParams{.dims = {1, 0}}},
        {"3-d", {reference::randn({2, 3, 4}, 35)}, PermuteParams{.dims = {2, 0, -2}}},
    };
  }, .reference = reference_permute});
  r.define(OpId::slice,
           {.name = "slice",
            .view = view_slice,
            .backward = slice_backward,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"narrow", {reference::randn({5, 4}, 36)}, SliceParams{.dim = 0, .start = 1, .end = 4}},
                      {"step 2, negative start",
                       {reference::randn({3, 7}, 37)},
                       SliceParams{.dim = -1, .start = -6, .end = 7, .step = 2}},
                  };
                },
            .reference = reference_slice});
  r.define(OpId::select, {.name = "select", .view = view_select, .backward = select_backward, .samples = [] {
    return std::vector<Sample>{
        {"row", {reference::randn({4, 3}, 38)}, SelectParams{.dim = 0, .index = 2}},
        {"negative index", {reference::randn({2, 3, 4}, 39)}, SelectParams{.dim = 2, .index = -1}},
    };
  }, .reference = reference_select});
  r.define(OpId::expand, {.name = "expand", .view = view_expand, .backward = expand_backward, .samples = [] {
    return std::vector<Sample>{
        {"size-1 dim", {reference::randn({3, 1}, 40)}, ShapeParams{.shape = {3, 4}}},
        {"new leading dims", {reference::randn({4}, 41)}, ShapeParams{.shape = {2, 3, -1}}},
    };
  }, .reference = reference_expand});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor Tensor::view(const Shape& shape, Site site) const { return call1<OpId::view>({*this}, {.shape = shape}, site); }

Tensor Tensor::reshape(const Shape& shape, Site site) const {
  Shape target = infer_view_shape(shape, numel());
  if (view_strides(this->shape(), strides(), target)) return view(target, site);
  return clone(site).view(target, site);
}

Tensor Tensor::permute(const Shape& dims, Site site) const {
  return call1<OpId::permute>({*this}, {.dims = dims}, site);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1, Site site) const {
  Shape order(static_cast<size_t>(dim()));
  std::iota(order.begin(), order.end(), 0);
  try {
    std::swap(order[normalize_dim(dim0, dim())], order[normalize_dim(dim1, dim())]);
  } catch (const Error& error) {
    fail("transpose: {} (shape {}) at {}", error.what(), shape_str(shape()), format_location(site));
  }
  return permute(order, site);
}

Tensor Tensor::t(Site site) const {
  if (dim() < 2) return *this;
  MF_CHECK(dim() == 2, "t: expects a tensor with at most 2 dims, got shape {} at {}", shape_str(shape()),
           format_location(site));
  return transpose(0, 1, site);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length, Site site) const {
  MF_CHECK(length >= 0 && start >= -size(dim) && start + (start < 0 ? size(dim) : 0) + length <= size(dim),
           "narrow: start {} + length {} exceeds dim {} of size {} at {}", start, length, dim, size(dim),
           format_location(site));
  int64_t begin = start < 0 ? start + size(dim) : start;
  return slice(dim, begin, begin + length, 1, site);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step, Site site) const {
  return call1<OpId::slice>({*this}, {.dim = dim, .start = start, .end = end, .step = step}, site);
}

Tensor Tensor::select(int64_t dim, int64_t index, Site site) const {
  return call1<OpId::select>({*this}, {.dim = dim, .index = index}, site);
}

Tensor Tensor::operator[](IndexAt index) const { return select(0, index.index, index.site); }

Tensor Tensor::expand(const Shape& shape, Site site) const {
  return call1<OpId::expand>({*this}, {.shape = shape}, site);
}

Tensor Tensor::squeeze(std::optional<int64_t> dim, Site site) const {
  Shape shape;
  std::optional<int64_t> only;
  if (dim) only = normalize_dim(*dim, this->dim());
  for (int64_t d = 0; d < this->dim(); ++d)
    if (this->shape()[d] != 1 || (only && *only != d)) shape.push_back(this->shape()[d]);
  return view(shape, site);
}

Tensor Tensor::unsqueeze(int64_t dim, Site site) const {
  int64_t position = normalize_dim(dim, this->dim() + 1);
  Shape shape = this->shape();
  shape.insert(shape.begin() + position, 1);
  return reshape(shape, site);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim, Site site) const {
  if (dim() == 0) return reshape({1}, site);
  int64_t first = normalize_dim(start_dim, dim()), last = normalize_dim(end_dim, dim());
  MF_CHECK(first <= last, "flatten: start_dim {} is after end_dim {} at {}", start_dim, end_dim, format_location(site));
  Shape shape(this->shape().begin(), this->shape().begin() + first);
  shape.push_back(shape_numel(std::span(this->shape()).subspan(first, last - first + 1)));
  shape.insert(shape.end(), this->shape().begin() + last + 1, this->shape().end());
  return reshape(shape, site);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim, Site site) {
  MF_CHECK(split_size > 0, "split: split_size must be positive, got {} at {}", split_size, format_location(site));
  std::vector<Tensor> parts;
  int64_t size = x.size(dim);
  for (int64_t start = 0; start < size; start += split_size)
    parts.push_back(x.slice(dim, start, std::min(size, start + split_size), 1, site));
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim, Site site) {
  MF_CHECK(chunks > 0, "chunk: chunks must be positive, got {} at {}", chunks, format_location(site));
  return split(x, std::max<int64_t>(1, (x.size(dim) + chunks - 1) / chunks), dim, site);
}

}  // namespace mf
