// CUDA kernels of the indexing and joining ops: cat, index_select, gather, scatter_add, topk, sort,
// cumsum, one_hot, tril and triu (ops/index.cpp documents each). Operands keep their strides: gather-like kernels walk
// the output with a DevicePlan whose x operand has the indexed dim's stride zeroed, and add
// index * stride. Index values are checked on the host before any kernel runs (one copy of the
// index), so a bad one raises the CPU's error. scatter_add accumulates with atomics, so its float sums
// may round differently from run to run; topk and sort rank every element against its fiber in
// parallel; cumsum runs one thread per fiber, summing in the CPU's order and precision.
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

#include <type_traits>

namespace mf::cuda {
namespace {

/// t's memory read with another shape and strides (a view the dispatcher never sees).
Tensor restrided(const Tensor& t, const Shape& shape, const Shape& strides) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), shape, strides, t.offset(), t.dtype()));
}

/// The first index value outside [0, size), checked on the host as on the CPU.
void check_index_range(const Tensor& index, int64_t dim, const Tensor& x) {
  int64_t size = x.shape()[dim];
  for (int64_t value : index.to_vector<int64_t>())
    MF_CHECK(value >= 0 && value < size, "index {} is out of range for dim {} of size {} (shape {})", value, dim,
             size, shape_str(x.shape()));
}

// ---- cat ------------------------------------------------------------------------------------------

void cat(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor& o = out[0];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, o.dim()), start = 0;
  visit_dtype(o.dtype(), [&]<typename T>() {
    for (const Tensor& t : in) {
      Tensor window(std::make_shared<TensorImpl>(o.storage(), t.shape(), o.strides(),
                                                 o.offset() + start * o.strides()[dim], o.dtype()));
      map<T, T>(window, {&t}, Identity{});
      start += t.shape()[dim];
    }
  });
}

// ---- index_select, gather, scatter_add --------------------------------------------------------------

/// out[p] = x[p with dim replaced by index[p]]: operands {out, x (dim stride 0), index}.
template <typename T>
__global__ void gather_kernel(DevicePlan<3> plan, int64_t dim_stride_bytes) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    plan.offsets(i, off);
    int64_t at = *reinterpret_cast<const int64_t*>(plan.base[2] + off[2]);
    *reinterpret_cast<T*>(plan.base[0] + off[0]) =
        *reinterpret_cast<const T*>(plan.base[1] + off[1] + at * dim_stride_bytes);
  }
}

/// out = x gathered along dim by `index` read as out's shape through `index_strides`.
void gather_along(Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, const Shape& index_strides) {
  Shape x_strides = x.strides();
  x_strides[dim] = 0;
  Tensor xs = restrided(x, out.shape(), x_strides), is = restrided(index, out.shape(), index_strides);
  DevicePlan<3> plan = plan_for<3>(out.shape(), {&out, &xs, &is});
  int64_t step = x.strides()[dim] * static_cast<int64_t>(x.element_size());
  visit_any_dtype(x.dtype(), [&]<typename T>() {
    gather_kernel<T><<<blocks_for(plan.numel), kThreads, 0, stream(out.device().index)>>>(plan, step);
  });
  check_launch("gather");
}

void index_select(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  check_index_range(index, dim, x);
  Shape index_strides(static_cast<size_t>(x.dim()), 0);  // the 1-D index, broadcast over the other dims
  index_strides[dim] = index.dim() == 1 ? index.strides()[0] : 0;
  gather_along(out[0], x, dim, index, index_strides);
}

void gather(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1];
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  check_index_range(index, dim, x);
  gather_along(out[0], x, dim, index, index.strides());
}

template <typename T>
__device__ void atomic_add(T* target, T value) {
  if constexpr (std::is_same_v<T, int64_t>)
    atomicAdd(reinterpret_cast<unsigned long long*>(target), static_cast<unsigned long long>(value));
  else
    atomicAdd(target, value);
}

/// out[p with dim = index[p]] += src[p] over the index's shape: operands {out (dim stride 0), index, src}.
template <typename T>
__global__ void scatter_add_kernel(DevicePlan<3> plan, int64_t dim_stride_bytes) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    plan.offsets(i, off);
    int64_t at = *reinterpret_cast<const int64_t*>(plan.base[1] + off[1]);
    atomic_add(reinterpret_cast<T*>(plan.base[0] + off[0] + at * dim_stride_bytes),
               *reinterpret_cast<const T*>(plan.base[2] + off[2]));
  }
}

