// CUDA kernels of the fused nn ops: layer_norm (+ backward), embedding (+ backward) and dropout.
// The formulas are ops/nn_ops.cpp's (which documents them); N = rows, C = features per row,
// V = embedding rows. Row statistics fold in double, one block per row. dweight/dbias are summed by one
// thread per column over the rows in order; embedding's backward scatter-adds with atomics, so its
// float sums may round differently from run to run.
#include "core/generator.h"
#include "cuda/kernels.h"
#include "cuda/runtime.h"
#include "ops/kernel_api.h"

namespace mf::cuda {
namespace {

using detail::dense;

/// Sum of every thread's `value` over the block; all threads get it (all must call).
__device__ double block_sum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  double total = shared[0];
  __syncthreads();
  return total;
}

// ---- layer_norm -----------------------------------------------------------------------------------

template <typename T>
__global__ void layer_norm_kernel(const T* inp, const T* w, const T* b, T* out, T* mean, T* rstd, int64_t N,
                                  int64_t C, double eps) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = inp + n * C;  // [C]
    T shift = row[0];            // moments shifted by the first element, as on the CPU
    double s = 0, ss = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      double d = static_cast<double>(row[c] - shift);
      s += d;
      ss += d * d;
    }
    s = block_sum(s);
    ss = block_sum(ss);
    double m = s / static_cast<double>(C), var = fmax(ss / static_cast<double>(C) - m * m, 0.0);
    double r = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean[n] = static_cast<T>(shift + m);
      rstd[n] = static_cast<T>(r);
    }
    T centre = static_cast<T>(m), scale = static_cast<T>(r);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = ((row[c] - shift) - centre) * scale * w[c] + b[c];
  }
}

void layer_norm(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor x = dense(in[0]), weight = dense(in[1]), bias = dense(in[2]);
  const LayerNormParams& params = std::get<LayerNormParams>(attrs);
  int64_t N = out[1].numel(), C = shape_numel(params.normalized_shape);
  if (C == 0) return;
  visit_floating(x.dtype(), [&]<typename T>() {
    layer_norm_kernel<T><<<blocks_for_rows(N), kThreads, 0, stream(x.device().index)>>>(
        x.data_ptr<T>(), weight.data_ptr<T>(), bias.data_ptr<T>(), out[0].data_ptr<T>(), out[1].data_ptr<T>(),
        out[2].data_ptr<T>(), N, C, params.eps);
  });
  check_launch("layer_norm");
}

template <typename T>
__global__ void layer_norm_dx_kernel(const T* g, const T* inp, const T* mu, const T* rs, const T* dmu, const T* drs,
                                     const T* w, T* dinp, int64_t N, int64_t C) {
  double inv_c = 1.0 / static_cast<double>(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T *grow = g + n * C, *xrow = inp + n * C;  // [C]
    T m = mu[n], r = rs[n];
    double sum_g = 0, sum_gx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      sum_g += static_cast<double>(grow[c] * w[c]);
      sum_gx += static_cast<double>(grow[c] * w[c] * (xrow[c] - m));
    }
    sum_g = block_sum(sum_g);
    sum_gx = r * block_sum(sum_gx);
    double k_xhat = -(r * sum_gx + drs[n] * r * r) * inv_c;
    auto k_centred = static_cast<T>(k_xhat * r), k_const = static_cast<T>((dmu[n] - r * sum_g) * inv_c);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      dinp[n * C + c] = r * grow[c] * w[c] + k_centred * (xrow[c] - m) + k_const;
  }
}

template <typename T>
__global__ void layer_norm_dparams_kernel(const T* g, const T* inp, const T* mu, const T* rs, T* dweight, T* dbias,
                                          int64_t N, int64_t C) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < C; c += int64_t{gridDim.x} * blockDim.x) {
    double sw = 0, sb = 0;
    for (int64_t n = 0; n < N; ++n) {
      sw += static_cast<double>(g[n * C + c]) * ((inp[n * C + c] - mu[n]) * rs[n]);
      sb += g[n * C + c];
    }
    dweight[c] = static_cast<T>(sw);
    dbias[c] = static_cast<T>(sb);
  }
}

