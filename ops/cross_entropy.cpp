// cross_entropy and its backward op, fused (llm.c's crossentropy_softmax_backward): a stable
// log-sum-exp per row, no log_softmax tensor. N = rows, C = classes.
#include "ops/families.h"
#include "ops/kernel_checks.h"
#include "ops/functional.h"
#include "ops/reference.h"
#include "ops/cpu/simd.h"

#include <cmath>

namespace mf {
namespace {

using namespace detail;
using cpu::exp_of;
using cpu::load;
using cpu::pack_map;
using cpu::pack_sum;

// Inputs logits [N, C] and int64 target [N], with ignore_index and label_smoothing = e; outputs
// the per-row loss [N]: (1 - e) * -log p[target] + e * mean_c(-log p_c), and lse [N]: the row's
// log-sum-exp, log p_c = logits_c - lse; both 0 where target == ignore_index.
// cross_entropy_backward: inputs dloss [N], logits, target, lse, dlse [N]; output
// dlogits = dloss * (softmax - (1 - e) * onehot(target) - e / C) + dlse * softmax, zero rows where
// ignored, with softmax = exp(logits - lse): the forward's lse spares the backward two passes a row.

void check_cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyParams& params) {
  expect_float(logits, "logits");
  MF_CHECK(logits.dim() == 2 && logits.size(1) > 0, "expects logits [N, C] with C > 0, got shape {}",
           shape_str(logits.shape()));
  MF_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
           "target of shape {} does not match logits of shape {} (expected [{}])", shape_str(target.shape()),
           shape_str(logits.shape()), logits.size(0));
  MF_CHECK(params.label_smoothing >= 0 && params.label_smoothing <= 1, "label_smoothing must be in [0, 1], got {}",
           params.label_smoothing);
  expect_int64(target, "target");
  if (auto bad = find_bad_index(target, logits.size(1), params.ignore_index))
    fail("target {} (at position {}) is out of range for {} classes (valid targets are 0 to {}, or ignore_index {})",
         bad->second, bad->first, logits.size(1), logits.size(1) - 1, params.ignore_index);
}

std::vector<OutputSpec> infer_cross_entropy(const std::vector<Tensor>& in, const Attrs& attrs) {
  check_cross_entropy(in[0], in[1], std::get<CrossEntropyParams>(attrs));
  return {{{in[0].size(0)}, in[0].dtype()}, {{in[0].size(0)}, in[0].dtype()}};
}

/// log(sum_c exp(row_c)), shifted by the row's max so that exp cannot overflow; W-byte vectors.
template <int W, typename T>
MF_INLINE double log_sum_exp(const T* row, int64_t C) {
  T top = cpu::row_extreme<true, W>(row, C);
  // Lambdas that take packs are inlined by force: called out of line from ISA-specific code, a pack
  // argument or result would cross a call between code built for different vector widths.
  double total = pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
    return exp_of(load<V>(row + c) - top);
  });
  return static_cast<double>(top) + std::log(total);
}

void cpu_cross_entropy(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  Tensor logits = dense(in[0]), target = dense(in[1]);
  int64_t N = logits.size(0), C = logits.size(1);
  double e = params.label_smoothing;
  visit_floating(logits.dtype(), [&]<typename T>() {
    const T* x = logits.data_ptr<T>();                // [N, C]
    const int64_t* t = target.data_ptr<int64_t>();  // [N]
    T *loss = out[0].data_ptr<T>(), *lse_out = out[1].data_ptr<T>();  // [N] each
    parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t n = begin; n < end; ++n) {
          if (t[n] == params.ignore_index) {
            loss[n] = lse_out[n] = T{0};
            continue;
          }
          const T* row = x + n * C;
          double lse = log_sum_exp<W>(row, C), value = (1 - e) * (lse - static_cast<double>(row[t[n]]));
          if (e != 0) {
            double logits_sum =
                pack_sum<T, W>(C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE { return load<V>(row + c); });
            value += e * (lse - logits_sum / static_cast<double>(C));
          }
          loss[n] = static_cast<T>(value);
          lse_out[n] = static_cast<T>(lse);
        }
      });
    });
  });
}

std::vector<Tensor> cross_entropy_rule(const GradContext& ctx) {
  return {
      call1<OpId::cross_entropy_backward>({ctx.grads[0], ctx.inputs[0], ctx.inputs[1], ctx.outputs[1], ctx.grads[1]},
                                          std::get<CrossEntropyParams>(ctx.attrs), ctx.site),
      Tensor()};
}

