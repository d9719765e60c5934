// Fused nn ops, each with its own backward op (PyTorch's native_layer_norm_backward, llm.c's
// crossentropy_softmax_backward): layer_norm, embedding, dropout (cross_entropy is in
// cross_entropy.cpp).
//
// N = rows (the product of the leading dims), C = features per row (normalized size, embedding width,
// classes), V = embedding rows. Kernels read contiguous copies of their inputs and write every element
// of their outputs (=); parameter gradients (dweight, dbias) sum (+=) over rows in blocks fixed by N
// alone, so they do not depend on the thread count.
#include "core/graph.h"
#include "ops/families.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/cpu/dropout.h"
#include "ops/kernel_checks.h"
#include "ops/reference.h"
#include "ops/cpu/simd.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace mf {
namespace {

using namespace detail;
using cpu::exp_of;
using cpu::load;
using cpu::pack_map;
using cpu::pack_sum;


// ---- layer_norm ---------------------------------------------------------------------------------
// Inputs x [..., *normalized_shape], weight and bias [*normalized_shape]. Outputs out (x's shape) and
// the per-row statistics mean and rstd = 1/sqrt(var + eps), both of x's leading dims [...] (0-dim when
// x is normalized_shape itself).

/// The leading dims of x, after checking that x ends with normalized_shape.
Shape leading_dims(const Tensor& x, const Shape& normalized_shape) {
  auto k = static_cast<int64_t>(normalized_shape.size());
  MF_CHECK(k > 0, "normalized_shape is empty (input of shape {})", shape_str(x.shape()));
  MF_CHECK(x.dim() >= k && std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k),
           "input of shape {} does not end with normalized_shape {}", shape_str(x.shape()),
           shape_str(normalized_shape));
  return Shape(x.shape().begin(), x.shape().end() - k);
}

std::vector<OutputSpec> infer_layer_norm(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  double eps = std::get<LayerNormParams>(attrs).eps;
  const Tensor& x = in[0];
  expect_float(x, "input");
  Shape stats = leading_dims(x, normalized_shape);
  expect_tensor(in[1], "weight", normalized_shape, x.dtype());
  expect_tensor(in[2], "bias", normalized_shape, x.dtype());
  MF_CHECK(eps >= 0, "eps must be >= 0, got {}", eps);
  return {{x.shape(), x.dtype()}, {stats, x.dtype()}, {stats, x.dtype()}};
}

void cpu_layer_norm(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  double eps = std::get<LayerNormParams>(attrs).eps;
  Tensor x = dense(in[0]), weight = dense(in[1]), bias = dense(in[2]);
  int64_t N = out[1].numel(), C = shape_numel(normalized_shape);
  visit_floating(x.dtype(), [&]<typename T>() {
    const T* inp = x.data_ptr<T>();     // [N, C]
    const T* w = weight.data_ptr<T>();  // [C]
    const T* b = bias.data_ptr<T>();    // [C]
    T* o = out[0].data_ptr<T>();        // [N, C]
    T* mean = out[1].data_ptr<T>();     // [N]
    T* rstd = out[2].data_ptr<T>();     // [N]
    parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t n = begin; n < end; ++n) {
          const T* row = inp + n * C;
          // One pass over moments shifted by the row's first element. The shift keeps the variance
          // accurate when |mean| >> std, where the plain sum-of-squares formula cancels, and x - shift
          // is exact in T there, so the output never subtracts a rounded mean from a large x.
          T shift = C > 0 ? row[0] : T{0};
          double s = pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
            return load<V>(row + c) - shift;
          });
          double ss = pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
            auto d = load<V>(row + c) - shift;
            return d * d;
          });
          double m = s / static_cast<double>(C), var = std::max(ss / static_cast<double>(C) - m * m, 0.0);
          double r = 1.0 / std::sqrt(var + eps);
          mean[n] = static_cast<T>(shift + m);
          rstd[n] = static_cast<T>(r);
          T centre = static_cast<T>(m), scale = static_cast<T>(r);
          pack_map<W>(o + n * C, C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
            return ((load<V>(row + c) - shift) - centre) * scale * load<V>(w + c) + load<V>(b + c);
          });
        }
      });
    });
  });
}