void scatter_add(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  Tensor& o = out[0];  // contiguous
  int64_t dim = normalize_dim(std::get<DimParams>(attrs).dim, x.dim());
  check_index_range(index, dim, x);
  visit_dtype(o.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      map<T, T>(o, {&x}, Identity{});
      if (index.numel() == 0) return;
      Shape o_strides = o.strides();
      o_strides[dim] = 0;
      Tensor os = restrided(o, index.shape(), o_strides), ss = restrided(src, index.shape(), src.strides());
      DevicePlan<3> plan = plan_for<3>(index.shape(), {&os, &index, &ss});
      int64_t step = o.strides()[dim] * static_cast<int64_t>(o.element_size());
      scatter_add_kernel<T><<<blocks_for(plan.numel), kThreads, 0, stream(o.device().index)>>>(plan, step);
      check_launch("scatter_add");
    }
  });
}

// ---- topk -----------------------------------------------------------------------------------------

/// Whether (a at ia) is listed before (b at ib): NaN ranks as the largest value, ties go to the lower
/// index (as the CPU's ranks_before).
template <typename T, bool Largest>
__device__ bool ranks_before(T a, int64_t ia, T b, int64_t ib) {
  if constexpr (std::is_floating_point_v<T>) {
    bool a_nan = a != a, b_nan = b != b;
    if (a_nan || b_nan) return a_nan == b_nan ? ia < ib : (a_nan == Largest);
  }
  if (a != b) return Largest ? a > b : a < b;
  return ia < ib;
}

/// One thread per element: its rank in its fiber is the number of elements listed before it; ranks
/// below k are written. Operands {x with dim size 1 (the fiber starts), values, indices} over the
/// fibers, each fiber `size` long with strides sx, sv, si (bytes) along dim.
template <typename T, bool Largest>
__global__ void topk_kernel(DevicePlan<3> fibers, int64_t size, int64_t k, int64_t sx, int64_t sv, int64_t si) {
  int64_t total = fibers.numel * size;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    int64_t f = e / size, j = e % size;
    int64_t off[3];
    fibers.offsets(f, off);
    const char* fiber = fibers.base[0] + off[0];
    T value = *reinterpret_cast<const T*>(fiber + j * sx);
    int64_t rank = 0;
    for (int64_t m = 0; m < size && rank < k; ++m)
      rank += ranks_before<T, Largest>(*reinterpret_cast<const T*>(fiber + m * sx), m, value, j);
    if (rank >= k) continue;
    *reinterpret_cast<T*>(fibers.base[1] + off[1] + rank * sv) = value;
    *reinterpret_cast<int64_t*>(fibers.base[2] + off[2] + rank * si) = j;
  }
}

void topk(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  if (out[0].numel() == 0) return;
  const TopKParams& params = std::get<TopKParams>(attrs);
  int64_t dim = normalize_dim(params.dim, x.dim()), size = x.shape()[dim];
  Shape fiber_shape = x.shape();
  fiber_shape[dim] = 1;
  auto starts = [&](const Tensor& t) { return restrided(t, fiber_shape, t.strides()); };
  Tensor xf = starts(x), vf = starts(out[0]), jf = starts(out[1]);
  DevicePlan<3> fibers = plan_for<3>(fiber_shape, {&xf, &vf, &jf});
  auto bytes = [&](const Tensor& t) { return t.strides()[dim] * static_cast<int64_t>(t.element_size()); };
  visit_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      auto kernel = params.largest ? topk_kernel<T, true> : topk_kernel<T, false>;
      kernel<<<blocks_for(fibers.numel * size), kThreads, 0, stream(x.device().index)>>>(
          fibers, size, params.k, bytes(x), bytes(out[0]), bytes(out[1]));
    }
  });
  check_launch("topk");
}

void sort(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const SortParams& params = std::get<SortParams>(attrs);
  int64_t dim = normalize_dim(params.dim, in[0].dim());
  topk(in, out, TopKParams{.k = in[0].shape()[dim], .dim = dim, .largest = params.descending});
}

// ---- cumsum ---------------------------------------------------------------------------------------

/// One thread per fiber: the running sum along it, in Acc (double for floats, int64 otherwise).
/// Operands {x with dim size 1 (the fiber starts), out}; sx, so the byte strides along dim.
template <typename T, typename Out>
__global__ void cumsum_kernel(DevicePlan<2> fibers, int64_t size, int64_t sx, int64_t so, bool reverse) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  for (int64_t f = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; f < fibers.numel; f += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    fibers.offsets(f, off);
    Acc running = 0;
    for (int64_t step = 0; step < size; ++step) {
      int64_t j = reverse ? size - 1 - step : step;
      running += static_cast<Acc>(*reinterpret_cast<const T*>(fibers.base[0] + off[0] + j * sx));
      *reinterpret_cast<Out*>(fibers.base[1] + off[1] + j * so) = static_cast<Out>(running);
    }
  }
}

