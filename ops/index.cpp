// Indexing and joining: cat, index_select, gather, scatter_add, topk, log_softmax_topk, sort, cumsum, one_hot,
// tril and triu.
//
// Kernels read their inputs through their own strides (one_hot aside), using one row walker: a
// shape is visited one row (last dim) at a time, each operand's offset found from its strides.
// Index values are data, so their range check happens in the kernel, serially and before any write,
// so the error names the first bad value whatever the thread count (where the output is empty, no
// kernel runs, and the front checks them instead). Outputs are written (=);
// scatter_add accumulates (+=) into its copy of x.
#include "ops/families.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"
#include "ops/cpu/softmax_row.h"
#include "ops/functional.h"
#include "ops/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <span>

namespace mf {
namespace {

// ---- shared helpers -----------------------------------------------------------------------------

/// Visits `shape` (at least 1-D, non-empty) one row of its last dim at a time, calling
/// row(offsets, r) with each operand's element offset at the start of row r; along the row, operand
/// k advances by strides[k].back(). Rows go to threads in blocks of `block` consecutive rows (block
/// divides the row count), and each block runs in order on one thread. `cost` is the work per
/// element, in elements moved, for sizing the chunks.
template <size_t N, typename Row>
void for_each_row(const Shape& shape, const std::array<Shape, N>& strides, int64_t block, Row&& row,
                  int64_t cost = 1) {
  int64_t n = shape.back(), rows = shape_numel(shape) / n;
  size_t outer_dims = shape.size() - 1;
  int64_t grain = std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(n * block * cost, 1));
  parallel_for(0, rows / block, grain, [&](int64_t block_begin, int64_t block_end) {
    Shape index(outer_dims, 0);
    int64_t rest = block_begin * block;
    for (size_t d = outer_dims; d-- > 0;) {
      index[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (int64_t r = block_begin * block; r < block_end * block; ++r) {
      std::array<int64_t, N> offsets{};
      for (size_t d = 0; d < outer_dims; ++d)
        for (size_t k = 0; k < N; ++k) offsets[k] += index[d] * strides[k][d];
      row(offsets, r);
      for (size_t d = outer_dims; d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
  });
}

/// The first value of an int64 tensor (any strides) outside [0, size), if any.
std::optional<int64_t> first_out_of_range(const Tensor& index, int64_t size) {
  if (index.numel() == 0) return std::nullopt;
  Shape shape, strides;  // dims of stride 0 repeat values already seen: skip them
  for (int64_t d = 0; d < index.dim(); ++d)
    if (index.strides()[d] != 0 && index.shape()[d] != 1) {
      shape.push_back(index.shape()[d]);
      strides.push_back(index.strides()[d]);
    }
  if (shape.empty()) {
    shape.push_back(1);
    strides.push_back(0);
  }
  const int64_t* idx = index.data_ptr<int64_t>();
  std::optional<int64_t> bad;
  int64_t rows = shape_numel(shape) / shape.back();
  for_each_row<1>(shape, {strides}, rows, [&](const std::array<int64_t, 1>& offset, int64_t) {
    for (int64_t l = 0; l < shape.back() && !bad; ++l) {
      int64_t v = idx[offset[0] + l * strides.back()];
      if (v < 0 || v >= size) bad = v;
    }
  });
  return bad;
}

void check_index_range(const Tensor& index, int64_t dim, const Tensor& x) {
  int64_t size = x.shape()[dim];
  if (auto bad = first_out_of_range(index, size))
    fail("index {} is out of range for dim {} of size {} (shape {})", *bad, dim, size, shape_str(x.shape()));
}

/// For fronts: the dispatcher runs no kernel for an empty output, so index values the kernel would
/// have checked are checked here (on a host copy), lest a call's validity hang on another dim's size.
void check_index_range_for_empty(const Shape& out_shape, const Tensor& index, int64_t dim, const Tensor& x) {
  if (shape_numel(out_shape) == 0 && index.numel() > 0) check_index_range(index.to(Device::cpu()), dim, x);
}

void check_index_tensor(const Tensor& index) {
  MF_CHECK(index.dtype() == DType::Int64, "index must be int64, got {} (shape {})", dtype_name(index.dtype()),
           shape_str(index.shape()));
}

int64_t checked_dim(const Tensor& x, int64_t dim) {
  MF_CHECK(x.dim() > 0, "expects a tensor with at least 1 dim, got shape []");
  return normalize_dim(dim, x.dim());
}

/// A view of `base`'s storage with the given layout (how kernels address part of an output).
Tensor view_of(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(base.storage(), shape, strides, offset, base.dtype()));
}

template <typename T>
void copy_into(Tensor& out, const Tensor& in) {
  if (in.numel() > 0) cpu::map<T, T>(out, {&in}, [](T v) { return v; });
}

/// out[p] = x[p with dim replaced by index[p]] for every p of out's (contiguous) shape, the index read
/// at p through index_strides (stride 0 along dims it is broadcast over).
template <typename T>
void gather_into(Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, const Shape& index_strides) {
  if (out.numel() == 0) return;
  Shape x_strides = x.strides();
  int64_t x_dim_stride = x_strides[dim];
  x_strides[dim] = 0;  // the index supplies the position along dim
  int64_t n = out.shape().back(), sx = x_strides.back(), si = index_strides.back();
  const T* inp = static_cast<const T*>(x.raw_data());
  const int64_t* idx = index.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  for_each_row<2>(out.shape(), {x_strides, index_strides}, 1, [&](const std::array<int64_t, 2>& off, int64_t r) {
    T* dst = o + r * n;
    const T* src = inp + off[0];
    const int64_t* row_index = idx + off[1];
    if (si == 0 && sx == 1) {  // one whole row of x (index_select along an outer dim)
      std::copy_n(src + row_index[0] * x_dim_stride, n, dst);
    } else {
      for (int64_t l = 0; l < n; ++l) dst[l] = src[l * sx + row_index[l * si] * x_dim_stride];
    }
  });
}

// ---- cat (any number of inputs, along dim) ------------------------------------------------

std::vector<OutputSpec> infer_cat(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& first = in[0];  // the dispatcher refuses an empty list
  MF_CHECK(first.dim() > 0, "cannot concatenate 0-dim tensors (tensor 0 has shape [])");
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, first.dim());
  Shape shape = first.shape();
  shape[dim] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    MF_CHECK(t.dtype() == first.dtype(), "tensor {} has dtype {} but tensor 0 has dtype {}", i,
             dtype_name(t.dtype()), dtype_name(first.dtype()));
    bool match = t.dim() == first.dim();
    for (int64_t d = 0; match && d < t.dim(); ++d) match = d == dim || t.shape()[d] == first.shape()[d];
    MF_CHECK(match, "tensor {} has shape {} but tensor 0 has shape {} (all dims but dim {} must match)", i,
             shape_str(t.shape()), shape_str(first.shape()), dim);
    shape[dim] += t.shape()[dim];
  }
  return {{shape, first.dtype()}};
}

// Each input is copied into its window of the output, a strided view over the output's storage.
void cpu_cat(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor& o = out[0];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, o.dim()), start = 0;
  visit_dtype(o.dtype(), [&]<typename T>() {
    for (const Tensor& t : in) {
      Tensor window = view_of(o, t.shape(), o.strides(), o.offset() + start * o.strides()[dim]);
      copy_into<T>(window, t);
      start += t.shape()[dim];
    }
  });
}

std::vector<Tensor> cat_backward(const GradContext& ctx) {
  const Tensor& dout = ctx.grads[0];
  int64_t dim = normalize_dim(std::get<DimParams>(ctx.attrs).dim, dout.dim()), start = 0;
  std::vector<Tensor> dinp;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    int64_t length = ctx.inputs[i].shape()[dim];
    dinp.push_back(ctx.needs_grad[i] ? dout.slice(dim, start, start + length) : Tensor());
    start += length;
  }
  return dinp;
}