// The statistics are outputs too, so their gradients (zeros in ordinary use) reach the backward op:
// d mean / dx_c = 1/C and d rstd / dx_c = -rstd^2 xhat_c / C.
std::vector<Tensor> layer_norm_rule(const GradContext& ctx) {
  const Tensor &x = ctx.inputs[0], &weight = ctx.inputs[1], &mean = ctx.outputs[1], &rstd = ctx.outputs[2];
  std::vector<Tensor> grads =
      call<OpId::layer_norm_backward>({ctx.grads[0], x, mean, rstd, weight, ctx.grads[1], ctx.grads[2]},
                                      std::get<LayerNormParams>(ctx.attrs), ctx.site);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!ctx.needs_grad[i]) grads[i] = Tensor();
  return grads;
}

std::vector<Tensor> reference_layer_norm(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  double eps = std::get<LayerNormParams>(attrs).eps;
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  Shape stats = leading_dims(x, normalized_shape);
  int64_t C = shape_numel(normalized_shape), N = shape_numel(stats);
  std::vector<double> xs = x.to_vector<double>(), ws = w.to_vector<double>(), bs = b.to_vector<double>();
  std::vector<double> out(xs.size()), means(N), rstds(N);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += xs[n * C + c] / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xs[n * C + c] - mean) * (xs[n * C + c] - mean) / static_cast<double>(C);
    double rstd = 1 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (xs[n * C + c] - mean) * rstd * ws[c] + bs[c];
    means[n] = mean;
    rstds[n] = rstd;
  }
  return {reference::make(x.shape(), x.dtype(), out), reference::make(stats, x.dtype(), means),
          reference::make(stats, x.dtype(), rstds)};
}

struct LayerNormCase {
  std::string name;
  Shape x_shape, normalized_shape;
};

std::vector<LayerNormCase> layer_norm_cases() {
  return {{"last dim", {4, 5}, {5}},
          {"two normalized dims", {2, 3, 4}, {3, 4}},
          {"no leading dims", {6}, {6}},
          {"rows of one element", {3, 1}, {1}}};
}

std::vector<Sample> layer_norm_samples() {
  std::vector<Sample> samples;
  uint64_t seed = 401;
  for (const LayerNormCase& c : layer_norm_cases()) {
    samples.push_back({c.name,
                       {reference::randn(c.x_shape, seed), reference::randn(c.normalized_shape, seed + 1),
                        reference::randn(c.normalized_shape, seed + 2)},
                       LayerNormParams{.normalized_shape = c.normalized_shape, .eps = 1e-5}});
    seed += 3;
  }
  return samples;
}

// ---- layer_norm_backward ------------------------------------------------------------------------
// Inputs dout [..., *normalized_shape], x, mean and rstd [...] (as layer_norm returned them), weight,
// and the gradients dmean, drstd [...] of the statistics; outputs dx, dweight, dbias.
// With g = dout * weight and xhat = (x - mean) * rstd, per row:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dmean / C - drstd * rstd^2 * xhat / C.

std::vector<OutputSpec> infer_layer_norm_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  const Tensor& x = in[1];
  expect_float(x, "input");
  Shape stats = leading_dims(x, normalized_shape);
  expect_tensor(in[0], "dout", x.shape(), x.dtype());
  expect_tensor(in[2], "mean", stats, x.dtype());
  expect_tensor(in[3], "rstd", stats, x.dtype());
  expect_tensor(in[4], "weight", normalized_shape, x.dtype());
  expect_tensor(in[5], "dmean", stats, x.dtype());
  expect_tensor(in[6], "drstd", stats, x.dtype());
  return {{x.shape(), x.dtype()}, {normalized_shape, x.dtype()}, {normalized_shape, x.dtype()}};
}