void cumsum(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const auto& [dim_attr, reverse] = std::get<CumsumParams>(attrs);
  if (in[0].numel() == 0) return;
  // A 0-dim tensor is one fiber of one element.
  const Tensor x = in[0].dim() == 0 ? restrided(in[0], {1}, {1}) : in[0];
  const Tensor o = out[0].dim() == 0 ? restrided(out[0], {1}, {1}) : out[0];
  int64_t dim = normalize_dim(dim_attr, x.dim()), size = x.shape()[dim];
  Shape fiber_shape = x.shape();
  fiber_shape[dim] = 1;
  Tensor xf = restrided(x, fiber_shape, x.strides()), of = restrided(o, fiber_shape, o.strides());
  DevicePlan<2> fibers = plan_for<2>(fiber_shape, {&xf, &of});
  auto bytes = [&](const Tensor& t) { return t.strides()[dim] * static_cast<int64_t>(t.element_size()); };
  visit_dtype(x.dtype(), [&]<typename T>() {
    using Out = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
    cumsum_kernel<T, Out><<<blocks_for(fibers.numel), kThreads, 0, stream(x.device().index)>>>(
        fibers, size, bytes(x), bytes(o), reverse);
  });
  check_launch("cumsum");
}

// ---- one_hot, tril, triu ----------------------------------------------------------------------------

__global__ void one_hot_kernel(const int64_t* idx, int64_t* out, int64_t count, int64_t classes) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * classes;
       e += int64_t{gridDim.x} * blockDim.x)
    out[e] = idx[e / classes] == e % classes ? 1 : 0;
}

void one_hot(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor indices = in[0].contiguous();
  int64_t num_classes = std::get<OneHotParams>(attrs).num_classes;
  for (int64_t value : indices.to_vector<int64_t>()) {
    MF_CHECK(value >= 0, "class index {} is negative (indices of shape {})", value, shape_str(indices.shape()));
    MF_CHECK(value < num_classes, "class index {} is out of range for num_classes = {} (indices of shape {})", value,
             num_classes, shape_str(indices.shape()));
  }
  one_hot_kernel<<<blocks_for(out[0].numel()), kThreads, 0, stream(indices.device().index)>>>(
      indices.data_ptr<int64_t>(), out[0].data_ptr<int64_t>(), indices.numel(), num_classes);
  check_launch("one_hot");
}

/// Keeps x[..., i, j] where j - i <= k (Lower) or j - i >= k; zeroes the rest. Operands {out, x}.
template <typename T, bool Lower>
__global__ void triangle_kernel(DevicePlan<2> plan, int64_t rows, int64_t cols, int64_t k) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < plan.numel; e += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    plan.offsets(e, off);
    int64_t j = e % cols, i = (e / cols) % rows;
    bool keep = Lower ? j - i <= k : j - i >= k;
    *reinterpret_cast<T*>(plan.base[0] + off[0]) = keep ? *reinterpret_cast<const T*>(plan.base[1] + off[1]) : T{};
  }
}

template <bool Lower>
void triangle(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& x = in[0];
  DevicePlan<2> plan = plan_for<2>(out[0].shape(), {&out[0], &x});
  visit_dtype(x.dtype(), [&]<typename T>() {
    triangle_kernel<T, Lower><<<blocks_for(plan.numel), kThreads, 0, stream(x.device().index)>>>(
        plan, x.size(-2), x.size(-1), std::get<TriangleParams>(attrs).diagonal);
  });
  check_launch(Lower ? "tril" : "triu");
}

}  // namespace

void register_index(Registry& r) {
  r.set_kernel(OpId::cat, DeviceType::CUDA, cat);
  r.set_kernel(OpId::index_select, DeviceType::CUDA, index_select);
  r.set_kernel(OpId::gather, DeviceType::CUDA, gather);
  r.set_kernel(OpId::scatter_add, DeviceType::CUDA, scatter_add);
  r.set_kernel(OpId::topk, DeviceType::CUDA, topk);
  r.set_kernel(OpId::sort, DeviceType::CUDA, sort);
  r.set_kernel(OpId::cumsum, DeviceType::CUDA, cumsum);
  r.set_kernel(OpId::one_hot, DeviceType::CUDA, one_hot);
  r.set_kernel(OpId::tril, DeviceType::CUDA, triangle<true>);
  r.set_kernel(OpId::triu, DeviceType::CUDA, triangle<false>);
}

}  // namespace mf::cuda