std::vector<Tensor> reference_cat(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape shape = infer_cat(in, attrs)[0].shape;
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, in[0].dim());
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape source = index;
    size_t i = 0;
    while (source[dim] >= in[i].shape()[dim]) source[dim] -= in[i++].shape()[dim];
    values.push_back(in[i].at<double>(source));
  });
  return {reference::make(shape, in[0].dtype(), values)};
}

// ---- index_select (x, index [n]) along dim -----------------------------------------------

std::vector<OutputSpec> infer_index_select(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = checked_dim(x, std::get<DimParams>(attrs).dim);
  check_index_tensor(index);
  MF_CHECK(index.dim() <= 1, "index must be 1-D, got shape {}", shape_str(index.shape()));
  Shape shape = x.shape();
  shape[dim] = index.numel();
  check_index_range_for_empty(shape, index, dim, x);
  return {{shape, x.dtype()}};
}

/// Copies one slice of an index_select from a source laid out as `src_slice` to a destination laid out
/// as `dst_slice` (views of one slice, slice_shape): the slice's runs, contiguous in both where they
/// can be (then one memcpy each), are found once and serve every slice.
class SliceCopy {
 public:
  SliceCopy(const Shape& slice_shape, const Tensor& dst_slice, const Tensor& src_slice)
      : element_(static_cast<int64_t>(dst_slice.element_size())) {
    const LoopPlan<2> plan(slice_shape, {&dst_slice, &src_slice});
    length_ = plan.inner();
    dst_step_ = plan.strides[0].back();
    src_step_ = plan.strides[1].back();
    runs_ = dst_step_ == element_ && src_step_ == element_;
    const size_t outer_dims = plan.shape.size() - 1;
    Shape index(outer_dims, 0);
    for (int64_t r = 0; r < plan.outer(); ++r) {
      std::array<int64_t, 2> at{};
      for (size_t d = 0; d < outer_dims; ++d)
        for (size_t k = 0; k < 2; ++k) at[k] += index[d] * plan.strides[k][d];
      starts_.push_back(at);
      for (size_t d = outer_dims; d-- > 0;) {
        if (++index[d] < plan.shape[d]) break;
        index[d] = 0;
      }
    }
  }

  /// The slice at src (byte address of its first element) to the slice at dst.
  void operator()(char* dst, const char* src) const {
    for (const auto& [dst_at, src_at] : starts_) {
      if (runs_) {
        std::memcpy(dst + dst_at, src + src_at, static_cast<size_t>(length_ * element_));
        continue;
      }
      for (int64_t l = 0; l < length_; ++l)
        std::memcpy(dst + dst_at + l * dst_step_, src + src_at + l * src_step_, static_cast<size_t>(element_));
    }
  }

 private:
  int64_t element_, length_ = 0, dst_step_ = 0, src_step_ = 0;  // bytes, but length_: elements per run
  bool runs_ = false;                                           // each run contiguous in both: one memcpy
  std::vector<std::array<int64_t, 2>> starts_;                 // bytes from the slice's start: dst, src
};

/// index_select a slice at a time (a slice: everything after `dim`, at one position of the dims up to
/// it), each copied as the runs it has contiguous in out and x, so that a contiguous slice is one
/// copy. Beam search reorders its key/value caches this way: a slice per hypothesis, out and x
/// views of the filled positions of larger buffers. With `in_place` (out is x's own memory, from x's
/// start with x's strides) the slices move in order, and a source that an earlier move overwrites is
/// copied aside first.
void select_slices(Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, bool in_place) {
  const std::vector<int64_t> picks = index.to_vector<int64_t>();
  const auto count = static_cast<int64_t>(picks.size());
  const int64_t element = static_cast<int64_t>(x.element_size());
  const Shape slice_shape(x.shape().begin() + dim + 1, x.shape().end());
  const int64_t slice_bytes = shape_numel(slice_shape) * element;
  auto slice_of = [&](const Tensor& t) {
    return view_of(t, slice_shape, Shape(t.strides().begin() + dim + 1, t.strides().end()), t.offset());
  };
  const Tensor out_slice = slice_of(out), x_slice = slice_of(x);
  const SliceCopy copy_slice(slice_shape, out_slice, x_slice);
  // Byte offset of slice (outer position o, position along dim) in t.
  auto start = [&](const Tensor& t, int64_t o, int64_t position) {
    int64_t at = position * t.strides()[dim];
    for (int64_t d = dim; d-- > 0;) {
      at += o % x.shape()[d] * t.strides()[d];
      o /= x.shape()[d];
    }
    return at * element;
  };
  char* dst = static_cast<char*>(out.raw_data());
  const char* src = static_cast<const char*>(x.raw_data());
  const int64_t outer = shape_numel(std::span(x.shape()).first(static_cast<size_t>(dim)));
  if (!in_place && slice_shape.empty()) {  // single elements (dim is the last): one gather per outer row
    const int64_t out_step = out.strides()[dim], x_step = x.strides()[dim];
    visit_any_dtype(x.dtype(), [&]<typename T>() {
      parallel_for(0, outer, std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(count, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t o = begin; o < end; ++o) {
                       T* row = reinterpret_cast<T*>(dst + start(out, o, 0));
                       const T* from = reinterpret_cast<const T*>(src + start(x, o, 0));
                       for (int64_t i = 0; i < count; ++i)
                         row[i * out_step] = from[picks[static_cast<size_t>(i)] * x_step];
                     }
                   });
    });
    return;
  }
  if (!in_place) {
    const int64_t grain = std::max<int64_t>(1, cpu::kParallelGrain * 4 / std::max<int64_t>(slice_bytes, 1));
    parallel_for(0, outer * count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t o = k / count, i = k % count;
        copy_slice(dst + start(out, o, i), src + start(x, o, picks[static_cast<size_t>(i)]));
      }
    });
    return;
  }
  // Moving slice i overwrites position i; a later slice whose source is an earlier, moved position
  // reads a copy of it.
  std::vector<int64_t> slot(static_cast<size_t>(x.shape()[dim]), -1);  // by source: where its copy is, or -1
  std::vector<int64_t> saved;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t source = picks[static_cast<size_t>(i)];
    if (source < i && picks[static_cast<size_t>(source)] != source && slot[static_cast<size_t>(source)] < 0) {
      slot[static_cast<size_t>(source)] = static_cast<int64_t>(saved.size());
      saved.push_back(source);
    }
  }
  // The copies aside, where there are any (compaction has none: its sources lie at or after their targets).
  Tensor aside;
  std::optional<SliceCopy> save, restore;
  if (!saved.empty()) {
    Shape aside_shape = slice_shape;
    aside_shape.insert(aside_shape.begin(), static_cast<int64_t>(saved.size()));
    aside = Tensor::empty(aside_shape, x.dtype(), x.device());
    const Tensor aside_slice = view_of(aside, slice_shape, contiguous_strides(slice_shape), 0);
    save.emplace(slice_shape, aside_slice, x_slice);
    restore.emplace(slice_shape, out_slice, aside_slice);
  }
  char* aside_data = aside.defined() ? static_cast<char*>(aside.raw_data()) : nullptr;
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t s = 0; s < saved.size(); ++s)
      (*save)(aside_data + static_cast<int64_t>(s) * slice_bytes, src + start(x, o, saved[s]));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t source = picks[static_cast<size_t>(i)];
      if (source == i) continue;
      if (const int64_t s = slot[static_cast<size_t>(source)]; s >= 0)
        (*restore)(dst + start(out, o, i), aside_data + s * slice_bytes);
      else
        copy_slice(dst + start(out, o, i), src + start(x, o, source));
    }
  }
}

