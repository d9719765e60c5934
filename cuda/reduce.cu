// CUDA kernels of sum, mean, var, amax and amin over any set of dims, and of max_dim, min_dim and
// argmax along one. The input is laid out as [outer, n, inner] by the same reduce_layout as the CPU
// kernels (a view, or a copy with the reduced dims moved last), then each output element folds its
// n values (cuda/fold.cuh).
#include "cuda/fold.cuh"
#include "cuda/kernels.h"
#include "ops/kernel_api.h"

#include <type_traits>

namespace mf::cuda {
namespace {

template <typename T>
struct SquaredDeviation {
  T mean;
  __device__ T operator()(T x) const { return (x - mean) * (x - mean); }
};

struct SumOp {
  template <typename T, typename Fold> __device__ static T run(const Fold& fold, int64_t, int64_t) {
    return fold(T(0), Plus{}, Identity{});
  }
};
// Means of no elements are 0 / 0 = NaN, as in PyTorch.
struct MeanOp {
  template <typename T, typename Fold> __device__ static T run(const Fold& fold, int64_t n, int64_t) {
    return fold(T(0), Plus{}, Identity{}) / static_cast<T>(n);
  }
};
// Two passes (the mean, then squared deviations), as on the CPU.
struct VarOp {
  template <typename T, typename Fold> __device__ static T run(const Fold& fold, int64_t n, int64_t correction) {
    T mean = fold(T(0), Plus{}, Identity{}) / static_cast<T>(n);
    T divisor = static_cast<T>(n - correction > 0 ? n - correction : 0);
    return fold(T(0), Plus{}, SquaredDeviation<T>{mean}) / divisor;
  }
};
// n >= 1 (the front refuses empty extremes): the first value seeds the fold.
template <bool Greater>
struct ExtremeOp {
  template <typename T, typename Fold> __device__ static T run(const Fold& fold, int64_t, int64_t) {
    return fold(fold.p[0], Extreme<Greater>{}, Identity{});
  }
};

template <typename Op, typename T>
struct ReduceRow {
  T* out;  // [outer * inner]
  int64_t n, correction;
  template <typename Fold>
  __device__ void operator()(const Fold& fold, int64_t, int64_t k) const {
    T value = Op::template run<T>(fold, n, correction);
    out[k] = value;
  }
};

/// The first index holding the extreme along the dim (NaN counting as the extreme), and for max_dim /
/// min_dim the extreme itself. The leader thread finds the index by a scan in order.
template <bool Greater, typename T>
struct ArgExtremeRow {
  T* values;         // [outer * inner], null for argmax
  int64_t* indices;  // [outer * inner]
  template <typename Fold>
  __device__ void operator()(const Fold& fold, int64_t, int64_t k) const {
    T best = ExtremeOp<Greater>::template run<T>(fold, fold.n, 0);
    if (!fold.leader()) return;
    auto holds = [best](T v) { return v == best || (best != best && v != v); };
    int64_t r = 0;
    while (!holds(fold.p[r * fold.stride])) ++r;
    indices[k] = r;
    if (values) values[k] = best;
  }
};

template <bool Greater>
void arg_extreme(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const auto& [dim, keepdim] = std::get<ReduceDimParams>(attrs);
  ReduceLayout layout = reduce_layout(in[0], plan_reduction(in[0], {dim}, keepdim));
  visit_dtype(in[0].dtype(), [&]<typename T>() {
    const T* data = static_cast<const T*>(layout.data.raw_data());  // [outer, n, inner]
    ArgExtremeRow<Greater, T> row{out.size() == 2 ? out[0].data_ptr<T>() : nullptr, out.back().data_ptr<int64_t>()};
    fold_layout<T>(in[0].device().index, data, layout.outer, layout.n, layout.inner, row);
  });
}

/// out = Op over each output element's values. Arithmetic ops skip bool (sum reads bool as int64).
template <typename Op, bool kArithmetic = true>
void reduce(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const ReduceParams& params = reduction_of(attrs);
  ReduceLayout layout = reduce_layout(in[0].to(out[0].dtype()), plan_reduction(in[0], params.dims, params.keepdim));
  const auto* var = std::get_if<VarParams>(&attrs);
  int64_t correction = var != nullptr ? var->correction : 0;  // only var's fold reads it
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (!(kArithmetic && std::is_same_v<T, bool>)) {
      const T* data = static_cast<const T*>(layout.data.raw_data());  // [outer, n, inner]
      ReduceRow<Op, T> row{out[0].data_ptr<T>(), layout.n, correction};
      fold_layout<T>(out[0].device().index, data, layout.outer, layout.n, layout.inner, row);
    }
  });
}

}  // namespace

void register_reduce(Registry& r) {
  r.set_kernel(OpId::sum, DeviceType::CUDA, reduce<SumOp>);
  r.set_kernel(OpId::mean, DeviceType::CUDA, reduce<MeanOp>);
  r.set_kernel(OpId::var, DeviceType::CUDA, reduce<VarOp>);
  r.set_kernel(OpId::amax, DeviceType::CUDA, reduce<ExtremeOp<true>, false>);
  r.set_kernel(OpId::amin, DeviceType::CUDA, reduce<ExtremeOp<false>, false>);
  r.set_kernel(OpId::max_dim, DeviceType::CUDA, arg_extreme<true>);
  r.set_kernel(OpId::min_dim, DeviceType::CUDA, arg_extreme<false>);
  r.set_kernel(OpId::argmax, DeviceType::CUDA, arg_extreme<true>);
}

}  // namespace mf::cuda