/// Row blocks for parameter-gradient partials: at most this many, sized by N alone (so the sums do
/// not depend on the thread count). Few enough that the partials stay small and summing them
/// across blocks, a serial pass over C columns, costs next to nothing.
constexpr int64_t kMaxRowBlocks = 16;

void cpu_layer_norm_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  Tensor dout = dense(in[0]), x = dense(in[1]), mean = dense(in[2]), rstd = dense(in[3]), weight = dense(in[4]),
         dmean = dense(in[5]), drstd = dense(in[6]);
  int64_t N = mean.numel(), C = shape_numel(normalized_shape);
  int64_t rows_per_block = std::max<int64_t>(1, (N + kMaxRowBlocks - 1) / kMaxRowBlocks);
  int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  std::vector<double> partial(static_cast<size_t>(blocks * 2 * C), 0.0);  // [blocks, 2, C]: dweight, dbias
  auto inv_c = 1.0 / static_cast<double>(C);
  visit_floating(x.dtype(), [&]<typename T>() {
    const T* g = dout.data_ptr<T>();  // [N, C]
    const T* inp = x.data_ptr<T>();   // [N, C]
    const T *mu = mean.data_ptr<T>(), *rs = rstd.data_ptr<T>();        // [N]
    const T *dmu = dmean.data_ptr<T>(), *drs = drstd.data_ptr<T>();    // [N]
    const T* w = weight.data_ptr<T>();  // [C]
    T* dinp = out[0].data_ptr<T>();      // [N, C]
    parallel_for(0, blocks, grain_for(rows_per_block * C), [&](int64_t block_begin, int64_t block_end) {
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t block = block_begin; block < block_end; ++block) {
          double* dw = partial.data() + block * 2 * C;
          double* db = dw + C;
          for (int64_t n = block * rows_per_block, n_end = std::min(N, n + rows_per_block); n < n_end; ++n) {
            const T *grow = g + n * C, *xrow = inp + n * C;
            T m = mu[n], r = rs[n];
            double sum_g = pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
              return load<V>(grow + c) * load<V>(w + c);
            });
            double sum_gx = r * pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
              return load<V>(grow + c) * load<V>(w + c) * (load<V>(xrow + c) - m);
            });
            for (int64_t c = 0; c < C; ++c) {
              dw[c] += static_cast<double>(grow[c]) * ((xrow[c] - m) * r);
              db[c] += grow[c];
            }
            // dx = r g w + k_centred (x - mean) + k_const
            double k_xhat = -(r * sum_gx + drs[n] * r * r) * inv_c;
            auto k_centred = static_cast<T>(k_xhat * r), k_const = static_cast<T>((dmu[n] - r * sum_g) * inv_c);
            pack_map<W>(dinp + n * C, C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
              return r * load<V>(grow + c) * load<V>(w + c) + k_centred * (load<V>(xrow + c) - m) + k_const;
            });
          }
        }
      });
    });
    T *dweight = out[1].data_ptr<T>(), *dbias = out[2].data_ptr<T>();  // [C]
    parallel_for(0, C, grain_for(blocks), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sw = 0, sb = 0;
        for (int64_t block = 0; block < blocks; ++block) {
          sw += partial[block * 2 * C + c];
          sb += partial[block * 2 * C + C + c];
        }
        dweight[c] = static_cast<T>(sw);
        dbias[c] = static_cast<T>(sb);
      }
    });
  });
}