/// Whether out is x's own memory laid out as x: the same first element and strides (along dim it
/// may hold fewer positions, the other dims match as index_select's result does).
bool same_layout(const Tensor& out, const Tensor& x) {
  return out.raw_data() == x.raw_data() && out.strides() == x.strides();
}

void cpu_index_select(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, in[0].dim());
  check_index_range(index, dim, in[0]);
  Tensor x = in[0];
  const bool shares = x.storage() == out[0].storage();
  if (shares && same_layout(out[0], x)) return select_slices(out[0], x, dim, index, true);
  if (shares) {  // written in place into memory laid out otherwise: read from a copy
    x = Tensor::empty(x.shape(), x.dtype(), x.device());
    visit_any_dtype(x.dtype(), [&]<typename T>() { copy_into<T>(x, in[0]); });
  }
  if (!out[0].is_contiguous() || x.is_contiguous()) return select_slices(out[0], x, dim, index, false);
  Shape index_strides(static_cast<size_t>(x.dim()), 0);  // the 1-D index, broadcast over the other dims
  index_strides[dim] = index.dim() == 1 ? index.strides()[0] : 0;
  visit_any_dtype(x.dtype(), [&]<typename T>() { gather_into<T>(out[0], x, dim, index, index_strides); });
}

// dx = zeros scattered with dout at the selected positions (repeats accumulate).
std::vector<Tensor> index_select_backward(const GradContext& ctx) {
  const Tensor &x = ctx.inputs[0], &index = ctx.inputs[1], &dout = ctx.grads[0];
  int64_t dim = normalize_dim(std::get<DimParams>(ctx.attrs).dim, x.dim());
  Shape shape(static_cast<size_t>(x.dim()), 1);
  shape[dim] = index.numel();
  Tensor spread = index.reshape(shape).expand(dout.shape());  // index[j] at every p with p[dim] = j
  return {scatter_add(zeros(x.shape(), dout.dtype(), dout.device()), dim, spread, dout), Tensor()};
}

std::vector<Tensor> reference_index_select(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  std::vector<int64_t> picks = index.to_vector<int64_t>();
  Shape shape = x.shape();
  shape[dim] = static_cast<int64_t>(picks.size());
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& i) {
    Shape source = i;
    source[dim] = picks[static_cast<size_t>(i[dim])];
    values.push_back(x.at<double>(source));
  });
  return {reference::make(shape, x.dtype(), values)};
}

// ---- gather (x, index) along dim: out[p] = x[p with dim replaced by index[p]] -------------

