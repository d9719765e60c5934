// Scaled dot-product attention as one op: q [B, H, T, D] over k, v [B, H, S, D], with an additive mask
// broadcast to [B, H, T, S] and dropout on the weights. Per (batch, head) pair the T x S scores stay
// in one block in cache from the GEMM through scale, mask, softmax and dropout to the GEMM with v,
// where the composition of ops makes a [B, H, T, S] pass of its own for each step; pairs split over
// threads. Outputs: the result with the heads interleaved, [B, T, H, D] (merging the heads for the
// output projection is then a view), and the weights before dropout, [B, H, T, S], kept for backward.
// DropoutParams: p and its Philox stream, read as dropout reads them over a
// contiguous [B, H, T, S] tensor, so that the fused op drops exactly the weights that
// dropout(weights) drops on the same stream. Every output and gradient is written (=), none
// accumulated.
//
// Axes: B = batch, H = heads, T = queries, S = keys, D = head dim.
//
// Backward, with W the weights, P = dropout(W) (`kept` below) and dP its gradient (`dkept`, the
// dropout mask replayed on it):
//   dV = P^T dO,  dP = dO V^T,  dW = dropout(dP) + (the weights output's gradient, where one flows),
//   dS = W * (dW - rowsum(dW * W)) / sqrt(D),  dQ = dS K,  dK = dS^T Q.
// The references below compute the same by plain loops. The backward op is not differentiable
// itself (as cross_entropy_backward): no second derivatives; nor is the mask (a mask that needs a
// gradient is refused here: scaled_dot_product_attention composes ops for it).
#include "ops/cpu/blas.h"
#include "ops/families.h"
#include "ops/cpu/dropout.h"
#include "ops/kernel_checks.h"
#include "ops/functional.h"
#include "ops/reference.h"
#include "ops/cpu/softmax_row.h"

#include "core/parallel.h"

#include <cmath>
#include <cstring>

namespace mf {
namespace {

using namespace detail;
using cpu::gemm;

void check_attention_operands(const Tensor& q, const Tensor& k, const Tensor& v) {
  MF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "expects q [B, H, T, D] and k, v [B, H, S, D], got {}, {} and {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  MF_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
           "expects q, k and v of one float dtype, got {}, {} and {}", dtype_name(q.dtype()), dtype_name(k.dtype()),
           dtype_name(v.dtype()));
  MF_CHECK(k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
           "q {}, k {} and v {} do not fit: k and v must be [{}, {}, S, {}]", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()), q.size(0), q.size(1), q.size(3));
  MF_CHECK(q.size(3) > 0, "needs a head dim D of at least 1, got q {}", shape_str(q.shape()));
}

/// [B, H, T, S] for q [B, H, T, D] and k [B, H, S, D].
Shape weights_shape(const Tensor& q, const Tensor& k) { return {q.size(0), q.size(1), q.size(2), k.size(2)}; }

std::vector<OutputSpec> infer_attention(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &mask = in[3];
  check_attention_operands(q, k, in[2]);
  Shape weights = weights_shape(q, k);
  MF_CHECK(mask.dtype() == q.dtype(), "expects an attn_mask of dtype {} (the operands'), got {}",
           dtype_name(q.dtype()), dtype_name(mask.dtype()));
  MF_CHECK(broadcasts_to(mask.shape(), weights),
           "attn_mask {} does not broadcast to the weights [B, H, T, S] = {}", shape_str(mask.shape()),
           shape_str(weights));
  MF_CHECK(!(mask.requires_grad() && grad_mode_enabled()),
           "does not differentiate attn_mask {}; scaled_dot_product_attention composes ops for a mask that "
           "needs a gradient",
           shape_str(mask.shape()));
  double p = std::get<DropoutParams>(attrs).p;
  MF_CHECK(p >= 0 && p <= 1, "dropout probability p must be in [0, 1], got {}", p);
  return {{{q.size(0), q.size(2), q.size(1), q.size(3)}, q.dtype()}, {weights, q.dtype()}};
}

/// t itself where BLAS can read each (batch, head) matrix in place (unit steps along D, rows at least
/// D apart; the step along a dim of size 1 is never taken, whatever it is), else a dense copy.
Tensor blas_readable(const Tensor& t) {
  bool readable = (t.size(3) == 1 || t.stride(3) == 1) && (t.size(2) == 1 || t.stride(2) >= t.size(3));
  return readable ? t : dense(t);
}