// The gradient of L = <Gdx, dx> + <Gdw, dweight> + <Gdb, dbias>, per row, treating mean and rstd as
// inputs of their own. With a = dout * w, S1 = sum(a), S2 = sum(a * xhat), Gsum = sum(Gdx),
// Gx = sum(Gdx * xhat) over the row:
//   dL/da    = r (Gdx - (Gx xhat + Gsum) / C)
//   dL/dxhat = H = -r (a Gx + S2 Gdx) / C - drstd r^2 Gdx / C + dout Gdw,  and dx/dxhat = r
//   dL/dmean = -r sum(H),  dL/drstd = sum(Gdx a) - (S2 Gx + 2 drstd r Gx + S1 Gsum) / C + sum(H (x - mean))
//   dL/ddmean = Gsum / C,  dL/ddrstd = -r^2 Gx / C.
std::vector<Tensor> layer_norm_backward_rule(const GradContext& ctx) {
  const Shape& normalized_shape = std::get<LayerNormParams>(ctx.attrs).normalized_shape;
  const std::vector<Tensor>& in = ctx.inputs;
  const Tensor &dout = in[0], &x = in[1], &w = in[4];
  const Tensor &gdx = ctx.grads[0], &gdw = ctx.grads[1], &gdb = ctx.grads[2];
  const Shape& stats = in[2].shape();
  auto k = static_cast<int64_t>(normalized_shape.size());
  double inv_c = 1.0 / static_cast<double>(shape_numel(normalized_shape));
  Shape per_row_shape = stats, row_dims;  // [..., 1, ..., 1] and the normalized dims
  for (int64_t d = -k; d < 0; ++d) {
    per_row_shape.push_back(1);
    row_dims.push_back(d);
  }
  auto per_row = [&](const Tensor& t) { return t.reshape(per_row_shape); };
  auto row_sum = [&](const Tensor& t) { return sum(t, row_dims, true); };
  Tensor r = per_row(in[3]), drs = per_row(in[6]);
  Tensor centred = x - per_row(in[2]), xhat = centred * r, a = dout * w;
  Tensor s1 = row_sum(a), s2 = row_sum(a * xhat), gsum = row_sum(gdx), gx = row_sum(gdx * xhat);
  Tensor da = r * (gdx - (gx * xhat + gsum) * inv_c);
  Tensor h = (r * (a * gx + s2 * gdx) + drs * r * r * gdx) * -inv_c + dout * gdw;
  std::vector<Tensor> grads(7);
  if (ctx.needs_grad[0]) grads[0] = w * da + gdw * xhat + gdb;
  if (ctx.needs_grad[1]) grads[1] = r * h;
  if (ctx.needs_grad[2]) grads[2] = (-(r * row_sum(h))).reshape(stats);
  if (ctx.needs_grad[3])
    grads[3] = (row_sum(gdx * a) - (s2 * gx + 2.0 * drs * r * gx + s1 * gsum) * inv_c + row_sum(h * centred))
                   .reshape(stats);
  if (ctx.needs_grad[4]) grads[4] = dout * da;  // the engine sums it over the leading dims
  if (ctx.needs_grad[5]) grads[5] = (gsum * inv_c).reshape(stats);
  if (ctx.needs_grad[6]) grads[6] = (r * r * gx * -inv_c).reshape(stats);
  return grads;
}

// Written from the Jacobian, entry by entry, rather than the kernel's factored formula:
// d xhat_j / d x_i = rstd (delta_ij - 1/C) - rstd^3 (x_j - mean)(x_i - mean) / C.
std::vector<Tensor> reference_layer_norm_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Shape& normalized_shape = std::get<LayerNormParams>(attrs).normalized_shape;
  const Tensor& x = in[1];
  Shape stats = leading_dims(x, normalized_shape);
  int64_t C = shape_numel(normalized_shape), N = shape_numel(stats);
  std::vector<double> g = in[0].to_vector<double>(), xs = x.to_vector<double>(), mu = in[2].to_vector<double>(),
                      rs = in[3].to_vector<double>(), w = in[4].to_vector<double>(),
                      dmu = in[5].to_vector<double>(), drs = in[6].to_vector<double>();
  std::vector<double> dx(xs.size(), 0.0), dw(C, 0.0), db(C, 0.0);
  auto cd = static_cast<double>(C);
  for (int64_t n = 0; n < N; ++n) {
    double r = rs[n];
    for (int64_t i = 0; i < C; ++i) {
      double xi = xs[n * C + i] - mu[n], total = dmu[n] / cd - drs[n] * r * r * r * xi / cd;
      for (int64_t j = 0; j < C; ++j) {
        double xj = xs[n * C + j] - mu[n];
        double jacobian = r * ((i == j ? 1.0 : 0.0) - 1.0 / cd) - r * r * r * xj * xi / cd;
        total += g[n * C + j] * w[j] * jacobian;
      }
      dx[n * C + i] = total;
      dw[i] += g[n * C + i] * xi * r;
      db[i] += g[n * C + i];
    }
  }
  return {reference::make(x.shape(), x.dtype(), dx),
          reference::make(normalized_shape, x.dtype(), dw),
          reference::make(normalized_shape, x.dtype(), db)};
}