std::vector<OutputSpec> infer_gather(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = checked_dim(x, std::get<DimParams>(attrs).dim);
  check_index_tensor(index);
  MF_CHECK(index.dim() == x.dim(), "index of shape {} must have as many dims as x of shape {}",
           shape_str(index.shape()), shape_str(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    MF_CHECK(d == dim || index.shape()[d] <= x.shape()[d],
             "index of shape {} is larger than x of shape {} in dim {} (only dim {} may be larger)",
             shape_str(index.shape()), shape_str(x.shape()), d, dim);
  return {{index.shape(), x.dtype()}};
}

void cpu_gather(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  check_index_range(index, dim, x);
  visit_dtype(x.dtype(), [&]<typename T>() { gather_into<T>(out[0], x, dim, index, index.strides()); });
}

std::vector<Tensor> gather_backward(const GradContext& ctx) {
  const Tensor &x = ctx.inputs[0], &index = ctx.inputs[1], &dout = ctx.grads[0];
  int64_t dim = normalize_dim(std::get<DimParams>(ctx.attrs).dim, x.dim());
  return {scatter_add(zeros(x.shape(), dout.dtype(), dout.device()), dim, index, dout), Tensor()};
}

std::vector<Tensor> reference_gather(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  std::vector<double> values;
  reference::for_each_index(index.shape(), [&](const Shape& i) {
    Shape source = i;
    source[dim] = index.at<int64_t>(i);
    values.push_back(x.at<double>(source));
  });
  return {reference::make(index.shape(), x.dtype(), values)};
}

// ---- scatter_add (x, index, src) along dim: out = x; out[p with dim = index[p]] += src[p] ---

std::vector<OutputSpec> infer_scatter_add(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  int64_t dim = checked_dim(x, std::get<DimParams>(attrs).dim);
  check_index_tensor(index);
  MF_CHECK(x.dtype() == src.dtype() && x.dtype() != DType::Bool,
           "x and src must share a float32, float64 or int64 dtype, got {} and {}", dtype_name(x.dtype()),
           dtype_name(src.dtype()));
  MF_CHECK(index.dim() == x.dim() && src.dim() == x.dim(),
           "x {}, index {} and src {} must have the same number of dims", shape_str(x.shape()),
           shape_str(index.shape()), shape_str(src.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    MF_CHECK(index.shape()[d] <= src.shape()[d] && (d == dim || index.shape()[d] <= x.shape()[d]),
             "index of shape {} is larger than src {} or x {} in dim {}", shape_str(index.shape()),
             shape_str(src.shape()), shape_str(x.shape()), d);
  check_index_range_for_empty(x.shape(), index, dim, x);
  return {{x.shape(), x.dtype()}};
}

// Each element's sum runs in index order whatever the thread count. Along the last dim, rows never
// write to each other's targets, so threads split the rows; along any other dim rows may collide,
// but columns (last-dim positions) never do, so threads split the columns.
void cpu_scatter_add(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  Tensor& o = out[0];  // contiguous, x's shape
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  check_index_range(index, dim, x);
  Shape out_strides = o.strides(), src_strides = src.strides();
  int64_t out_dim_stride = out_strides[dim];
  out_strides[dim] = 0;
  const Shape& shape = index.shape();
  int64_t n = shape.back(), rows = index.numel() / std::max<int64_t>(n, 1);
  int64_t so = out_strides.back(), ss = src_strides.back(), si = index.strides().back();
  visit_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      copy_into<T>(o, x);
      if (index.numel() == 0) return;
      T* dst = o.data_ptr<T>();
      const T* s = static_cast<const T*>(src.raw_data());
      const int64_t* idx = index.data_ptr<int64_t>();
      auto scatter = [&](int64_t column_begin, int64_t column_end, int64_t block) {
        for_each_row<3>(shape, {out_strides, src_strides, index.strides()}, block,
                        [&](const std::array<int64_t, 3>& off, int64_t) {
                          for (int64_t l = column_begin; l < column_end; ++l)
                            dst[off[0] + l * so + idx[off[2] + l * si] * out_dim_stride] += s[off[1] + l * ss];
                        });
      };
      if (dim == x.dim() - 1) {
        scatter(0, n, 1);
      } else {
        parallel_for(0, n, std::max<int64_t>(1, cpu::kParallelGrain / rows),
                     [&](int64_t begin, int64_t end) { scatter(begin, end, rows); });
      }
    }
  });
}

// dx = dout; dsrc = dout gathered at the index (zero where src reaches past the index).
std::vector<Tensor> scatter_add_backward(const GradContext& ctx) {
  const Tensor &index = ctx.inputs[1], &src = ctx.inputs[2], &dout = ctx.grads[0];
  Tensor dsrc;
  if (ctx.needs_grad[2]) {
    int64_t dim = normalize_dim(std::get<DimParams>(ctx.attrs).dim, dout.dim());
    dsrc = gather(dout, dim, index);
    if (dsrc.shape() != src.shape()) {
      Tensor padded = zeros(src.shape(), dout.dtype(), dout.device());
      Tensor window = padded;
      for (int64_t d = 0; d < src.dim(); ++d) window = window.slice(d, 0, index.shape()[d]);
      window.copy_(dsrc);
      dsrc = padded;
    }
  }
  return {ctx.needs_grad[0] ? dout : Tensor(), Tensor(), dsrc};
}

std::vector<Tensor> reference_scatter_add(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  std::vector<double> values = x.contiguous().to_vector<double>();
  Shape strides = contiguous_strides(x.shape());
  reference::for_each_index(index.shape(), [&](const Shape& i) {
    int64_t position = 0;
    for (size_t d = 0; d < i.size(); ++d)
      position += (static_cast<int64_t>(d) == dim ? index.at<int64_t>(i) : i[d]) * strides[d];
    values[static_cast<size_t>(position)] += src.at<double>(i);
  });
  return {reference::make(x.shape(), x.dtype(), values)};
}

// ---- topk (x) along dim: k values, largest first when largest (else smallest first), and their indices

std::vector<OutputSpec> infer_topk(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const TopKParams& topk = std::get<TopKParams>(attrs);
  int64_t dim = checked_dim(x, topk.dim);
  MF_CHECK(x.dtype() != DType::Bool, "not defined for bool tensors (shape {})", shape_str(x.shape()));
  int64_t size = x.shape()[dim];
  MF_CHECK(topk.k >= 0 && topk.k <= size, "k = {} is out of range for dim {} of size {} (shape {})", topk.k, dim,
           size, shape_str(x.shape()));
  Shape shape = x.shape();
  shape[dim] = topk.k;
  return {{shape, x.dtype()}, {shape, DType::Int64}};
}

/// sort is topk of the whole dim: the parameters topk would take for it.
TopKParams as_topk(const Tensor& x, const SortParams& sort) {
  int64_t dim = checked_dim(x, sort.dim);
  return {.k = x.shape()[dim], .dim = dim, .largest = sort.descending};
}

std::vector<OutputSpec> infer_sort(const std::vector<Tensor>& in, const Attrs& attrs) {
  return infer_topk(in, as_topk(in[0], std::get<SortParams>(attrs)));
}

/// Whether (value a at index ia) is listed before (b at ib): NaN counts as the largest value, as in
/// PyTorch, and ties go to the lower index.
template <typename T, bool Largest>
bool ranks_before(T a, int64_t ia, T b, int64_t ib) {
  if constexpr (std::is_floating_point_v<T>) {
    bool a_nan = std::isnan(a), b_nan = std::isnan(b);
    if (a_nan || b_nan) return a_nan == b_nan ? ia < ib : (a_nan == Largest);
  }
  if (a != b) return Largest ? a > b : a < b;
  return ia < ib;
}

/// Offers the element at index j along dim to a fiber's best so far (`count` of k, sorted).
template <typename T, bool Largest>
void offer(std::pair<T, int64_t>* best, int64_t& count, int64_t k, T value, int64_t j) {
  if (count == k && !ranks_before<T, Largest>(value, j, best[k - 1].first, best[k - 1].second)) return;
  int64_t p = count < k ? count++ : k - 1;
  for (; p > 0 && ranks_before<T, Largest>(value, j, best[p - 1].first, best[p - 1].second); --p) best[p] = best[p - 1];
  best[p] = {value, j};
}

/// Whether `value` could enter a best-k list whose k-th value is `bound`, coming after it: it ranks
/// before the bound or is NaN (ties lose: a later index).
template <typename T, bool Largest>
MF_INLINE bool beyond(T value, T bound) {
  return Largest ? !(value <= bound) : !(value >= bound);
}

/// Whether any lane of a comparison's result is set: the vector folded in halves (a plain loop over
/// the lanes extracts each).
template <int W>
MF_INLINE bool any_lane(typename cpu::Simd<float, W>::Mask mask) {
  if constexpr (W <= static_cast<int>(sizeof(uint64_t))) {
    uint64_t bits = 0;
    std::memcpy(&bits, &mask, sizeof mask);
    return bits != 0;
  } else {
    typename cpu::Simd<float, W / 2>::Mask low, high;
    std::memcpy(&low, &mask, sizeof low);
    std::memcpy(&high, reinterpret_cast<const char*>(&mask) + sizeof low, sizeof high);
    return any_lane<W / 2>(low | high);
  }
}

/// Offers row[j, size) (contiguous) to a best-k list already holding k. Only an element beyond the
/// k-th best's value can enter, and after the first few hundred few are: a block of floats with none
/// beyond it is passed over with one vector test, W bytes at a time (written as a plain loop, the
/// compiler keeps NaN-aware comparisons scalar), and in a block that has one, only the elements
/// beyond the bound at their turn are offered. Returns where the blocks stopped.
template <int W, typename T, bool Largest>
MF_INLINE int64_t offer_blocks(const T* row, int64_t j, int64_t size, std::pair<T, int64_t>* best, int64_t& count,
                               int64_t k) {
  constexpr int64_t kBlock = 16;
  T bound = best[k - 1].first;
  for (; j + kBlock <= size; j += kBlock) {
    bool any = true;  // other types go straight to the elements: their test would make the same compares
    if constexpr (std::is_same_v<T, float>) {
      using S = cpu::Simd<float, W>;
      typename S::Mask beyond_bound{};
      for (int64_t b = 0; b < kBlock; b += S::kLanes) {
        typename S::V v;
        std::memcpy(&v, row + j + b, sizeof v);
        beyond_bound |= (Largest ? v <= bound : v >= bound) == 0;  // false for NaN too
      }
      any = any_lane<W>(beyond_bound);
    }
    if (!any) continue;
    for (int64_t i = j; i < j + kBlock; ++i)
      if (beyond<T, Largest>(row[i], bound)) {
        offer<T, Largest>(best, count, k, row[i], i);
        bound = best[k - 1].first;
      }
  }
  return j;
}

/// Fibers along dim are ranked one row of the walker at a time (n fibers side by side). A small k
/// streams through the fibers once, in memory order, keeping each fiber's best k so far sorted by
/// insertion; a large k sorts a copy of each fiber partially. Before a fiber's best k are written,
/// finish(fiber, stride, best) may change their values (log_softmax_topk normalises them there, while
/// the fiber is still in cache).
template <typename T, bool Largest, typename Finish>
void topk_fibers(const Tensor& x, int64_t dim, int64_t k, Tensor& values, Tensor& indices, Finish finish) {
  using Ranked = std::pair<T, int64_t>;  // value, index along dim
  int64_t size = x.shape()[dim], stride = x.strides()[dim];
  Shape fiber_shape = x.shape(), fiber_strides = x.strides();  // one fiber per index with dim fixed at 0
  fiber_shape[dim] = 1;
  Shape out_strides = contiguous_strides(values.shape());
  int64_t out_stride = values.strides()[dim];
  const T* inp = static_cast<const T*>(x.raw_data());
  T* vals = values.data_ptr<T>();
  int64_t* idxs = indices.data_ptr<int64_t>();
  int64_t n = fiber_shape.back(), sx = fiber_strides.back(), so = out_strides.back();
  bool streaming = k * 16 <= size;
  for_each_row<2>(fiber_shape, {fiber_strides, out_strides}, 1, [&](const std::array<int64_t, 2>& off, int64_t) {
    const T* row = inp + off[0];
    std::vector<Ranked> ranked(static_cast<size_t>(streaming ? n * k : size));
    std::vector<int64_t> kept(streaming ? n : 0, 0);
    auto emit = [&](int64_t l, Ranked* best) {
      finish(row + l * sx, stride, best);
      for (int64_t r = 0; r < k; ++r) {
        vals[off[1] + l * so + r * out_stride] = best[r].first;
        idxs[off[1] + l * so + r * out_stride] = best[r].second;
      }
    };
    if (streaming && n == 1) {
      int64_t j = 0;
      for (; j < size && kept[0] < k; ++j) offer<T, Largest>(ranked.data(), kept[0], k, row[j * stride], j);
      if (stride == 1)
        cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
          j = offer_blocks<W, T, Largest>(row, j, size, ranked.data(), kept[0], k);
        });
      for (; j < size; ++j) offer<T, Largest>(ranked.data(), kept[0], k, row[j * stride], j);
      emit(0, ranked.data());
    } else if (streaming) {  // the n fibers interleave in memory: walk them side by side
      for (int64_t j = 0; j < size; ++j)
        for (int64_t l = 0; l < n; ++l) offer<T, Largest>(ranked.data() + l * k, kept[l], k, row[j * stride + l * sx], j);
      for (int64_t l = 0; l < n; ++l) emit(l, ranked.data() + l * k);
    } else {
      for (int64_t l = 0; l < n; ++l) {
        for (int64_t j = 0; j < size; ++j) ranked[j] = {row[j * stride + l * sx], j};
        std::partial_sort(ranked.begin(), ranked.begin() + k, ranked.end(), [](const Ranked& a, const Ranked& b) {
          return ranks_before<T, Largest>(a.first, a.second, b.first, b.second);
        });
        emit(l, ranked.data());
      }
    }
  }, size);
}