/// log p_c of one row, by an explicit max-shifted log-sum-exp in double.
std::vector<double> reference_log_probs(const Tensor& logits, int64_t n) {
  int64_t C = logits.size(1);
  double top = -INFINITY, total = 0;
  for (int64_t c = 0; c < C; ++c) top = std::max(top, logits.at<double>({n, c}));
  for (int64_t c = 0; c < C; ++c) total += std::exp(logits.at<double>({n, c}) - top);
  std::vector<double> log_probs;
  for (int64_t c = 0; c < C; ++c) log_probs.push_back(logits.at<double>({n, c}) - top - std::log(total));
  return log_probs;
}

std::vector<Tensor> reference_cross_entropy(const std::vector<Tensor>& in, const Attrs& attrs) {
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  const Tensor &logits = in[0], &target = in[1];
  double e = params.label_smoothing;
  std::vector<double> losses, lses;
  for (int64_t n = 0; n < logits.size(0); ++n) {
    int64_t t = target.at<int64_t>({n});
    if (t == params.ignore_index) {
      losses.push_back(0);
      lses.push_back(0);
      continue;
    }
    std::vector<double> log_probs = reference_log_probs(logits, n);
    double smooth = 0;
    for (double lp : log_probs) smooth -= lp / static_cast<double>(log_probs.size());
    losses.push_back(-(1 - e) * log_probs[t] + e * smooth);
    lses.push_back(logits.at<double>({n, 0}) - log_probs[0]);
  }
  return {reference::make({logits.size(0)}, logits.dtype(), losses),
          reference::make({logits.size(0)}, logits.dtype(), lses)};
}

/// Targets in [0, C) with row `ignored` set to ignore_index -100.
Tensor targets_with_ignored(int64_t n, int64_t classes, uint64_t seed, int64_t ignored) {
  Tensor target = reference::randint({n}, classes, seed);
  target.data_ptr<int64_t>()[ignored] = -100;
  return target;
}

std::vector<Sample> cross_entropy_samples() {
  return {
      {"plain", {reference::randn({4, 5}, 471), reference::randint({4}, 5, 472)}, CrossEntropyParams{}},
      {"ignored row, label smoothing 0.1",
       {reference::randn({6, 4}, 473), targets_with_ignored(6, 4, 474, 2)},
       CrossEntropyParams{.label_smoothing = 0.1}},
      {"other ignore_index, large logits",
       {reference::uniform({3, 7}, 50, 90, 475), reference::randint({3}, 7, 476)},
       CrossEntropyParams{.ignore_index = 0, .label_smoothing = 0.3}},
      {"one class",
       {reference::randn({3, 1}, 477), reference::randint({3}, 1, 478)},
       CrossEntropyParams{.label_smoothing = 0.2}},
  };
}

std::vector<OutputSpec> infer_cross_entropy_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &dloss = in[0], &logits = in[1];
  check_cross_entropy(logits, in[2], std::get<CrossEntropyParams>(attrs));
  expect_tensor(dloss, "dloss", {logits.size(0)}, logits.dtype());
  expect_tensor(in[3], "lse", {logits.size(0)}, logits.dtype());
  expect_tensor(in[4], "dlse", {logits.size(0)}, logits.dtype());
  return {{logits.shape(), logits.dtype()}};
}

void cpu_cross_entropy_backward(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  Tensor dloss = dense(in[0]), logits = dense(in[1]), target = dense(in[2]), lses = dense(in[3]),
         dlses = dense(in[4]);
  int64_t N = logits.size(0), C = logits.size(1);
  double e = params.label_smoothing, uniform_share = e / static_cast<double>(C);
  visit_floating(logits.dtype(), [&]<typename T>() {
    const T* dl = dloss.data_ptr<T>();               // [N]
    const T *lse_of = lses.data_ptr<T>(), *dlse = dlses.data_ptr<T>();  // [N] each
    const T* x = logits.data_ptr<T>();               // [N, C]
    const int64_t* t = target.data_ptr<int64_t>();  // [N]
    T* dx = out[0].data_ptr<T>();                    // [N, C]
    parallel_for(0, N, grain_for(C), [&](int64_t begin, int64_t end) {
      cpu::with_widest_isa([&]<int W>() MF_LAMBDA_INLINE {
        for (int64_t n = begin; n < end; ++n) {
          T* drow = dx + n * C;
          if (t[n] == params.ignore_index) {
            std::fill(drow, drow + C, T{0});
            continue;
          }
          const T* row = x + n * C;
          T lse = lse_of[n], g = dl[n], g_softmax = g + dlse[n], g_share = g * static_cast<T>(uniform_share);
          pack_map<W>(drow, C, [=]<typename V>(int64_t c) MF_LAMBDA_INLINE {
            return g_softmax * exp_of(load<V>(row + c) - lse) - g_share;
          });
          drow[t[n]] -= g * static_cast<T>(1 - e);
        }
      });
    });
  });
}