void layer_norm_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor dout = dense(in[0]), x = dense(in[1]), mean = dense(in[2]), rstd = dense(in[3]), weight = dense(in[4]),
         dmean = dense(in[5]), drstd = dense(in[6]);
  int64_t N = mean.numel(), C = shape_numel(std::get<LayerNormParams>(attrs).normalized_shape);
  if (C == 0) return;
  cudaStream_t s = stream(x.device().index);
  visit_floating(x.dtype(), [&]<typename T>() {
    const T *g = dout.data_ptr<T>(), *inp = x.data_ptr<T>(), *mu = mean.data_ptr<T>(), *rs = rstd.data_ptr<T>();
    if (N > 0)
      layer_norm_dx_kernel<T><<<blocks_for_rows(N), kThreads, 0, s>>>(g, inp, mu, rs, dmean.data_ptr<T>(),
                                                                 drstd.data_ptr<T>(), weight.data_ptr<T>(),
                                                                 out[0].data_ptr<T>(), N, C);
    layer_norm_dparams_kernel<T><<<blocks_for(C), kThreads, 0, s>>>(g, inp, mu, rs, out[1].data_ptr<T>(),
                                                                     out[2].data_ptr<T>(), N, C);
  });
  check_launch("layer_norm_backward");
}

// ---- embedding ------------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_kernel(const T* w, const int64_t* idx, T* out, int64_t N, int64_t C) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < N * C; k += int64_t{gridDim.x} * blockDim.x)
    out[k] = w[idx[k / C] * C + k % C];
}

void embedding(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor weight = dense(in[0]), indices = dense(in[1]);
  int64_t C = weight.size(1), N = indices.numel();
  visit_floating(weight.dtype(), [&]<typename T>() {
    embedding_kernel<T><<<blocks_for(N * C), kThreads, 0, stream(weight.device().index)>>>(
        weight.data_ptr<T>(), indices.data_ptr<int64_t>(), out[0].data_ptr<T>(), N, C);
  });
  check_launch("embedding");
}

template <typename T>
__global__ void embedding_backward_kernel(const T* g, const int64_t* idx, T* dw, int64_t N, int64_t C, int64_t pad) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < N * C; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t row = idx[k / C];
    if (row != pad) atomicAdd(dw + row * C + k % C, g[k]);
  }
}

void embedding_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor dout = dense(in[0]), indices = dense(in[1]);
  const EmbeddingBackwardParams& params = std::get<EmbeddingBackwardParams>(attrs);
  int64_t C = out[0].size(1), N = indices.numel();
  cudaStream_t s = stream(dout.device().index);
  if (!params.accumulate)  // else the rows add to what out holds (ops/nn_ops.cpp)
    MF_CUDA_CHECK(
        cudaMemsetAsync(out[0].raw_data(), 0, static_cast<size_t>(out[0].numel()) * out[0].element_size(), s));
  if (N * C == 0) return;
  visit_floating(dout.dtype(), [&]<typename T>() {
    embedding_backward_kernel<T><<<blocks_for(N * C), kThreads, 0, s>>>(
        dout.data_ptr<T>(), indices.data_ptr<int64_t>(), out[0].data_ptr<T>(), N, C, params.padding_idx);
  });
  check_launch("embedding_backward");
}

// ---- dropout --------------------------------------------------------------------------------------

template <typename T>
__global__ void dropout_kernel(const T* inp, T* out, int64_t numel, uint64_t seed, uint64_t counter, double p,
                               T scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < numel; i += int64_t{gridDim.x} * blockDim.x) {
    auto bits = Philox::block(seed, 0, counter + static_cast<uint64_t>(i / 4));
    out[i] = inp[i] * (static_cast<double>(uniform_float(bits[i % 4])) >= p ? scale : T{0});
  }
}

void dropout(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor x = dense(in[0]);
  const DropoutParams& dropout = std::get<DropoutParams>(attrs);
  double p = dropout.p;
  visit_floating(x.dtype(), [&]<typename T>() {
    T scale = p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T{0};
    dropout_kernel<T><<<blocks_for(x.numel()), kThreads, 0, stream(x.device().index)>>>(
        x.data_ptr<T>(), out[0].data_ptr<T>(), x.numel(), dropout.stream.seed, dropout.stream.counter, p, scale);
  });
  check_launch("dropout");
}

}  // namespace

void register_nn(Registry& r) {
  r.set_kernel(OpId::layer_norm, DeviceType::CUDA, layer_norm);
  r.set_kernel(OpId::layer_norm_backward, DeviceType::CUDA, layer_norm_backward);
  r.set_kernel(OpId::embedding, DeviceType::CUDA, embedding);
  r.set_kernel(OpId::embedding_backward, DeviceType::CUDA, embedding_backward);
  r.set_kernel(OpId::dropout, DeviceType::CUDA, dropout);
}

}  // namespace mf::cuda