void cpu_topk(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  if (out[0].numel() == 0) return;
  const TopKParams& topk = std::get<TopKParams>(attrs);
  int64_t dim = normalize_dim(topk.dim, x.dim());
  visit_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      auto keep = [](const T*, int64_t, std::pair<T, int64_t>*) {};
      if (topk.largest)
        topk_fibers<T, true>(x, dim, topk.k, out[0], out[1], keep);
      else
        topk_fibers<T, false>(x, dim, topk.k, out[0], out[1], keep);
    }
  });
}

void cpu_sort(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  cpu_topk(in, out, as_topk(in[0], std::get<SortParams>(attrs)));
}

// dx = zeros with dvalues put back at the chosen indices (distinct within a fiber).
std::vector<Tensor> scatter_back(const GradContext& ctx, int64_t dim) {
  const Tensor &x = ctx.inputs[0], &indices = ctx.outputs[1], &dvalues = ctx.grads[0];
  return {scatter_add(zeros(x.shape(), dvalues.dtype(), dvalues.device()), normalize_dim(dim, x.dim()), indices,
                      dvalues)};
}

std::vector<Tensor> topk_backward(const GradContext& ctx) {
  return scatter_back(ctx, std::get<TopKParams>(ctx.attrs).dim);
}

std::vector<Tensor> sort_backward(const GradContext& ctx) {
  return scatter_back(ctx, std::get<SortParams>(ctx.attrs).dim);
}

// Selection by repeated scans: each rank takes the first best element not taken yet.
std::vector<Tensor> reference_topk(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const auto& [k, topk_dim, largest] = std::get<TopKParams>(attrs);
  int64_t dim = normalize_dim(topk_dim, x.dim()), size = x.shape()[dim];
  Shape shape = x.shape();
  shape[dim] = k;
  std::vector<double> values(static_cast<size_t>(shape_numel(shape))), indices(values.size());
  Shape out_strides = contiguous_strides(shape), fiber_shape = x.shape();
  fiber_shape[dim] = 1;
  auto better = [&](double a, double b) {  // strictly: NaN is the largest value
    if (std::isnan(a) || std::isnan(b)) return std::isnan(largest ? a : b) && !std::isnan(largest ? b : a);
    return largest ? a > b : a < b;
  };
  reference::for_each_index(fiber_shape, [&](const Shape& start) {
    std::vector<double> fiber;
    for (Shape i = start; i[dim] < size; ++i[dim]) fiber.push_back(x.at<double>(i));
    std::vector<bool> taken(fiber.size(), false);
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      for (int64_t j = 0; j < size; ++j)
        if (!taken[j] && (best < 0 || better(fiber[j], fiber[best]))) best = j;
      taken[best] = true;
      int64_t position = r * out_strides[dim];
      for (size_t d = 0; d < start.size(); ++d)
        if (static_cast<int64_t>(d) != dim) position += start[d] * out_strides[d];
      values[position] = fiber[best];
      indices[position] = static_cast<double>(best);
    }
  });
  return {reference::make(shape, x.dtype(), values), reference::make(shape, DType::Int64, indices)};
}

std::vector<Tensor> reference_sort(const std::vector<Tensor>& in, const Attrs& attrs) {
  return reference_topk(in, as_topk(in[0], std::get<SortParams>(attrs)));
}

// ---- log_softmax_topk (x) along dim: topk of log_softmax(x, dim), never writing log_softmax(x) --
// log_softmax subtracts one value per fiber, so x's k best are the k best log-probabilities (up to
// ties that the subtraction's rounding could make); only those k are normalised, by softmax_row's own
// log_softmax_shift, so each has the bits log_softmax gives it.

std::vector<OutputSpec> infer_log_softmax_topk(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  MF_CHECK(is_floating(x.dtype()), "expects a float32 or float64 tensor, got {} of shape {} (cast it first)",
           dtype_name(x.dtype()), shape_str(x.shape()));
  return infer_topk(in, attrs);
}

void cpu_log_softmax_topk(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  if (out[0].numel() == 0) return;
  const TopKParams& topk = std::get<TopKParams>(attrs);
  const int64_t dim = normalize_dim(topk.dim, x.dim()), size = x.shape()[dim];
  visit_floating(x.dtype(), [&]<typename T>() {
    auto normalise = [&](const T* fiber, int64_t stride, std::pair<T, int64_t>* best) {
      std::vector<T> gathered;  // a strided fiber, laid out contiguously
      if (stride != 1) {
        for (int64_t j = 0; j < size; ++j) gathered.push_back(fiber[j * stride]);
        fiber = gathered.data();
      }
      cpu::LogSoftmaxShift<T> shift{};
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE { shift = cpu::log_softmax_shift<W>(fiber, size); });
      for (int64_t r = 0; r < topk.k; ++r) best[r].first = shift.apply(best[r].first);
    };
    if (topk.largest)
      topk_fibers<T, true>(x, dim, topk.k, out[0], out[1], normalise);
    else
      topk_fibers<T, false>(x, dim, topk.k, out[0], out[1], normalise);
  });
}