/// Where the (batch, head) matrices of a [B, H, L, D] operand start, and how far apart their rows are.
template <typename T>
struct HeadMatrices {
  explicit HeadMatrices(const Tensor& t)
      : data(static_cast<const T*>(t.raw_data())), batch_stride(t.stride(0)), head_stride(t.stride(1)),
        row_stride(t.size(2) == 1 ? t.size(3) : t.stride(2)) {}
  const T* at(int64_t b, int64_t h) const { return data + b * batch_stride + h * head_stride; }
  const T* data;
  int64_t batch_stride, head_stride, row_stride;
};

/// Queries per (batch, head) up to which attention computes its dot products and weighted sums itself:
/// incremental decoding asks for one (or one per beam) at a time, where a GEMM call per pair costs
/// more than its arithmetic.
constexpr int64_t kDirectQueries = 8;

/// For each query q < Queries: out[q * out_stride + offsets[u] + lane] = sum_r factor(q, r) *
/// rows[r][offsets[u] + lane] for Count packs P, summed in registers (a sum through memory would wait on
/// each store). The queries share each load of the rows, and their Queries x Count chains interleave:
/// one query's chains alone wait on the adder's latency. Each sum runs over r in order, as one query's
/// would alone, so grouping queries never changes a bit.
template <typename P, int Count, int Queries, typename E, typename Factor>
MF_INLINE void weighted_packs(E* out, int64_t out_stride, const E* rows, int64_t stride, int64_t count,
                              const int64_t (&offsets)[4], Factor factor) {
  P acc[Queries][Count] = {};
  for (int64_t r = 0; r < count; ++r) {
    P row[Count];
    for (int u = 0; u < Count; ++u) row[u] = cpu::load<P>(rows + r * stride + offsets[u]);
    for (int q = 0; q < Queries; ++q) {
      const E f = factor(q, r);
      for (int u = 0; u < Count; ++u) acc[q][u] += f * row[u];
    }
  }
  for (int q = 0; q < Queries; ++q)
    for (int u = 0; u < Count; ++u) std::memcpy(out + q * out_stride + offsets[u], &acc[q][u], sizeof(P));
}

/// For each query q < Queries: out[q * out_stride + c] = sum_r factor(q, r) * rows[r][c], c < n, over
/// `count` rows `stride` apart, four packs of columns at a time. The columns after the last such four
/// are taken in up to four packs, the last one ending at n and overlapping its neighbour where n is not
/// a whole number of packs: an overlapped column is summed twice, each time the same chain over r, and
/// stored twice with the same bits. A row narrower than a pack takes half-width packs, down to 16
/// bytes; then scalars.
template <typename E, int W, int Queries, typename Factor>
MF_INLINE void weighted_row_sums(E* out, int64_t out_stride, const E* rows, int64_t stride, int64_t count, int64_t n,
                                 Factor factor) {
  using P = cpu::Pack<E, W>;
  constexpr int64_t kWidth = cpu::kPackWidth<E, W>;
  if (n < kWidth) {
    if constexpr (W > cpu::kBaselineWidth)
      return weighted_row_sums<E, W / 2, Queries>(out, out_stride, rows, stride, count, n, factor);
    for (int q = 0; q < Queries; ++q)
      for (int64_t c = 0; c < n; ++c) {
        E acc{0};
        for (int64_t r = 0; r < count; ++r) acc += factor(q, r) * rows[r * stride + c];
        out[q * out_stride + c] = acc;
      }
    return;
  }
  int64_t c = 0;
  for (; c + 4 * kWidth <= n; c += 4 * kWidth)
    weighted_packs<P, 4, Queries>(out, out_stride, rows, stride, count, {c, c + kWidth, c + 2 * kWidth, c + 3 * kWidth},
                                  factor);
  if (c == n) return;
  const int64_t packs = (n - c + kWidth - 1) / kWidth, last = n - kWidth;
  const int64_t offsets[4] = {std::min(c, last), std::min(c + kWidth, last), std::min(c + 2 * kWidth, last), last};
  switch (packs) {
    case 1: return weighted_packs<P, 1, Queries>(out, out_stride, rows, stride, count, offsets, factor);
    case 2: return weighted_packs<P, 2, Queries>(out, out_stride, rows, stride, count, offsets, factor);
    case 3: return weighted_packs<P, 3, Queries>(out, out_stride, rows, stride, count, offsets, factor);
    default: return weighted_packs<P, 4, Queries>(out, out_stride, rows, stride, count, offsets, factor);
  }
}

