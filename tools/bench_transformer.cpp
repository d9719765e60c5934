// Training-step and decoding benchmark of the Transformer on the three configs. Prints the
// median step time split into forward / backward / optimizer, tokens/s, achieved GFLOP/s against a
// large float32 GEMM measured in the same run (OpenBLAS's cblas_sgemm, the yardstick, and miniflow's
// own matmul), peak RSS, and greedy / beam-4 decoding throughput.
// --device cuda runs it all on a GPU, waiting for the GPU at the end of each timed phase.
#include "miniflow.h"
#include "tools/bench_configs.h"
#include "tools/cli.h"

#include <cblas.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

namespace {

using Clock = std::chrono::steady_clock;

using mf::tools::BenchConfig;

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

/// The GEMM rates a step's GFLOP/s is held against, 2048^3 in float32: OpenBLAS's cblas_sgemm (the
/// issue's yardstick; cuBLAS through matmul on a GPU) and miniflow's own matmul (its AVX-512 kernel
/// on CPUs that have one). One product is timed after every timed training step, the two in turn,
/// so that the rates are measured under the conditions the steps ran in: this machine's clock and
/// its neighbours drift by several percent within a minute. Like the PyTorch peer's, it holds two
/// operands and one product's output at a time (48 MB, counted in peak RSS on both sides).
class GemmYardstick {
 public:
  explicit GemmYardstick(mf::Device device)
      : device_(device), a_(mf::randn({kSize, kSize}).to(device)), b_(mf::randn({kSize, kSize}).to(device)) {
    sgemm();  // warm-up: the output's first touch, BLAS's buffers
    matmul();
  }

  /// Times one product, cblas_sgemm and miniflow's matmul in turn; both on the first call, so that
  /// one timed step (--steps 1) gives both rates.
  void sample() {
    bool blas = sgemm_seconds_.size() <= matmul_seconds_.size();
    auto start = Clock::now();
    blas ? sgemm() : matmul();
    (blas ? sgemm_seconds_ : matmul_seconds_).push_back(seconds_since(start, device_));
    if (matmul_seconds_.empty()) sample();
  }

  double sgemm_gflops() const { return gflops(sgemm_seconds_); }
  double matmul_gflops() const { return gflops(matmul_seconds_); }

 private:
  static constexpr int64_t kSize = 2048;

  static double gflops(const std::vector<double>& seconds) {
    double n = static_cast<double>(kSize);
    return 2 * n * n * n / median(seconds) / 1e9;
  }

  void matmul() {
    mf::NoGradGuard no_grad;
    mf::matmul(a_, b_);
  }

  // cblas_sgemm with its rows split over the pool, as miniflow splits the products it gives OpenBLAS
  // (inside miniflow OpenBLAS runs single-threaded). Its output comes from the
  // caching allocator, as matmul's does (the same block, once the first product has freed it).
  void sgemm() {
    if (!device_.is_cpu()) return matmul();
    mf::Tensor c = mf::Tensor::empty({kSize, kSize});
    const float *pa = a_.data_ptr<float>(), *pb = b_.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    int64_t rows_per_thread = (kSize + mf::get_num_threads() - 1) / mf::get_num_threads();
    mf::parallel_for(0, kSize, rows_per_thread, [&](int64_t lo, int64_t hi) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(hi - lo), kSize, kSize, 1.0f,
                  pa + lo * kSize, kSize, pb, kSize, 0.0f, pc + lo * kSize, kSize);
    });
  }

  mf::Device device_;
  mf::Tensor a_, b_;
  std::vector<double> sgemm_seconds_, matmul_seconds_;
};

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0;
  double total() const { return forward + backward + optimizer; }
};

/// Prints the table (to stderr: stdout may be JSON) and writes the trace.
void report_profile(const mf::profiler::Profiler& profiler, const mf::tools::ProfileFlags& request,
                    std::string_view config) {
  if (request.table)
    fmt::print(stderr, "{}: where the timed steps' time went (ops by self time, input shapes apart; regions "
               "forward, backward, optimizer around them)\n{}", config, profiler.table({.row_limit = 30}));
  if (!request.trace.empty()) {
    profiler.export_chrome_trace(request.trace);
    fmt::print(stderr, "{}: Chrome trace of the timed steps written to {}\n", config, request.trace);
  }
}

