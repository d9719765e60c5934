// Training-step and decoding benchmark of the Transformer on the three configs. Prints the
// median step time split into forward / backward / optimizer, tokens/s, achieved GFLOP/s against a
// large float32 GEMM measured in the same run (OpenBLAS's cblas_sgemm, the yardstick, and miniflow's
// own matmul), peak RSS, and greedy / beam-4 decoding throughput.
// --device cuda runs it all on a GPU, waiting for the GPU at the end of each timed phase.
#include "miniflow.h"
#include "tools/cli.h"

#include <cblas.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchConfig {
  const char* name;
  int64_t d_model, layers, heads, d_ff, vocab, batch, length;
};

constexpr BenchConfig kConfigs[] = {
    {"seed", 512, 6, 8, 2048, 32, 6, 20},
    {"small", 256, 3, 4, 1024, 8000, 32, 32},
    {"base", 512, 6, 8, 2048, 16000, 16, 64},
};

/// Waits for the work queued on `device` (GPU kernels run asynchronously).
void wait_for(mf::Device device) {
  if (device.is_cuda()) mf::cuda::synchronize(device.index);
}

/// Seconds since `start`, once the work queued on `device` has finished.
double seconds_since(Clock::time_point start, mf::Device device) {
  wait_for(device);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

/// Multiply-adds of one forward pass, times 2 for FLOPs: every Linear, the attention products, and
/// the tied output projection (backward is counted as twice the forward, the usual convention).
double forward_flops(const BenchConfig& c) {
  double B = static_cast<double>(c.batch), L = static_cast<double>(c.length), C = static_cast<double>(c.d_model);
  double F = static_cast<double>(c.d_ff), V = static_cast<double>(c.vocab), N = static_cast<double>(c.layers);
  double tokens = B * L;
  double attention_products = 2 * B * L * L * C;  // Q K^T and P V over all heads
  double encoder_layer = tokens * (4 * C * C + 2 * C * F) + attention_products;
  double decoder_layer = tokens * (8 * C * C + 2 * C * F) + 2 * attention_products;
  return 2 * (N * (encoder_layer + decoder_layer) + tokens * C * V);
}

/// GFLOP/s of `product`, a 2048^3 float32 GEMM: the median of 5 runs after a warm-up.
double gemm_gflops(const std::function<void()>& product, mf::Device device) {
  constexpr double kSize = 2048;
  product();
  wait_for(device);
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    product();
    times.push_back(seconds_since(start, device));
  }
  return 2 * kSize * kSize * kSize / median(times) / 1e9;
}

/// The GEMM rates a step's GFLOP/s is held against, 2048^3 in float32.
struct GemmRates {
  double sgemm;   // the yardstick: OpenBLAS's cblas_sgemm on CPU (cuBLAS through matmul on a GPU)
  double matmul;  // miniflow's own matmul (its AVX-512 kernel on CPUs that have one)
};

GemmRates measure_gemm_rates(mf::Device device) {
  const int64_t n = 2048;
  mf::NoGradGuard no_grad;
  mf::Tensor a = mf::randn({n, n}).to(device), b = mf::randn({n, n}).to(device);
  double matmul = gemm_gflops([&] { mf::matmul(a, b); }, device);
  if (!device.is_cpu()) return {matmul, matmul};
  // cblas_sgemm with its rows split over the pool, as miniflow split its products before it had a
  // kernel of its own (inside miniflow OpenBLAS runs single-threaded).
  mf::Tensor c = mf::Tensor::empty({n, n});
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  int64_t rows_per_thread = (n + mf::get_num_threads() - 1) / mf::get_num_threads();
  double sgemm = gemm_gflops(
      [&] {
        mf::parallel_for(0, n, rows_per_thread, [&](int64_t lo, int64_t hi) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(hi - lo), n, n, 1.0f, pa + lo * n,
                      n, pb, n, 0.0f, pc + lo * n, n);
        });
      },
      device);
  return {sgemm, matmul};
}

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0;
  double total() const { return forward + backward + optimizer; }
};