/// weighted_row_sums for `queries` queries (at most kDirectQueries), in groups as wide as the registers
/// hold: 4 x 4 accumulators fit AVX-512's 32 registers; 16-register paths take 2 at a time.
template <typename E, int W, typename Factor>
MF_INLINE void weighted_row_sums(int64_t queries, E* out, int64_t out_stride, const E* rows, int64_t stride,
                                 int64_t count, int64_t n, Factor factor) {
  constexpr int kGroup = W >= 64 ? 4 : 2;
  int64_t q0 = 0;
  auto group_factor = [&](int64_t first) {
    return [&factor, first](int q, int64_t r) MF_LAMBDA_INLINE { return factor(first + q, r); };
  };
  for (; q0 + kGroup <= queries; q0 += kGroup)
    weighted_row_sums<E, W, kGroup>(out + q0 * out_stride, out_stride, rows, stride, count, n, group_factor(q0));
  for (; q0 < queries; ++q0)
    weighted_row_sums<E, W, 1>(out + q0 * out_stride, out_stride, rows, stride, count, n, group_factor(q0));
}

/// sum_d a[d] * b[d] over n elements, in vectors of W bytes.
template <typename E, int W>
MF_INLINE E dot(const E* a, const E* b, int64_t n) {
  return static_cast<E>(cpu::pack_sum<E, W>(n, [&]<typename P>(int64_t c) MF_LAMBDA_INLINE {
    return cpu::load<P>(a + c) * cpu::load<P>(b + c);
  }));
}

void cpu_attention(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const int64_t T = in[0].size(2);
  // Keys laid out by column (a transposed view of [B, H, D, S], as a decoding cache keeps them) are
  // read in place when the scores are computed directly: each query's scores are then a sum of D
  // vectors along S, with no horizontal sums. Otherwise BLAS wants rows.
  const bool keys_by_column = T <= kDirectQueries && in[1].stride(2) == 1 && in[1].stride(3) != 1;
  Tensor q = blas_readable(in[0]), k = keys_by_column ? in[1] : blas_readable(in[1]), v = blas_readable(in[2]);
  const Tensor& mask = in[3];
  int64_t B = q.size(0), H = q.size(1), D = q.size(3), S = k.size(2);
  const int64_t key_column_stride = k.stride(3);
  Shape weights_dims = weights_shape(q, k);
  Shape mask_strides = broadcast_strides(mask.shape(), mask.strides(), weights_dims);
  const DropoutParams& dropout = std::get<DropoutParams>(attrs);
  double p = dropout.p;
  visit_floating(q.dtype(), [&]<typename E>() {
    HeadMatrices<E> qs(q), ks(k), vs(v);
    const E* masks = static_cast<const E*>(mask.raw_data());
    E* result = out[0].data_ptr<E>();   // [B, T, H, D]
    E* weights = out[1].data_ptr<E>();  // [B, H, T, S]
    E scale = static_cast<E>(1 / std::sqrt(static_cast<double>(D)));
    if (S == 0) {  // no keys: an empty sum, as the composition of ops gives
      std::fill_n(result, out[0].numel(), E{0});
      return;
    }
    parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      std::vector<E> dropped(p > 0 ? T * S : 0);  // [T, S]
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t pair = begin; pair < end; ++pair) {
          int64_t b = pair / H, h = pair % H;
          E* w = weights + pair * T * S;  // [T, S]
          if (keys_by_column) {
            const E* queries = qs.at(b, h);  // w[t, :] = sum_d scale q[t, d] k[d, :]
            weighted_row_sums<E, W>(T, w, S, ks.at(b, h), key_column_stride, D, S,
                                    [&](int64_t t, int64_t d) MF_LAMBDA_INLINE {
                                      return scale * queries[t * qs.row_stride + d];
                                    });
          } else if (T <= kDirectQueries) {
            for (int64_t t = 0; t < T; ++t)
              for (int64_t s = 0; s < S; ++s)
                w[t * S + s] = scale * dot<E, W>(qs.at(b, h) + t * qs.row_stride, ks.at(b, h) + s * ks.row_stride, D);
          } else {
            gemm<E>(CblasNoTrans, CblasTrans, T, S, D, qs.at(b, h), qs.row_stride, ks.at(b, h), ks.row_stride, w, S,
                    {.alpha = scale});
          }
          for (int64_t t = 0; t < T; ++t) {
            E* row = w + t * S;
            const E* mask_row = masks + b * mask_strides[0] + h * mask_strides[1] + t * mask_strides[2];
            if (int64_t step = mask_strides[3]; step == 1)
              for (int64_t s = 0; s < S; ++s) row[s] += mask_row[s];
            else
              for (int64_t s = 0; s < S; ++s) row[s] += mask_row[s * step];
            cpu::softmax_row<W, false>(row, row, S);
          }
          const E* kept = w;
          if (p > 0) {
            apply_dropout<W>(dropout, pair * T * S, T * S, w, dropped.data());
            kept = dropped.data();
          }
          if (T <= kDirectQueries) {
            // out[b, t, h, :] = sum_s kept[t, s] v[b, h, s, :]
            weighted_row_sums<E, W>(T, result + b * T * H * D + h * D, H * D, vs.at(b, h), vs.row_stride, S, D,
                                    [&](int64_t t, int64_t s) MF_LAMBDA_INLINE { return kept[t * S + s]; });
          } else {
            gemm<E>(CblasNoTrans, CblasNoTrans, T, D, S, kept, S, vs.at(b, h), vs.row_stride,
                    result + b * T * H * D + h * D, H * D);
          }
        }
      });
    });
  });
}