std::map<std::string, double> bench_config(const BenchConfig& c, int steps, bool decode, mf::Device device,
                                           const mf::tools::ProfileFlags& profile) {
  GemmYardstick yardstick(device);
  mf::manual_seed(0);
  mf::models::Transformer model(c.model());
  model.to(device);
  mf::optim::Adam adam(model.parameters(), {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  mf::Generator data(1);
  // Random ids in [1, V): no padding, so every position does full work.
  mf::Tensor src = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);
  mf::Tensor tgt_in = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);
  mf::Tensor tgt_out = mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).to(device);

  std::vector<StepTimes> times;
  std::optional<mf::profiler::Profiler> profiler;
  for (int step = 0; step < steps + 2; ++step) {  // two warm-up steps fill the allocator's cache
    if (step == 2 && profile.wanted()) profiler.emplace(mf::profiler::ProfilerOptions{.record_shapes = true});
    StepTimes t;
    auto start = Clock::now();
    mf::Tensor loss;
    {
      auto region = mf::profiler::record_function("forward");
      loss = mf::cross_entropy(model.forward(src, tgt_in).reshape({-1, c.vocab}), tgt_out.reshape({-1}), 0);
      t.forward = seconds_since(start, device);
    }
    start = Clock::now();
    {
      auto region = mf::profiler::record_function("backward");
      loss.backward();
      t.backward = seconds_since(start, device);
    }
    start = Clock::now();
    {
      auto region = mf::profiler::record_function("optimizer");
      adam.step();
      adam.zero_grad();
      t.optimizer = seconds_since(start, device);
    }
    if (step < 2) continue;
    times.push_back(t);
    if (!profiler) yardstick.sample();
  }
  if (profiler) {  // the yardstick's products, kept out of the profile, come after the steps
    profiler->stop();
    for (int i = 0; i < steps; ++i) yardstick.sample();
    report_profile(*profiler, profile, c.name);
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
      {"sgemm_gflops", yardstick.sgemm_gflops()},   {"gflops_vs_sgemm", gflops / yardstick.sgemm_gflops()},
      {"matmul_gflops", yardstick.matmul_gflops()}, {"gflops_vs_matmul", gflops / yardstick.matmul_gflops()},
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
        if (ids[static_cast<size_t>(b * width + t)] == mf::text::kEosId) break;
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
    std::string only, precision = "highest", autocast_precision = "fp32";
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
    args.add("float32-matmul-precision", &precision,
             "highest or high (float32 products), or medium (bfloat16 operands where AVX512-BF16 runs), as "
             "mf::set_float32_matmul_precision");
    args.add("precision", &autocast_precision,
             "fp32, or bf16: the steps under autocast (GEMMs on bfloat16 operands summed in float32)");
    args.add_switch("json", &json, "print one JSON object per config instead of a table");
    mf::tools::ProfileFlags profile;
    args.add_switch("profile", &profile.table,
                    "print where the timed steps' time goes, op by op (mf::profiler), to stderr; profiling adds "
                    "its own cost to the times");
    args.add("profile-trace", &profile.trace, "write the timed steps' ops as a Chrome trace (JSON) to this file");
    if (!args.parse(argc, argv)) return 0;
    mf::tools::set_matmul_precision_flag(precision);
    if (steps < 1) throw mf::tools::UsageError("--steps must be at least 1");
    bool known = only.empty();
    for (const BenchConfig& c : mf::tools::kBenchConfigs) known = known || only == c.name;
    if (!known) throw mf::tools::UsageError(fmt::format("unknown config '{}' (seed, small or base)", only));
    mf::tools::check_device_available(device, "--device");
    mf::AutocastGuard autocast(device.type, mf::DType::BFloat16,
                               mf::tools::autocast_from_precision_flag(autocast_precision, device));
    mf::set_num_threads(threads);

    if (!json)
      fmt::print("CPU {}: {}\n{}, threads {}, float32 matmul precision {}, precision {}\n", mf::cpu_model_name(),
                 mf::describe_kernel_isa(), device.str(), threads, precision, autocast_precision);
    for (const BenchConfig& c : mf::tools::kBenchConfigs) {
      if (!only.empty() && only != c.name) continue;
      auto result = bench_config(c, static_cast<int>(steps), std::string(c.name) == "small", device, profile);
      if (json) {
        std::string fields =
            fmt::format("\"config\": \"{}\", \"device\": \"{}\", \"threads\": {}, \"kernels\": \"{}\"", c.name,
                        device.str(), threads, mf::isa_name(mf::kernel_isa()));
        fields += fmt::format(", \"float32_matmul_precision\": \"{}\", \"precision\": \"{}\"", precision,
                              autocast_precision);
        for (const auto& [key, value] : result) fields += fmt::format(", \"{}\": {:.6g}", key, value);
        fmt::print("{{{}}}\n", fields);
        continue;
      }
      fmt::print("{:>5}: {:8.1f} ms/step (fwd {:.1f}, bwd {:.1f}, adam {:.1f})  {:8.0f} tok/s  {:6.1f} GFLOP/s "
                 "({:.0f}% of cblas_sgemm's {:.1f}; miniflow's matmul {:.1f})  peak RSS {:.0f} MB\n",
                 c.name, result["ms_per_step"], result["forward_ms"], result["backward_ms"], result["optimizer_ms"],
                 result["tokens_per_s"], result["gflops"], 100 * result["gflops_vs_sgemm"], result["sgemm_gflops"],
                 result["matmul_gflops"], result["peak_rss_mb"]);
      if (result.count("greedy_tokens_per_s"))
        fmt::print("       decoding 32 sentences: greedy {:.0f} tok/s, beam 4 {:.0f} tok/s\n",
                   result["greedy_tokens_per_s"], result["beam4_tokens_per_s"]);
    }
    return 0;
  });
}