/// log_softmax of every fiber in double, by plain loops, then reference_topk's selection.
std::vector<Tensor> reference_log_softmax_topk(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const int64_t dim = normalize_dim(std::get<TopKParams>(attrs).dim, x.dim()), size = x.shape()[dim];
  std::vector<double> log_probs;
  reference::for_each_index(x.shape(), [&](const Shape& index) {
    Shape line = index;
    double max = -std::numeric_limits<double>::infinity(), total = 0;
    for (line[dim] = 0; line[dim] < size; ++line[dim]) max = std::max(max, x.at<double>(line));
    for (line[dim] = 0; line[dim] < size; ++line[dim]) total += std::exp(x.at<double>(line) - max);
    log_probs.push_back(x.at<double>(index) - max - std::log(total));
  });
  return reference_topk({reference::make(x.shape(), x.dtype(), log_probs)}, attrs);
}

// ---- cumsum (x) along dim: running sums, from the end of dim with reverse. Float tensors accumulate in
// double (as PyTorch's CPU kernel does), integers and bools in int64, which is also the output dtype
// for them (as torch.cumsum's). A 0-dim tensor is its own sum.

DType cumsum_dtype(DType dtype) { return is_floating(dtype) ? dtype : DType::Int64; }

std::vector<OutputSpec> infer_cumsum(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  normalize_dim(std::get<CumsumParams>(attrs).dim, std::max<int64_t>(x.dim(), 1));
  return {{x.shape(), cumsum_dtype(x.dtype())}};
}

template <typename T, typename Out>
void cumsum_fibers(const Tensor& x, int64_t dim, bool reverse, Tensor& out) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  const T* inp = static_cast<const T*>(x.raw_data());
  Out* sums = out.data_ptr<Out>();
  if (x.dim() == 0) {
    sums[0] = static_cast<Out>(static_cast<Acc>(inp[0]));
    return;
  }
  int64_t size = x.shape()[dim], stride = x.strides()[dim], out_stride = out.strides()[dim];
  Shape fiber_shape = x.shape();  // one fiber per index with dim fixed at 0
  fiber_shape[dim] = 1;
  int64_t n = fiber_shape.back(), sx = x.strides().back(), so = out.strides().back();
  for_each_row<2>(fiber_shape, {x.strides(), out.strides()}, 1, [&](const std::array<int64_t, 2>& off, int64_t) {
    for (int64_t l = 0; l < n; ++l) {
      Acc running = 0;
      for (int64_t step = 0; step < size; ++step) {
        int64_t j = reverse ? size - 1 - step : step;
        running += static_cast<Acc>(inp[off[0] + l * sx + j * stride]);
        sums[off[1] + l * so + j * out_stride] = static_cast<Out>(running);
      }
    }
  }, size);
}

void cpu_cumsum(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const auto& [dim, reverse] = std::get<CumsumParams>(attrs);
  int64_t d = normalize_dim(dim, std::max<int64_t>(x.dim(), 1));
  visit_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>)
      cumsum_fibers<T, T>(x, d, reverse, out[0]);
    else
      cumsum_fibers<T, int64_t>(x, d, reverse, out[0]);
  });
}

// d x_j = sum of d out_i over the outputs that include x_j: the running sum from the other end.
std::vector<Tensor> cumsum_backward(const GradContext& ctx) {
  const auto& [dim, reverse] = std::get<CumsumParams>(ctx.attrs);
  return {cumsum(ctx.grads[0], dim, !reverse)};
}

// Each output summed afresh over its prefix (or suffix) of the fiber.
std::vector<Tensor> reference_cumsum(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const auto& [dim, reverse] = std::get<CumsumParams>(attrs);
  std::vector<double> values;
  if (x.dim() == 0) {
    values.push_back(x.at<double>({}));
  } else {
    int64_t d = normalize_dim(dim, x.dim()), size = x.shape()[d];
    reference::for_each_index(x.shape(), [&](const Shape& i) {
      double total = 0;
      Shape j = i;
      for (j[d] = reverse ? i[d] : 0; j[d] <= (reverse ? size - 1 : i[d]); ++j[d]) total += x.at<double>(j);
      values.push_back(total);
    });
  }
  return {reference::make(x.shape(), cumsum_dtype(x.dtype()), values)};
}

// ---- one_hot (indices) with num_classes classes ------------------------------------------------

std::vector<OutputSpec> infer_one_hot(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& indices = in[0];
  MF_CHECK(indices.dtype() == DType::Int64, "indices must be int64, got {} (shape {})",
           dtype_name(indices.dtype()), shape_str(indices.shape()));
  int64_t num_classes = std::get<OneHotParams>(attrs).num_classes;
  MF_CHECK(num_classes > 0, "num_classes must be positive, got {}", num_classes);
  Shape shape = indices.shape();
  shape.push_back(num_classes);
  return {{shape, DType::Int64}};
}

void cpu_one_hot(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor indices = in[0].contiguous();
  int64_t classes = std::get<OneHotParams>(attrs).num_classes, count = indices.numel();
  const int64_t* idx = indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    MF_CHECK(idx[i] >= 0, "class index {} is negative (indices of shape {})", idx[i], shape_str(indices.shape()));
    MF_CHECK(idx[i] < classes, "class index {} is out of range for num_classes = {} (indices of shape {})", idx[i],
             classes, shape_str(indices.shape()));
  }
  int64_t* o = out[0].data_ptr<int64_t>();
  parallel_for(0, count, std::max<int64_t>(1, cpu::kParallelGrain / classes), [&](int64_t begin, int64_t end) {
    std::fill(o + begin * classes, o + end * classes, int64_t{0});
    for (int64_t i = begin; i < end; ++i) o[i * classes + idx[i]] = 1;
  });
}

std::vector<Tensor> reference_one_hot(const std::vector<Tensor>& in, const Attrs& attrs) {
  Shape shape = in[0].shape();
  shape.push_back(std::get<OneHotParams>(attrs).num_classes);
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& i) {
    Shape source(i.begin(), i.end() - 1);
    values.push_back(in[0].at<int64_t>(source) == i.back() ? 1.0 : 0.0);
  });
  return {reference::make(shape, DType::Int64, values)};
}

// ---- tril / triu (x) on the last two dims, diagonal offset `diagonal` ----------------------------

std::vector<OutputSpec> infer_triangle(const std::vector<Tensor>& in, const Attrs&) {
  MF_CHECK(in[0].dim() >= 2, "expects a tensor with at least 2 dims, got shape {}", shape_str(in[0].shape()));
  return {{in[0].shape(), in[0].dtype()}};
}

/// Keeps x[..., i, j] where j - i <= diagonal (Lower, tril) or j - i >= diagonal (triu); zeroes the rest.
template <bool Lower>
void cpu_triangle(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  Tensor& o = out[0];  // contiguous
  if (o.numel() == 0) return;
  int64_t rows = x.size(-2), cols = x.size(-1), sx = x.strides().back();
  int64_t k = std::clamp(std::get<TriangleParams>(attrs).diagonal, -rows,
                         cols);  // offsets beyond the matrix act alike (and cannot overflow)
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* inp = static_cast<const T*>(x.raw_data());
    T* dst = o.data_ptr<T>();
    for_each_row<1>(x.shape(), {x.strides()}, 1, [&](const std::array<int64_t, 1>& off, int64_t r) {
      int64_t i = r % rows;
      int64_t first = Lower ? 0 : std::clamp(i + k, int64_t{0}, cols);  // kept: [first, last)
      int64_t last = Lower ? std::clamp(i + k + 1, int64_t{0}, cols) : cols;
      T* row = dst + r * cols;
      std::fill(row, row + first, T{});
      for (int64_t j = first; j < last; ++j) row[j] = inp[off[0] + j * sx];
      std::fill(row + last, row + cols, T{});
    });
  });
}