/// The weights output's gradient is either [B, H, T, S] or, where none flows, an empty [0].
bool has_weights_grad(const Tensor& dweights) { return !(dweights.dim() == 1 && dweights.numel() == 0); }

std::vector<Tensor> attention_rule(const GradContext& ctx) {
  const Tensor &q = ctx.inputs[0], &k = ctx.inputs[1], &v = ctx.inputs[2], &weights = ctx.outputs[1];
  Tensor dout = ctx.grads[0].defined()
                    ? ctx.grads[0]
                    : zeros({q.size(0), q.size(2), q.size(1), q.size(3)}, q.dtype(), q.device());
  Tensor dweights = ctx.grads[1].defined() ? ctx.grads[1] : Tensor::empty({0}, q.dtype(), q.device());
  std::vector<Tensor> d = call<OpId::attention_backward>({dout, dweights, q, k, v, weights},
                                                         std::get<DropoutParams>(ctx.attrs), ctx.site);
  return {d[0].transpose(1, 2), d[1].transpose(1, 2), d[2].transpose(1, 2), Tensor()};  // the mask: none
}

/// Inputs: dout [B, T, H, D], dweights [B, H, T, S] or [0], q, k, v, weights. Outputs dq [B, T, H, D],
/// dk and dv [B, S, H, D]: heads interleaved, as the projections that made q, k and v lay them out.
std::vector<OutputSpec> infer_attention_backward(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &dout = in[0], &dweights = in[1], &q = in[2], &k = in[3], &weights = in[5];
  check_attention_operands(q, k, in[4]);
  int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  expect_tensor(dout, "dout", {B, T, H, D}, q.dtype());
  expect_tensor(weights, "weights", weights_shape(q, k), q.dtype());
  if (has_weights_grad(dweights)) expect_tensor(dweights, "dweights", weights_shape(q, k), q.dtype());
  return {{{B, T, H, D}, q.dtype()}, {{B, S, H, D}, q.dtype()}, {{B, S, H, D}, q.dtype()}};
}