std::vector<Sample> layer_norm_backward_samples() {
  std::vector<Sample> samples;
  uint64_t seed = 431;
  for (const LayerNormCase& c : layer_norm_cases()) {
    LayerNormParams params{.normalized_shape = c.normalized_shape, .eps = 1e-5};
    Tensor x = reference::randn(c.x_shape, seed), w = reference::randn(c.normalized_shape, seed + 1);
    std::vector<Tensor> forward = reference_layer_norm({x, w, w}, params);
    Shape stats = forward[1].shape();
    samples.push_back({c.name,
                       {reference::randn(c.x_shape, seed + 2), x, forward[1], forward[2], w,
                        reference::randn(stats, seed + 3), reference::randn(stats, seed + 4)},
                       params});
    seed += 5;
  }
  return samples;
}

// ---- embedding ----------------------------------------------------------------------------------
// Inputs weight [V, C] and int64 indices [...]; output [..., C]. The padding row (padding_idx,
// negative for none) receives no gradient.

/// Embedding ids must pick one of the V rows.
void check_ids(const Tensor& indices, int64_t V) {
  expect_int64(indices, "indices");
  if (auto bad = find_bad_index(indices, V))
    fail("index {} (at flat position {}) is out of range for {} embedding rows (valid ids are 0 to {})", bad->second,
         bad->first, V, V - 1);
}

std::vector<OutputSpec> infer_embedding(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &weight = in[0], &indices = in[1];
  expect_float(weight, "weight");
  MF_CHECK(weight.dim() == 2, "expects a 2-d weight [V, C], got shape {}", shape_str(weight.shape()));
  check_ids(indices, weight.size(0));
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  return {{shape, weight.dtype()}};
}

void cpu_embedding(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor weight = dense(in[0]), indices = dense(in[1]);
  int64_t C = weight.size(1), N = indices.numel();
  visit_floating(weight.dtype(), [&]<typename T>() {
    const T* w = weight.data_ptr<T>();                // [V, C]
    const int64_t* idx = indices.data_ptr<int64_t>();  // [N]
    T* o = out[0].data_ptr<T>();                       // [N, C]
    parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) std::copy_n(w + idx[n] * C, C, o + n * C);
    });
  });
}

// Where the weight has a gradient summed already (a tied weight: the output projection's dW), the
// rows are added into it in place, with no zeroed [V, C] table and no add of one.
std::vector<Tensor> embedding_rule(const GradContext& ctx) {
  EmbeddingBackwardParams params{.num_embeddings = ctx.inputs[0].size(0),
                                 .padding_idx = std::get<EmbeddingParams>(ctx.attrs).padding_idx};
  if (Tensor sum = ctx.sums[0]; sum.defined()) {
    params.accumulate = true;
    call_inplace<OpId::embedding_backward>(sum, {ctx.grads[0], ctx.inputs[1]}, params, ctx.site);
    return {sum, Tensor()};
  }
  return {call1<OpId::embedding_backward>({ctx.grads[0], ctx.inputs[1]}, params, ctx.site), Tensor()};
}

std::vector<Tensor> reference_embedding(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &weight = in[0], &indices = in[1];
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  std::vector<double> values;
  reference::for_each_index(shape, [&](const Shape& index) {
    int64_t row = indices.at<int64_t>(Shape(index.begin(), index.end() - 1));
    values.push_back(weight.at<double>({row, index.back()}));
  });
  return {reference::make(shape, weight.dtype(), values)};
}