std::map<std::string, double> bench_config(const BenchConfig& c, int steps, GemmRates gemm, bool decode,
                                           mf::Device device) {
  mf::manual_seed(0);
  mf::models::TransformerConfig config{.src_vocab = c.vocab, .tgt_vocab = c.vocab, .d_model = c.d_model,
                                       .heads = c.heads, .encoder_layers = c.layers, .decoder_layers = c.layers,
                                       .d_ff = c.d_ff, .dropout = 0.1, .max_len = std::max<int64_t>(c.length, 64) + 1};
  mf::models::Transformer model(config);
  model.to(device);
  mf::optim::Adam adam(model.parameters(), {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  mf::Generator data(1);
  // Random ids in [1, V): no padding, so every position does full work.
  mf::Tensor src = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);
  mf::Tensor tgt_in = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);
  mf::Tensor tgt_out = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);

  std::vector<StepTimes> times;
  for (int step = 0; step < steps + 2; ++step) {  // two warm-up steps fill the allocator's cache
    StepTimes t;
    auto start = Clock::now();
    mf::Tensor loss = mf::cross_entropy(model.forward(src, tgt_in).reshape({-1, c.vocab}), tgt_out.reshape({-1}), 0);
    t.forward = seconds_since(start, device);
    start = Clock::now();
    loss.backward();
    t.backward = seconds_since(start, device);
    start = Clock::now();
    adam.step();
    adam.zero_grad();
    t.optimizer = seconds_since(start, device);
    if (step >= 2) times.push_back(t);
  }
  auto pick = [&](double StepTimes::*field) {
    std::vector<double> v;
    for (const StepTimes& t : times) v.push_back(t.*field);
    return median(v);
  };
  std::vector<double> totals;
  for (const StepTimes& t : times) totals.push_back(t.total());
  double step_s = median(totals);
  double tokens = static_cast<double>(c.batch * c.length) * 2;  // source + target tokens
  double gflops = 3 * forward_flops(c) / step_s / 1e9;
  std::map<std::string, double> out{
      {"ms_per_step", step_s * 1e3},     {"forward_ms", pick(&StepTimes::forward) * 1e3},
      {"backward_ms", pick(&StepTimes::backward) * 1e3}, {"optimizer_ms", pick(&StepTimes::optimizer) * 1e3},
      {"tokens_per_s", tokens / step_s}, {"gflops", gflops},
      {"sgemm_gflops", gemm.sgemm},      {"gflops_vs_sgemm", gflops / gemm.sgemm},
      {"matmul_gflops", gemm.matmul},    {"gflops_vs_matmul", gflops / gemm.matmul},
      {"peak_rss_mb", peak_rss_mb()}};
  if (decode) {
    model.eval();
    mf::Tensor sources = mf::randint(3, c.vocab, {32, c.length}, mf::Device::cpu(), &data).to(device);
    auto start = Clock::now();
    mf::generation::GreedyResult greedy = mf::models::greedy_decode(model, sources, {.max_new_tokens = 32});
    double greedy_s = seconds_since(start, device);
    int64_t greedy_tokens = 0;  // generated positions up to and including each row's EOS
    int64_t width = greedy.tokens.size(1);
    std::vector<int64_t> ids = greedy.tokens.to_vector<int64_t>();  // one copy, also from a GPU
    for (int64_t b = 0; b < greedy.tokens.size(0); ++b)
      for (int64_t t = 1; t < width; ++t) {
        ++greedy_tokens;
        if (ids[static_cast<size_t>(b * width + t)] == mf::Vocab::kEos) break;
      }
    start = Clock::now();
    auto beams = mf::models::beam_search(model, sources, {.beam_size = 4, .max_new_tokens = 32});
    double beam_s = seconds_since(start, device);
    int64_t beam_tokens = 0;
    for (const auto& list : beams) beam_tokens += static_cast<int64_t>(list[0].tokens.size());
    out["greedy_tokens_per_s"] = static_cast<double>(greedy_tokens) / greedy_s;
    out["beam4_tokens_per_s"] = static_cast<double>(beam_tokens) / beam_s;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("bench_transformer", [&] {
    std::string only;
    int threads = mf::get_num_threads();
    int64_t steps = 10;
    bool json = false;
    mf::Device device = mf::Device::cpu();
    mf::tools::ArgParser args("bench_transformer",
                              "Times Transformer training steps (configs seed, small, base) and decoding.");
    args.add("config", &only, "run only this config (seed, small or base)");
    args.add("threads", &threads, "intra-op threads (OpenBLAS runs single-threaded inside them)");
    args.add("steps", &steps, "timed steps per config, after 2 warm-up steps");
    args.add("device", &device, "where to run: cpu, cuda or cuda:N");
    args.add_switch("json", &json, "print one JSON object per config instead of a table");
    if (!args.parse(argc, argv)) return 0;
    if (steps < 1) throw mf::tools::UsageError("--steps must be at least 1");
    bool known = only.empty();
    for (const BenchConfig& c : kConfigs) known = known || only == c.name;
    if (!known) throw mf::tools::UsageError(fmt::format("unknown config '{}' (seed, small or base)", only));
    mf::tools::check_device_available(device, "--device");
    mf::set_num_threads(threads);

    GemmRates gemm = measure_gemm_rates(device);
    if (!json)
      fmt::print("{}, threads {}, float32 GEMM 2048^3: cblas_sgemm {:.1f} GFLOP/s, miniflow matmul {:.1f} GFLOP/s\n",
                 device.str(), threads, gemm.sgemm, gemm.matmul);
    for (const BenchConfig& c : kConfigs) {
      if (!only.empty() && only != c.name) continue;
      auto result = bench_config(c, static_cast<int>(steps), gemm, std::string(c.name) == "small", device);
      if (json) {
        std::string fields =
            fmt::format("\"config\": \"{}\", \"device\": \"{}\", \"threads\": {}", c.name, device.str(), threads);
        for (const auto& [key, value] : result) fields += fmt::format(", \"{}\": {:.6g}", key, value);
        fmt::print("{{{}}}\n", fields);
        continue;
      }
      fmt::print("{:>5}: {:8.1f} ms/step (fwd {:.1f}, bwd {:.1f}, adam {:.1f})  {:8.0f} tok/s  {:6.1f} GFLOP/s "
                 "({:.0f}% of cblas_sgemm)  peak RSS {:.0f} MB\n",
                 c.name, result["ms_per_step"], result["forward_ms"], result["backward_ms"], result["optimizer_ms"],
                 result["tokens_per_s"], result["gflops"], 100 * result["gflops_vs_sgemm"], result["peak_rss_mb"]);
      if (result.count("greedy_tokens_per_s"))
        fmt::print("       decoding 32 sentences: greedy {:.0f} tok/s, beam 4 {:.0f} tok/s\n",
                   result["greedy_tokens_per_s"], result["beam4_tokens_per_s"]);
    }
    return 0;
  });
}