/// The same mask on the gradient.
template <OpId Id>
std::vector<Tensor> triangle_backward(const GradContext& ctx) {
  return {call1<Id>({ctx.grads[0]}, std::get<TriangleParams>(ctx.attrs), ctx.site)};
}

template <bool Lower>
std::vector<Tensor> reference_triangle(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  int64_t diagonal = std::get<TriangleParams>(attrs).diagonal;
  std::vector<double> values;
  reference::for_each_index(x.shape(), [&](const Shape& index) {
    int64_t offset = index[index.size() - 1] - index[index.size() - 2];
    bool keep = Lower ? offset <= diagonal : offset >= diagonal;
    values.push_back(keep ? x.at<double>(index) : 0.0);
  });
  return {reference::make(x.shape(), x.dtype(), values)};
}

std::vector<Sample> triangle_samples() {
  return {
      {"square", {reference::randn({4, 4}, 941)}, TriangleParams{.diagonal = 0}},
      {"wide, diagonal above", {reference::randn({3, 5}, 942)}, TriangleParams{.diagonal = 1}},
      {"batched tall, diagonal below", {reference::randn({2, 5, 3}, 943)}, TriangleParams{.diagonal = -1}},
      {"diagonal past the corner", {reference::randn({3, 3}, 944)}, TriangleParams{.diagonal = 7}},
      {"bool mask",
       {reference::make({3, 4}, DType::Bool, std::vector<double>(12, 1.0))},
       TriangleParams{.diagonal = 0}},
  };
}

}  // namespace

void register_index_ops(Registry& r) {
  r.define(OpId::cat,
           {.name = "cat",
            .infer = infer_cat,
            .kernels = {cpu_cat},
            .backward = cat_backward,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"dim 0, three inputs",
                       {reference::randn({2, 3}, 901), reference::randn({1, 3}, 902), reference::randn({4, 3}, 903)},
                       DimParams{.dim = 0}},
                      {"last dim",
                       {reference::randn({2, 3, 1}, 904), reference::randn({2, 3, 4}, 905)},
                       DimParams{.dim = -1}},
                      {"middle dim",
                       {reference::randn({2, 1, 3}, 906), reference::randn({2, 2, 3}, 907)},
                       DimParams{.dim = 1}},
                      {"one input", {reference::randn({3}, 908)}, DimParams{.dim = 0}},
                      {"int64",
                       {reference::randint({2, 2}, 9, 911), reference::randint({2, 1}, 9, 912)},
                       DimParams{.dim = 1}},
                  };
                },
            .reference = reference_cat});
  r.define(OpId::index_select, {.name = "index_select", .infer = infer_index_select,
                                .kernels = {cpu_index_select}, .backward = index_select_backward,
                                .takes_storage_dtypes = true, .samples = [] {
    return std::vector<Sample>{
        {"rows, repeated index", {reference::randn({4, 3}, 913), reference::make({3}, DType::Int64, {2, 0, 2})},
         DimParams{.dim = 0}},
        {"last dim of 3-d", {reference::randn({2, 3, 4}, 914), reference::make({2}, DType::Int64, {3, 1})},
         DimParams{.dim = -1}},
        {"middle dim", {reference::randn({2, 5, 3}, 915), reference::make({4}, DType::Int64, {4, 0, 1, 4})},
         DimParams{.dim = 1}},
        {"0-d index", {reference::randn({3, 2}, 916), reference::make({}, DType::Int64, {1})}, DimParams{.dim = 0}},
    };
  }, .reference = reference_index_select});
  r.define(OpId::gather, {.name = "gather", .infer = infer_gather, .kernels = {cpu_gather},
                          .backward = gather_backward, .samples = [] {
    return std::vector<Sample>{
        {"last dim", {reference::randn({3, 4}, 917), reference::randint({3, 2}, 4, 918)}, DimParams{.dim = 1}},
        {"dim 0, index narrower than x", {reference::randn({4, 3}, 919), reference::randint({2, 2}, 4, 920)},
         DimParams{.dim = 0}},
        {"3-d, index longer along dim", {reference::randn({2, 3, 4}, 921), reference::randint({2, 5, 4}, 3, 922)},
         DimParams{.dim = -2}},
        {"one column", {reference::randn({5, 3}, 923), reference::randint({5, 1}, 3, 924)}, DimParams{.dim = 1}},
    };
  }, .reference = reference_gather});
  r.define(OpId::scatter_add, {.name = "scatter_add", .infer = infer_scatter_add, .kernels = {cpu_scatter_add},
                               .backward = scatter_add_backward, .samples = [] {
    return std::vector<Sample>{
        {"dim 0", {reference::randn({3, 4}, 925), reference::randint({2, 4}, 3, 926), reference::randn({2, 4}, 927)},
         DimParams{.dim = 0}},
        {"src larger than index",
         {reference::randn({3, 5}, 928), reference::randint({2, 3}, 5, 929), reference::randn({3, 4}, 930)},
         DimParams{.dim = 1}},
        {"3-d, collisions along the last dim",
         {reference::randn({2, 2, 3}, 931), reference::randint({2, 2, 6}, 3, 932), reference::randn({2, 2, 6}, 933)},
         DimParams{.dim = -1}},
        {"3-d, middle dim",
         {reference::randn({2, 3, 4}, 950), reference::randint({2, 5, 4}, 3, 951), reference::randn({2, 5, 4}, 952)},
         DimParams{.dim = 1}},
        {"int64", {reference::randint({4}, 9, 934), reference::randint({6}, 4, 935), reference::randint({6}, 9, 936)},
         DimParams{.dim = 0}},
    };
  }, .reference = reference_scatter_add});
  r.define(OpId::topk, {.name = "topk", .infer = infer_topk, .kernels = {cpu_topk}, .backward = topk_backward,
                        .saves_outputs = true, .samples = [] {
    Tensor ties = reference::make({2, 5}, DType::Float64, {1, 3, 3, 2, 3, 0, 0, -1, 0, 5});
    // At a tie the selection switches under any perturbation, so finite differences cannot agree
    // with either one-sided gradient there.
    return std::vector<Sample>{
        {"largest, last dim", {reference::randn({3, 6}, 937)}, TopKParams{.k = 3, .dim = -1, .largest = true}},
        {"smallest, dim 0", {reference::randn({5, 4}, 938)}, TopKParams{.k = 2, .dim = 0, .largest = false}},
        {"all of a middle dim", {reference::randn({2, 3, 4}, 939)}, TopKParams{.k = 3, .dim = 1, .largest = true}},
        {"ties, largest", {ties}, TopKParams{.k = 4, .dim = 1, .largest = true}, {}, false},
        {"ties, smallest", {ties}, TopKParams{.k = 3, .dim = 1, .largest = false}, {}, false},
    };
  }, .reference = reference_topk});
  // Not differentiable: decoding ranks next tokens with it.
  r.define(OpId::log_softmax_topk, {.name = "log_softmax_topk", .infer = infer_log_softmax_topk,
                                    .kernels = {cpu_log_softmax_topk}, .samples = [] {
    return std::vector<Sample>{
        {"largest, last dim", {reference::randn({3, 6}, 960)}, TopKParams{.k = 3, .dim = -1, .largest = true}},
        {"smallest, dim 0", {reference::randn({5, 4}, 961)}, TopKParams{.k = 2, .dim = 0, .largest = false}},
        {"all of a middle dim", {reference::randn({2, 3, 4}, 962)}, TopKParams{.k = 3, .dim = 1, .largest = true}},
        // Rows long enough for topk's block skipping and the exps' vector loop with a tail.
        {"long rows", {reference::randn({3, 203}, 963)}, TopKParams{.k = 5, .dim = 1, .largest = true}},
        // exp(1000) overflows even in double: only the max-shifted sum gets these right.
        {"logits of +-1000", {reference::uniform({2, 40}, -1000, 1000, 964)}, TopKParams{.k = 2, .dim = 1}},
    };
  }, .reference = reference_log_softmax_topk});
  r.define(OpId::sort, {.name = "sort", .infer = infer_sort, .kernels = {cpu_sort}, .backward = sort_backward,
                        .saves_outputs = true, .samples = [] {
    Tensor ties = reference::make({2, 5}, DType::Float64, {1, 3, 3, 2, 3, 0, 0, -1, 0, 5});
    Tensor nan = reference::make({4}, DType::Float64, {2, std::nan(""), -1, 2});
    return std::vector<Sample>{
        {"ascending, last dim", {reference::randn({3, 6}, 960)}, SortParams{.dim = -1, .descending = false}},
        {"descending, dim 0", {reference::randn({5, 4}, 961)}, SortParams{.dim = 0, .descending = true}},
        {"middle dim", {reference::randn({2, 3, 4}, 962)}, SortParams{.dim = 1, .descending = false}},
        {"int64", {reference::randint({3, 7}, 4, 963)}, SortParams{.dim = 1, .descending = true}},
        // Ties keep their input order (stable), so finite differences cannot agree there.
        {"ties", {ties}, SortParams{.dim = 1, .descending = false}, {}, false},
        {"NaN", {nan}, SortParams{.dim = 0, .descending = true}, {}, false},
    };
  }, .reference = reference_sort});
  r.define(OpId::cumsum, {.name = "cumsum", .infer = infer_cumsum, .kernels = {cpu_cumsum}, .backward = cumsum_backward,
                          .saves_inputs = false, .samples = [] {
    return std::vector<Sample>{
        {"last dim", {reference::randn({3, 5}, 970)}, CumsumParams{.dim = -1}},
        {"first dim", {reference::randn({4, 3}, 971)}, CumsumParams{.dim = 0}},
        {"middle dim, reversed", {reference::randn({2, 4, 3}, 972)}, CumsumParams{.dim = 1, .reverse = true}},
        {"int64", {reference::randint({3, 4}, 9, 973)}, CumsumParams{.dim = 1}},
        {"bool to int64", {reference::randint({6}, 2, 974).to(DType::Bool)}, CumsumParams{.dim = 0}},
        {"0-dim", {reference::randn({}, 975)}, CumsumParams{.dim = -1}},
    };
  }, .reference = reference_cumsum});
  r.define(OpId::one_hot, {.name = "one_hot", .infer = infer_one_hot, .kernels = {cpu_one_hot}, .samples = [] {
    return std::vector<Sample>{
        {"1-d", {reference::randint({5}, 4, 940)}, OneHotParams{.num_classes = 4}},
        {"2-d", {reference::make({2, 3}, DType::Int64, {0, 5, 2, 2, 1, 4})}, OneHotParams{.num_classes = 6}},
        {"0-d", {reference::make({}, DType::Int64, {2})}, OneHotParams{.num_classes = 3}},
    };
  }, .reference = reference_one_hot});
  r.define(OpId::tril, {.name = "tril", .infer = infer_triangle, .kernels = {cpu_triangle<true>},
                        .backward = triangle_backward<OpId::tril>, .saves_inputs = false,
                        .samples = triangle_samples, .reference = reference_triangle<true>});
  r.define(OpId::triu, {.name = "triu", .infer = infer_triangle, .kernels = {cpu_triangle<false>},
                        .backward = triangle_backward<OpId::triu>, .saves_inputs = false,
                        .samples = triangle_samples, .reference = reference_triangle<false>});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim, Site site) {
  return call1<OpId::cat>(tensors, {.dim = dim}, site);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim, Site site) {
  MF_CHECK(!tensors.empty(), "stack: expects at least one tensor at {}", format_location(site));
  for (size_t i = 0; i < tensors.size(); ++i) {
    MF_CHECK(tensors[i].defined(), "stack: tensor {} is undefined at {}", i, format_location(site));
    MF_CHECK(tensors[i].shape() == tensors[0].shape(),
             "stack: tensor {} has shape {} but tensor 0 has shape {} (all must match) at {}", i,
             shape_str(tensors[i].shape()), shape_str(tensors[0].shape()), format_location(site));
  }
  int64_t position = 0;
  try {
    position = normalize_dim(dim, tensors[0].dim() + 1);
  } catch (const Error& error) {
    fail("stack: {} (stacking shape {}) at {}", error.what(), shape_str(tensors[0].shape()), format_location(site));
  }
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(position, site));
  return cat(parts, position, site);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Site site) {
  return call1<OpId::index_select>({x, index}, {.dim = dim}, site);
}