std::vector<Sample> embedding_samples() {
  return {
      {"matrix of ids", {reference::randn({7, 3}, 441), reference::randint({2, 4}, 7, 442)}, EmbeddingParams{}},
      // The padding row withholds by design the gradient its forward use implies (PyTorch's
      // padding_idx), so finite differences disagree there.
      {"with padding row",
       {reference::randn({5, 4}, 443), reference::randint({9}, 5, 444)},
       EmbeddingParams{.padding_idx = 2},
       {},
       false},
      {"single id", {reference::randn({4, 2}, 445), reference::randint({}, 4, 446)}, EmbeddingParams{}},
  };
}

// ---- embedding_backward -------------------------------------------------------------------------
// Inputs dout [..., C] and int64 indices [...], with num_embeddings = V and the padding row (negative
// for none); output dweight [V, C], the scatter-add of dout rows into their ids' rows.
// With accumulate the rows are added to what dweight holds (call_inplace into a gradient summed so
// far) instead of to zeros.

std::vector<OutputSpec> infer_embedding_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &dout = in[0], &indices = in[1];
  expect_float(dout, "dout");
  const auto& [rows, padding_idx, accumulate] = std::get<EmbeddingBackwardParams>(attrs);
  MF_CHECK(rows >= 0, "num_embeddings must be >= 0, got {}", rows);
  MF_CHECK(padding_idx < rows, "padding_idx {} is out of range for {} rows", padding_idx, rows);
  MF_CHECK(dout.dim() == indices.dim() + 1 && std::equal(indices.shape().begin(), indices.shape().end(),
                                                         dout.shape().begin()),
           "dout of shape {} does not match indices of shape {} (expected [*indices.shape, C])",
           shape_str(dout.shape()), shape_str(indices.shape()));
  check_ids(indices, rows);
  return {{{rows, dout.size(-1)}, dout.dtype()}};
}

/// Over rows [row_begin, row_end): each row that an id names gets its positions summed in order from
/// zero, then added to what dw holds (zeros, or with accumulate a gradient summed so far, which thus
/// gets the very additions of sum + table); rows no id names are left alone. The row sum is never
/// -0, so adding it to zeros gives it bit for bit.
template <typename T>
void add_rows_into(const T* g, const int64_t* idx, int64_t N, int64_t C, int64_t pad, int64_t row_begin,
                   int64_t row_end, T* dw) {
  std::vector<std::pair<int64_t, int64_t>> hits;  // (row, position), positions in order within a row
  for (int64_t n = 0; n < N; ++n)
    if (idx[n] >= row_begin && idx[n] < row_end && idx[n] != pad) hits.emplace_back(idx[n], n);
  std::stable_sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<T> row_sum(static_cast<size_t>(C));
  for (size_t i = 0; i < hits.size();) {
    int64_t row = hits[i].first;
    std::fill(row_sum.begin(), row_sum.end(), T{0});
    for (; i < hits.size() && hits[i].first == row; ++i)
      for (int64_t c = 0; c < C; ++c) row_sum[static_cast<size_t>(c)] += g[hits[i].second * C + c];
    for (int64_t c = 0; c < C; ++c) dw[row * C + c] += row_sum[static_cast<size_t>(c)];
  }
}

void cpu_embedding_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor dout = dense(in[0]), indices = dense(in[1]);
  const EmbeddingBackwardParams& params = std::get<EmbeddingBackwardParams>(attrs);
  int64_t V = params.num_embeddings, C = out[0].size(1), N = indices.numel(), pad = params.padding_idx;
  visit_floating(dout.dtype(), [&]<typename T>() {
    const T* g = dout.data_ptr<T>();                   // [N, C]
    const int64_t* idx = indices.data_ptr<int64_t>();  // [N]
    T* dw = out[0].data_ptr<T>();                      // [V, C]
    // Each chunk owns a range of rows and scans every id for them: no two threads write one row,
    // and each row sums its positions in order, whatever the thread count.
    int64_t grain = N * C < cpu::kParallelGrain ? std::max<int64_t>(V, 1) : 1;
    parallel_for(0, V, grain, [&](int64_t row_begin, int64_t row_end) {
      if (!params.accumulate) std::fill(dw + row_begin * C, dw + row_end * C, T{0});
      add_rows_into(g, idx, N, C, pad, row_begin, row_end, dw);
    });
  });
}