void cpu_attention_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor dout = dense(in[0]), dweights = dense(in[1]), q = blas_readable(in[2]), k = blas_readable(in[3]),
         v = blas_readable(in[4]), weights = dense(in[5]);
  int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  const DropoutParams& dropout = std::get<DropoutParams>(attrs);
  double p = dropout.p;
  bool weights_grad = has_weights_grad(dweights);
  visit_floating(q.dtype(), [&]<typename E>() {
    HeadMatrices<E> qs(q), ks(k), vs(v);
    const E *douts = dout.data_ptr<E>(), *dws = weights_grad ? dweights.data_ptr<E>() : nullptr;
    const E* ws = weights.data_ptr<E>();
    E *dq = out[0].data_ptr<E>(), *dk = out[1].data_ptr<E>(), *dv = out[2].data_ptr<E>();
    E scale = static_cast<E>(1 / std::sqrt(static_cast<double>(D)));
    if (S == 0) {  // no keys: the output was 0 whatever q was (dk and dv are empty)
      std::fill_n(dq, out[0].numel(), E{0});
      return;
    }
    parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      std::vector<E> dkept(T * S), dropped(p > 0 ? T * S : 0);  // [T, S] each
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t pair = begin; pair < end; ++pair) {
          int64_t b = pair / H, h = pair % H;
          const E* w = ws + pair * T * S;                 // [T, S]
          const E* d_o = douts + b * T * H * D + h * D;  // [T, D], rows H * D apart
          gemm<E>(CblasNoTrans, CblasTrans, T, S, D, d_o, H * D, vs.at(b, h), vs.row_stride, dkept.data(), S);
          const E* kept = w;
          if (p > 0) {  // one draw of the mask for both: the weights forward, their gradient backward
            apply_dropout<W>(dropout, pair * T * S, T * S, w, dropped.data(), dkept.data(), dkept.data());
            kept = dropped.data();
          }
          gemm<E>(CblasTrans, CblasNoTrans, S, D, T, kept, S, d_o, H * D, dv + b * S * H * D + h * D, H * D);
          for (int64_t t = 0; t < T; ++t) {  // dkept becomes dS
            E* dw = dkept.data() + t * S;
            const E* w_row = w + t * S;
            if (weights_grad)
              for (int64_t s = 0; s < S; ++s) dw[s] += dws[pair * T * S + t * S + s];
            auto dot = static_cast<E>(cpu::pack_sum<E, W>(S, [=]<typename V>(int64_t s) MF_LAMBDA_INLINE {
              return cpu::load<V>(dw + s) * cpu::load<V>(w_row + s);
            }));
            cpu::pack_map<W>(dw, S, [=]<typename V>(int64_t s) MF_LAMBDA_INLINE {
              return cpu::load<V>(w_row + s) * (cpu::load<V>(dw + s) - dot);
            });
          }
          gemm<E>(CblasNoTrans, CblasNoTrans, T, D, S, dkept.data(), S, ks.at(b, h), ks.row_stride,
                  dq + b * T * H * D + h * D, H * D, {.alpha = scale});
          gemm<E>(CblasTrans, CblasNoTrans, S, D, T, dkept.data(), S, qs.at(b, h), qs.row_stride,
                  dk + b * S * H * D + h * D, H * D, {.alpha = scale});
        }
      });
    });
  });
}

// ---- references -----------------------------------------------------------------------------------

/// The weights [B, H, T, S] before dropout, by plain loops in double.
std::vector<double> reference_weights(const Tensor& q, const Tensor& k, const Tensor& mask) {
  int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  std::vector<double> weights;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> row;
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q.at<double>({b, h, t, d}) * k.at<double>({b, h, s, d});
          row.push_back(dot / std::sqrt(static_cast<double>(D)) +
                        reference::value_at_broadcast(mask, {b, h, t, s}));
        }
        if (row.empty()) continue;  // no keys: no weights
        double max = *std::max_element(row.begin(), row.end()), total = 0;
        for (double x : row) total += std::exp(x - max);
        for (double x : row) weights.push_back(std::exp(x - max) / total);
      }
  return weights;
}

/// Element (b, h, t, s) of the dropout scale over a contiguous [B, H, T, S] (1 for p = 0).
double dropout_scale(const Attrs& attrs, int64_t element) {
  const auto& [p, stream] = std::get<DropoutParams>(attrs);
  return reference::dropout_scale(stream.seed, stream.counter, p, element);
}