std::vector<Tensor> reference_cross_entropy_backward(const std::vector<Tensor>& in, const Attrs& attrs) {
  const CrossEntropyParams& params = std::get<CrossEntropyParams>(attrs);
  const Tensor &dloss = in[0], &logits = in[1], &target = in[2], &lse = in[3], &dlse = in[4];
  int64_t C = logits.size(1);
  double e = params.label_smoothing;
  std::vector<double> grads;
  for (int64_t n = 0; n < logits.size(0); ++n) {
    int64_t t = target.at<int64_t>({n});
    for (int64_t c = 0; c < C; ++c) {
      double smoothed_target = (c == t ? 1 - e : 0.0) + e / static_cast<double>(C);
      double softmax = std::exp(logits.at<double>({n, c}) - lse.at<double>({n}));
      double grad = dloss.at<double>({n}) * (softmax - smoothed_target) + dlse.at<double>({n}) * softmax;
      grads.push_back(t == params.ignore_index ? 0.0 : grad);
    }
  }
  return {reference::make(logits.shape(), logits.dtype(), grads)};
}

/// Inputs of cross_entropy_backward: dloss and dlse drawn, lse the forward's for these logits.
std::vector<Tensor> backward_inputs(const Tensor& logits, const Tensor& target, uint64_t seed) {
  int64_t N = logits.size(0);
  std::vector<double> lses;
  for (int64_t n = 0; n < N; ++n) lses.push_back(logits.at<double>({n, 0}) - reference_log_probs(logits, n)[0]);
  return {reference::randn({N}, seed), logits, target, reference::make({N}, logits.dtype(), lses),
          reference::randn({N}, seed + 1)};
}

std::vector<Sample> cross_entropy_backward_samples() {
  return {
      {"plain", backward_inputs(reference::randn({4, 5}, 482), reference::randint({4}, 5, 483), 481),
       CrossEntropyParams{}},
      {"ignored row, label smoothing 0.1",
       backward_inputs(reference::randn({6, 4}, 485), targets_with_ignored(6, 4, 486, 3), 484),
       CrossEntropyParams{.label_smoothing = 0.1}},
      {"large logits",
       backward_inputs(reference::uniform({3, 7}, 50, 90, 488), reference::randint({3}, 7, 489), 490),
       CrossEntropyParams{.label_smoothing = 0.3}},
  };
}

}  // namespace

void register_loss_ops(Registry& r) {
  r.define(OpId::cross_entropy, {.name = "cross_entropy", .infer = infer_cross_entropy,
                                 .kernels = {cpu_cross_entropy}, .backward = cross_entropy_rule,
                                 .saves_outputs = true, .first_saved_output = 1,
                                 .samples = cross_entropy_samples, .reference = reference_cross_entropy});
  // Not differentiable itself: its samples check the forward only.
  r.define(OpId::cross_entropy_backward,
           {.name = "cross_entropy_backward", .infer = infer_cross_entropy_backward,
            .kernels = {cpu_cross_entropy_backward}, .samples = cross_entropy_backward_samples,
            .reference = reference_cross_entropy_backward});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction, Site site) {
  MF_CHECK(logits.dim() >= 1, "cross_entropy: logits must have a class dim, got shape {} at {}",
           shape_str(logits.shape()), format_location(site));
  Shape batch(logits.shape().begin(), logits.shape().end() - 1);  // [...]
  MF_CHECK(target.shape() == batch,
           "cross_entropy: target of shape {} does not match logits of shape {} (expected target shape {}) at {}",
           shape_str(target.shape()), shape_str(logits.shape()), shape_str(batch), format_location(site));
  int64_t N = shape_numel(batch), C = logits.size(-1);
  Tensor losses = call<OpId::cross_entropy>({logits.reshape({N, C}, site), target.reshape({N}, site)},
                                            {.ignore_index = ignore_index, .label_smoothing = label_smoothing},
                                            site)[0];  // [N]
  switch (reduction) {
    case Reduction::None: return losses.reshape(batch, site);
    case Reduction::Sum: return losses.sum({}, false, site);
    case Reduction::Mean: break;
  }
  // PyTorch's mean: over the targets that count, so nan (0 / 0) when every target is ignored.
  std::vector<int64_t> targets = target.to_vector<int64_t>();
  auto counted = static_cast<double>(std::count_if(targets.begin(), targets.end(),
                                                   [&](int64_t t) { return t != ignore_index; }));
  return losses.sum({}, false, site).div(counted, site);
}

}  // namespace mf