Tensor& index_select_out(Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, Site site) {
  // Only the CPU kernel moves slices within one buffer; elsewhere a kernel writing into x's own memory
  // reads a copy of it.
  const bool copy_first = x.defined() && out.defined() && !x.device().is_cpu() && x.storage() == out.storage();
  call_inplace<OpId::index_select>(out, {copy_first ? x.clone(site) : x, index}, {.dim = dim}, site);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Site site) {
  return call1<OpId::gather>({x, index}, {.dim = dim}, site);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Site site) {
  return call1<OpId::scatter_add>({x, index, src}, {.dim = dim}, site);
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, Site site) {
  std::vector<Tensor> out = call<OpId::topk>({x}, {.k = k, .dim = dim, .largest = largest}, site);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> log_softmax_topk(const Tensor& x, int64_t k, int64_t dim, bool largest, Site site) {
  if (!x.device().is_cpu()) return topk(log_softmax(x, dim, site), k, dim, largest, site);  // no fused kernel there
  std::vector<Tensor> out = call<OpId::log_softmax_topk>({x}, {.k = k, .dim = dim, .largest = largest}, site);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, Site site) {
  std::vector<Tensor> out = call<OpId::sort>({x}, {.dim = dim, .descending = descending}, site);
  return {out[0], out[1]};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, Site site) {
  return std::get<1>(sort(x, dim, descending, site));
}

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse, Site site) {
  return call1<OpId::cumsum>({x}, {.dim = dim, .reverse = reverse}, site);
}

Tensor Tensor::cumsum(int64_t dim, Site site) const { return mf::cumsum(*this, dim, false, site); }
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending, Site site) const {
  return mf::sort(*this, dim, descending, site);
}
Tensor Tensor::argsort(int64_t dim, bool descending, Site site) const { return mf::argsort(*this, dim, descending, site); }

Tensor one_hot(const Tensor& indices, int64_t num_classes, Site site) {
  return call1<OpId::one_hot>({indices}, {.num_classes = num_classes}, site);
}

Tensor tril(const Tensor& x, int64_t diagonal, Site site) {
  return call1<OpId::tril>({x}, {.diagonal = diagonal}, site);
}
Tensor triu(const Tensor& x, int64_t diagonal, Site site) {
  return call1<OpId::triu>({x}, {.diagonal = diagonal}, site);
}

}  // namespace mf