std::vector<Tensor> reference_attention(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  std::vector<double> weights = reference_weights(q, k, in[3]), result(B * T * H * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          double total = 0;
          for (int64_t s = 0; s < S; ++s) {
            int64_t element = ((b * H + h) * T + t) * S + s;
            total += weights[element] * dropout_scale(attrs, element) * v.at<double>({b, h, s, d});
          }
          result[((b * T + t) * H + h) * D + d] = total;
        }
  return {reference::make({B, T, H, D}, q.dtype(), result), reference::make(weights_shape(q, k), q.dtype(), weights)};
}

std::vector<Sample> attention_samples() {
  using reference::randn;
  return {
      {"no mask, no dropout", {randn({1, 2, 3, 4}, 501), randn({1, 2, 5, 4}, 502), randn({1, 2, 5, 4}, 503),
                               reference::make({}, DType::Float64, {0})},
       DropoutParams{}, {false, false, false, true}},
      {"causal mask [T, S], dropout 0.3",
       {randn({2, 2, 4, 3}, 504), randn({2, 2, 4, 3}, 505), randn({2, 2, 4, 3}, 506),
        reference::make({4, 4}, DType::Float64, {0, -1e9, -1e9, -1e9, 0, 0, -1e9, -1e9, 0, 0, 0, -1e9, 0, 0, 0, 0})},
       DropoutParams{.p = 0.3, .stream = {11, 3}}, {false, false, false, true}},
      {"key padding mask [B, 1, 1, S], odd sizes, dropout 0.5",
       {randn({2, 3, 3, 5}, 507), randn({2, 3, 7, 5}, 508), randn({2, 3, 7, 5}, 509),
        reference::make({2, 1, 1, 7}, DType::Float64, {0, 0, 0, 0, 0, -1e9, -1e9, 0, 0, -1e9, 0, 0, 0, 0})},
       DropoutParams{.p = 0.5, .stream = {12, 1}}, {false, false, false, true}},
      {"full mask, one query", {randn({1, 1, 1, 2}, 510), randn({1, 1, 3, 2}, 511), randn({1, 1, 3, 2}, 512),
                                randn({1, 1, 1, 3}, 513)},
       DropoutParams{}, {false, false, false, true}},
  };
}

std::vector<Tensor> reference_attention_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &dout = in[0], &dweights = in[1], &q = in[2], &k = in[3], &v = in[4], &weights = in[5];
  int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  std::vector<double> dq(B * T * H * D), dk(B * S * H * D), dv(B * S * H * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> dw(S);
        for (int64_t s = 0; s < S; ++s) {
          double scale = dropout_scale(attrs, ((b * H + h) * T + t) * S + s), dkept = 0;
          for (int64_t d = 0; d < D; ++d) dkept += dout.at<double>({b, t, h, d}) * v.at<double>({b, h, s, d});
          dw[s] = dkept * scale + (has_weights_grad(dweights) ? dweights.at<double>({b, h, t, s}) : 0.0);
          for (int64_t d = 0; d < D; ++d)
            dv[((b * S + s) * H + h) * D + d] +=
                weights.at<double>({b, h, t, s}) * scale * dout.at<double>({b, t, h, d});
        }
        double dot = 0;
        for (int64_t s = 0; s < S; ++s) dot += dw[s] * weights.at<double>({b, h, t, s});
        for (int64_t s = 0; s < S; ++s) {
          double ds = weights.at<double>({b, h, t, s}) * (dw[s] - dot) / std::sqrt(static_cast<double>(D));
          for (int64_t d = 0; d < D; ++d) {
            dq[((b * T + t) * H + h) * D + d] += ds * k.at<double>({b, h, s, d});
            dk[((b * S + s) * H + h) * D + d] += ds * q.at<double>({b, h, t, d});
          }
        }
      }
  return {reference::make({B, T, H, D}, q.dtype(), dq), reference::make({B, S, H, D}, q.dtype(), dk),
          reference::make({B, S, H, D}, q.dtype(), dv)};
}

/// attention_backward's inputs for q, k, v and a mask: dout and dweights drawn, the weights the
/// reference forward's.
std::vector<Tensor> backward_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    bool weights_grad, uint64_t seed) {
  Tensor weights = reference::make(weights_shape(q, k), q.dtype(), reference_weights(q, k, mask));
  Tensor dweights = weights_grad ? reference::randn(weights.shape(), seed + 1) : Tensor::empty({0}, q.dtype());
  return {reference::randn({q.size(0), q.size(2), q.size(1), q.size(3)}, seed), dweights, q, k, v, weights};
}

