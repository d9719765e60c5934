// CUDA kernels of softmax and log_softmax along one dim: per row, a fold for the max, one for the sum
// of exp(x - max), then one write per element. Rows are laid out by reduce_layout as on the CPU.
#include "cuda/fold.cuh"
#include "cuda/kernels.h"
#include "ops/kernel_api.h"

#include <cmath>

namespace mf::cuda {
namespace {

template <typename T>
struct ExpShifted {
  T shift;
  __device__ T operator()(T x) const { return exp(x - shift); }
};

template <typename T, bool Log>
struct SoftmaxRow {
  const T* inp;  // [outer, n, inner]
  T* out;        // [outer, n, inner]
  template <typename Fold>
  __device__ void operator()(const Fold& fold, int64_t base, int64_t) const {
    T max = fold(fold.p[0], Extreme<true>{}, Identity{});
    T sum = fold(T(0), Plus{}, ExpShifted<T>{max});
    T log_sum = log(sum);
    const T* x = inp + base;
    T* y = out + base;
    fold.each([=](int64_t offset) { y[offset] = Log ? x[offset] - max - log_sum : exp(x[offset] - max) / sum; });
  }
};

template <bool Log>
void softmax(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  ReduceLayout layout = reduce_layout(in[0], plan_reduction(in[0], {std::get<DimParams>(attrs).dim}, false));
  if (layout.n == 0) return;
  visit_floating(out[0].dtype(), [&]<typename T>() {
    const T* inp = layout.data.data_ptr<T>();
    SoftmaxRow<T, Log> row{inp, out[0].data_ptr<T>()};
    fold_layout<T>(out[0].device().index, inp, layout.outer, layout.n, layout.inner, row);
  });
}

}  // namespace

void register_softmax(Registry& r) {
  r.set_kernel(OpId::softmax, DeviceType::CUDA, softmax<false>);
  r.set_kernel(OpId::log_softmax, DeviceType::CUDA, softmax<true>);
}

}  // namespace mf::cuda
