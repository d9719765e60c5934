// CUDA kernels of cross_entropy and its backward op, fused as on the CPU (ops/cross_entropy.cpp
// documents the formulas): one block per row of logits [N, C]. The forward computes a max-shifted
// log-sum-exp in double, then the row's loss; the backward reuses that log-sum-exp.
#include "cuda/fold.cuh"
#include "cuda/kernels.h"
#include "ops/kernel_api.h"

namespace mf::cuda {
namespace {

using detail::dense;

/// log(sum_c exp(row_c)) of one row, shifted by its max; every thread of the block gets it.
template <typename T>
__device__ double log_sum_exp(const T* row, int64_t C) {
  BlockFold<T> fold{row, C, 1};
  T top = fold(row[0], Extreme<true>{}, Identity{});
  __shared__ double shared[kThreads];
  double total = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) total += exp(static_cast<double>(row[c] - top));
  shared[threadIdx.x] = total;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  total = shared[0];
  __syncthreads();
  return static_cast<double>(top) + log(total);
}

template <typename T>
__global__ void cross_entropy_kernel(const T* x, const int64_t* t, T* loss, T* lse_out, int64_t N, int64_t C,
                                     double e, int64_t ignore_index) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    if (t[n] == ignore_index) {  // the same for the whole block, so no thread skips a barrier alone
      if (threadIdx.x == 0) loss[n] = lse_out[n] = T{0};
      continue;
    }
    const T* row = x + n * C;  // [C]
    double lse = log_sum_exp(row, C);
    double logits_sum = BlockFold<T>{row, C, 1}(T{0}, Plus{}, Identity{});
    double value = (1 - e) * (lse - static_cast<double>(row[t[n]]));
    if (e != 0) value += e * (lse - logits_sum / static_cast<double>(C));
    if (threadIdx.x == 0) {
      loss[n] = static_cast<T>(value);
      lse_out[n] = static_cast<T>(lse);
    }
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* dl, const T* x, const int64_t* t, const T* lse_of,
                                              const T* dlse, T* dx, int64_t N, int64_t C, double e,
                                              int64_t ignore_index) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    T* drow = dx + n * C;  // [C]
    if (t[n] == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) drow[c] = T{0};
      continue;
    }
    const T* row = x + n * C;
    T lse = lse_of[n], g = dl[n], g_softmax = g + dlse[n], hit = g * static_cast<T>(1 - e);
    T g_share = g * static_cast<T>(e / static_cast<double>(C));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T value = g_softmax * exp(row[c] - lse) - g_share;
      drow[c] = c == t[n] ? value - hit : value;
    }
  }
}

void cross_entropy(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor logits = dense(in[0]), target = dense(in[1]);
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  int64_t N = logits.size(0), C = logits.size(1);
  visit_floating(logits.dtype(), [&]<typename T>() {
    cross_entropy_kernel<T><<<blocks_for_rows(N), kThreads, 0, stream(logits.device().index)>>>(
        logits.data_ptr<T>(), target.data_ptr<int64_t>(), out[0].data_ptr<T>(), out[1].data_ptr<T>(), N, C,
        params.label_smoothing, params.ignore_index);
  });
  check_launch("cross_entropy");
}

void cross_entropy_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor dloss = dense(in[0]), logits = dense(in[1]), target = dense(in[2]), lse = dense(in[3]), dlse = dense(in[4]);
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  int64_t N = logits.size(0), C = logits.size(1);
  visit_floating(logits.dtype(), [&]<typename T>() {
    cross_entropy_backward_kernel<T><<<blocks_for_rows(N), kThreads, 0, stream(logits.device().index)>>>(
        dloss.data_ptr<T>(), logits.data_ptr<T>(), target.data_ptr<int64_t>(), lse.data_ptr<T>(), dlse.data_ptr<T>(),
        out[0].data_ptr<T>(), N, C, params.label_smoothing, params.ignore_index);
  });
  check_launch("cross_entropy_backward");
}

}  // namespace

void register_loss(Registry& r) {
  r.set_kernel(OpId::cross_entropy, DeviceType::CUDA, cross_entropy);
  r.set_kernel(OpId::cross_entropy_backward, DeviceType::CUDA, cross_entropy_backward);
}

}  // namespace mf::cuda