// dweight is linear in dout: the gradient picks each id's row of the incoming gradient, except at the
// padding row, which dweight never receives.
std::vector<Tensor> embedding_backward_rule(const GradContext& ctx) {
  Tensor grad = ctx.grads[0];
  const EmbeddingBackwardParams& params = std::get<EmbeddingBackwardParams>(ctx.attrs);
  if (params.padding_idx >= 0) {
    Tensor keep = ones({params.num_embeddings, 1}, grad.dtype(), grad.device());
    keep.select(0, params.padding_idx).zero_();
    grad = mul(grad, keep);
  }
  return {call1<OpId::embedding>({grad, ctx.inputs[1]}, {}, ctx.site), Tensor()};
}

std::vector<Tensor> reference_embedding_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &dout = in[0], &indices = in[1];
  const auto& [rows, padding_idx, accumulate] = std::get<EmbeddingBackwardParams>(attrs);
  int64_t C = dout.size(-1);
  std::vector<double> dw(static_cast<size_t>(rows * C), 0.0);
  reference::for_each_index(dout.shape(), [&](const Shape& index) {
    int64_t row = indices.at<int64_t>(Shape(index.begin(), index.end() - 1));
    if (row != padding_idx) dw[row * C + index.back()] += dout.at<double>(index);
  });
  return {reference::make({rows, C}, dout.dtype(), dw)};
}

std::vector<Sample> embedding_backward_samples() {
  return {
      {"repeated ids",
       {reference::randn({3, 4, 2}, 451), reference::randint({3, 4}, 3, 452)},
       EmbeddingBackwardParams{.num_embeddings = 5}},
      {"with padding row",
       {reference::randn({9, 3}, 453), reference::randint({9}, 4, 454)},
       EmbeddingBackwardParams{.num_embeddings = 4, .padding_idx = 1}},
      {"single id",
       {reference::randn({3}, 455), reference::randint({}, 6, 456)},
       EmbeddingBackwardParams{.num_embeddings = 6}},
  };
}

// ---- dropout ------------------------------------------------------------------------------------
// Input x, with p and the Philox stream in DropoutParams. Output out = x * mask, where the
// mask holds the scale each element gets (0 or 1/(1-p)) and is never stored: dx = dout * mask =
// dropout(dout) on the same stream. Element i keeps when word i % 4 of Philox block
// (seed, counter + i / 4), as a uniform on [0, 1), is >= p: the mask depends on the stream alone,
// never on the thread count.

std::vector<OutputSpec> infer_dropout(const std::vector<Tensor>& in, const Attrs& attrs) {
  expect_float(in[0], "input");
  double p = std::get<DropoutParams>(attrs).p;
  MF_CHECK(p >= 0 && p <= 1, "probability p must be in [0, 1], got {}", p);
  return {{in[0].shape(), in[0].dtype()}};
}

void cpu_dropout(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  Tensor x = dense(in[0]);
  const DropoutParams& dropout = std::get<DropoutParams>(attrs);
  int64_t numel = x.numel(), blocks = (numel + 3) / 4;
  visit_floating(x.dtype(), [&]<typename T>() {
    const T* inp = x.data_ptr<T>();  // [numel]
    T* o = out[0].data_ptr<T>();
    parallel_for(0, blocks, grain_for(4), [&](int64_t begin, int64_t end) {  // whole Philox blocks each
      int64_t first = 4 * begin, n = std::min(4 * end, numel) - first;
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE { apply_dropout<W>(dropout, first, n, inp + first, o + first); });
    });
  });
}

// Replaying the forward's Philox stream on the gradient multiplies it by the same mask, so the node
// keeps no tensors alive.
std::vector<Tensor> dropout_rule(const GradContext& ctx) {
  return {call1<OpId::dropout>({ctx.grads[0]}, std::get<DropoutParams>(ctx.attrs), ctx.site)};
}