std::vector<Sample> attention_backward_samples() {
  using reference::randn;
  Tensor no_mask = reference::make({}, DType::Float64, {0});
  Tensor padding = reference::make({2, 1, 1, 4}, DType::Float64, {0, 0, 0, -1e9, 0, -1e9, -1e9, 0});
  return {
      {"no dropout", backward_inputs(randn({1, 2, 3, 4}, 521), randn({1, 2, 5, 4}, 522), randn({1, 2, 5, 4}, 523),
                                     no_mask, false, 524),
       DropoutParams{}},
      {"dropout 0.4, weights' gradient",
       backward_inputs(randn({2, 2, 3, 2}, 525), randn({2, 2, 4, 2}, 526), randn({2, 2, 4, 2}, 527), padding, true,
                       528),
       DropoutParams{.p = 0.4, .stream = {13, 2}}},
  };
}

}  // namespace

void register_attention_ops(Registry& r) {
  r.define(OpId::attention, {.name = "attention", .infer = infer_attention, .kernels = {cpu_attention},
                             .backward = attention_rule, .saves_outputs = true, .first_saved_output = 1,
                             .takes_undefined_grads = true, .autocast = AutocastRule::LowerPrecision,
                             .samples = attention_samples, .reference = reference_attention});
  // Not differentiable itself: its samples check the forward only.
  r.define(OpId::attention_backward,
           {.name = "attention_backward", .infer = infer_attention_backward, .kernels = {cpu_attention_backward},
            .autocast = AutocastRule::LowerPrecision, .samples = attention_backward_samples, .reference = reference_attention_backward});
}

// ---- public API -----------------------------------------------------------------------------------

AttentionResult scaled_dot_product_attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          const Tensor& attn_mask, double dropout_p,
                                                          Generator* generator, Site site) {
  MF_CHECK(dropout_p >= 0 && dropout_p <= 1, "scaled_dot_product_attention: dropout_p must be in [0, 1], got {} at {}",
           dropout_p, format_location(site));
  MF_CHECK(!attn_mask.defined() || is_floating(attn_mask.dtype()),
           "scaled_dot_product_attention: attn_mask must be an additive float mask (0 keeps, a large negative "
           "value drops), got {} at {}",
           dtype_name(attn_mask.dtype()), format_location(site));
  if (attn_mask.defined() && q.dim() == 4 && k.dim() == 4) {  // other ranks are the op's error to report
    Shape weights = weights_shape(q, k);
    MF_CHECK(broadcasts_to(attn_mask.shape(), weights),
             "scaled_dot_product_attention: attn_mask {} does not broadcast to the weights [B, H, T, S] = {} at {}",
             shape_str(attn_mask.shape()), shape_str(weights), format_location(site));
  }
  Tensor mask = attn_mask.defined() ? attn_mask.to(q.dtype(), site) : zeros({}, q.dtype(), q.device());
  if (!q.device().is_cpu() || (mask.requires_grad() && grad_mode_enabled())) {  // other devices, masks to learn
    Tensor scores = matmul(q, k.transpose(-2, -1, site), site).div(std::sqrt(static_cast<double>(q.size(-1))), site);
    Tensor weights = softmax(attn_mask.defined() ? scores.add(mask, site) : scores, -1, site);
    return {matmul(dropout(weights, dropout_p, true, generator, site), v, site), weights};
  }
  DropoutParams dropout{.p = dropout_p};
  if (dropout_p > 0 && q.dim() == 4 && k.dim() == 4) {  // other ranks are the op's error to report
    Generator& stream = generator ? *generator : default_generator();
    dropout.stream.seed = stream.seed();
    dropout.stream.counter = stream.reserve(static_cast<uint64_t>((shape_numel(weights_shape(q, k)) + 3) / 4));
  }
  std::vector<Tensor> out = call<OpId::attention>({q, k, v, mask}, dropout, site);
  return {out[0].transpose(1, 2, site), out[1]};  // [B, H, T, D] over [B, T, H, D] memory
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, Generator* generator, Site site) {
  return scaled_dot_product_attention_with_weights(q, k, v, attn_mask, dropout_p, generator, site).output;
}

}  // namespace mf