std::vector<Tensor> reference_dropout(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [p, stream] = std::get<DropoutParams>(attrs);
  std::vector<double> xs = in[0].to_vector<double>(), out;
  for (size_t i = 0; i < xs.size(); ++i)
    out.push_back(xs[i] * reference::dropout_scale(stream.seed, stream.counter, p, static_cast<int64_t>(i)));
  return {reference::make(in[0].shape(), in[0].dtype(), out)};
}

std::vector<Sample> dropout_samples() {
  return {
      {"p = 0.3", {reference::randn({4, 5}, 461)}, DropoutParams{.p = 0.3, .stream = {7, 0}}},
      {"p = 0.5, odd size, offset stream", {reference::randn({3, 7}, 462)}, DropoutParams{.p = 0.5, .stream = {8, 5}}},
      {"p = 1 drops all", {reference::randn({2, 3}, 463)}, DropoutParams{.p = 1, .stream = {9}}},
      {"p = 0 keeps all", {reference::randn({2, 3}, 464)}, DropoutParams{.p = 0, .stream = {10}}},
      {"scalar", {reference::randn({}, 465)}, DropoutParams{.p = 0.2, .stream = {11, 3}}},
  };
}

}  // namespace

void register_nn_ops(Registry& r) {
  r.define(OpId::layer_norm, {.name = "layer_norm", .infer = infer_layer_norm, .kernels = {cpu_layer_norm},
                              .backward = layer_norm_rule, .saves_outputs = true, .samples = layer_norm_samples,
                              .reference = reference_layer_norm});
  r.define(OpId::layer_norm_backward,
           {.name = "layer_norm_backward", .infer = infer_layer_norm_backward, .kernels = {cpu_layer_norm_backward},
            .backward = layer_norm_backward_rule, .samples = layer_norm_backward_samples,
            .reference = reference_layer_norm_backward});
  r.define(OpId::embedding, {.name = "embedding", .infer = infer_embedding, .kernels = {cpu_embedding},
                             .backward = embedding_rule, .samples = embedding_samples,
                             .reference = reference_embedding});
  r.define(OpId::embedding_backward,
           {.name = "embedding_backward", .infer = infer_embedding_backward, .kernels = {cpu_embedding_backward},
            .backward = embedding_backward_rule, .samples = embedding_backward_samples,
            .reference = reference_embedding_backward});
  r.define(OpId::dropout, {.name = "dropout", .infer = infer_dropout, .kernels = {cpu_dropout},
                           .backward = dropout_rule, .saves_inputs = false,
                           .samples = dropout_samples, .reference = reference_dropout});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps, Site site) {
  Tensor w = weight.defined() ? weight : ones(normalized_shape, x.dtype(), x.device());
  Tensor b = bias.defined() ? bias : zeros(normalized_shape, x.dtype(), x.device());
  return std::move(call<OpId::layer_norm>({x, w, b}, {.normalized_shape = normalized_shape, .eps = eps}, site)[0]);
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx, Site site) {
  int64_t pad = -1;
  if (padding_idx && weight.dim() == 2) {  // a weight of another rank is the op's error to report
    int64_t rows = weight.size(0);
    MF_CHECK(*padding_idx >= -rows && *padding_idx < rows,
             "embedding: padding_idx {} is out of range for weight of shape {} at {}", *padding_idx,
             shape_str(weight.shape()), format_location(site));
    pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  return call1<OpId::embedding>({weight, indices}, {.padding_idx = pad}, site);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator, Site site) {
  MF_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got {} at {}", p, format_location(site));
  if (!training || p == 0) return x;
  Generator& stream = generator ? *generator : default_generator();
  uint64_t counter = stream.reserve(static_cast<uint64_t>((x.numel() + 3) / 4));
  return std::move(call<OpId::dropout>({x}, {.p = p, .stream = {.seed = stream.seed(), .counter = counter}}, site)[0]);
}


}  // namespace mf
