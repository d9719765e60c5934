// Data-parallel training benchmark. Run alone it trains with the local process group (one process,
// --threads intra-op threads); under `mpirun -np W ... --distributed` each rank trains its B / W rows
// of the same global batch and DistributedDataParallel sums the gradients. Prints (rank 0) the
// median step time and training tokens/s of the global batch, the time the gradient reduction
// takes with nothing to hide it (the buckets reduced after a backward that did nothing), how much
// longer a step is than the same ranks' steps without communication, and from the two the share of
// the reduction hidden behind backward; and how much longer a step is with the reduction made the
// other way (after backward instead of during it, or the reverse). The three kinds of step take
// turns in one run. --sweep times all_reduce over message sizes instead, with algorithm and bus
// bandwidth as nccl-tests reports them.
#include "miniflow.h"
#include "tools/bench_configs.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>

namespace {

using Clock = std::chrono::steady_clock;
namespace dist = mf::distributed;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// The ranks' largest value: the step ends for the job when its slowest rank is done.
double slowest(dist::ProcessGroup& group, double seconds) {
  mf::Tensor t = mf::full({1}, seconds, mf::DType::Float64);
  group.all_reduce(t, dist::ReduceOp::Max);
  return t.item<double>();
}

struct StepResult {
  double step_s;                                      // the slowest rank's
  double forward_s, backward_s, sync_s, optimizer_s;  // its phases on rank 0
};

/// Step times of one kind of step, after two warm-up steps: the slowest rank's, and rank 0's phases.
struct StepTimes {
  std::vector<double> step, phases[4];
  StepResult medians() const {
    return {median(step), median(phases[0]), median(phases[1]), median(phases[2]), median(phases[3])};
  }
};

/// `steps` timed training steps (after two warm-up ones) of this rank's share of the global batch
/// through each of `ddps`, the kinds taking turns step by step so that drifts in the machine's speed
/// fall on all alike; the others' hooks are held by no_sync() meanwhile. Each step is timed from a
/// barrier of `job` (the ranks, whose shares each takes) to the slowest rank's end.
std::vector<StepTimes> time_steps(mf::models::Transformer& model, mf::optim::Adam& adam,
                                  std::span<dist::DistributedDataParallel* const> ddps,
                                  std::span<const std::string> kind_names, dist::ProcessGroup& job,
                                  const mf::tools::BenchConfig& c, int64_t steps,
                                  const std::function<void()>& before_timed_steps) {
  const int64_t rows = c.batch / job.world_size(), first = rows * job.rank();
  mf::Generator data(1);  // the same global batch on every rank; each takes its rows
  auto ids = [&] {
    return mf::randint(1, c.vocab, {c.batch, c.length}, mf::Device::cpu(), &data).narrow(0, first, rows);
  };
  mf::Tensor src = ids(), tgt_in = ids(), tgt_out = ids();
  std::vector<StepTimes> times(ddps.size());
  for (int64_t step = 0; step < steps + 2; ++step) {
    if (step == 2) before_timed_steps();
    for (size_t kind = 0; kind < ddps.size(); ++kind) {
      dist::DistributedDataParallel& ddp = *ddps[kind];
      using Quiet = dist::DistributedDataParallel::NoSyncGuard;
      std::vector<std::unique_ptr<Quiet>> others_quiet;
      for (dist::DistributedDataParallel* other : ddps)
        if (other != &ddp) others_quiet.push_back(std::make_unique<Quiet>(*other));
      job.barrier();
      auto step_region = mf::profiler::record_function(kind_names[kind]);  // for --profile and --profile-trace
      const auto start = Clock::now();
      auto lap = start;
      double phase[4];
      auto end_phase = [&](int k) {
        auto now = Clock::now();
        phase[k] = std::chrono::duration<double>(now - lap).count();
        lap = now;
      };
      mf::Tensor loss =
          mf::cross_entropy(model.forward(src, tgt_in).reshape({-1, c.vocab}), tgt_out.reshape({-1}), 0);
      end_phase(0);
      loss.backward();
      end_phase(1);
      ddp.finish_gradient_sync();
      end_phase(2);
      adam.step();
      adam.zero_grad();
      end_phase(3);
      double seconds = slowest(job, seconds_since(start));
      if (step < 2) continue;
      times[kind].step.push_back(seconds);
      for (int k = 0; k < 4; ++k) times[kind].phases[k].push_back(phase[k]);
    }
  }
  return times;
}

/// The gradient reduction alone: finish_gradient_sync() after no backward reduces every bucket
/// (zeros), with nothing else running.
double time_reduction(dist::DistributedDataParallel& ddp, int64_t repeats) {
  std::vector<double> times;
  for (int64_t r = 0; r < repeats + 1; ++r) {
    ddp.group().barrier();
    auto start = Clock::now();
    ddp.finish_gradient_sync();
    double seconds = slowest(ddp.group(), seconds_since(start));
    if (r > 0) times.push_back(seconds);
  }
  return median(times);
}

void bench_training(std::shared_ptr<dist::ProcessGroup> group, const mf::tools::BenchConfig& c, int64_t steps,
                    double bucket_mb, bool overlap, dist::GradientCompression compression, bool json,
                    const mf::tools::ProfileFlags& profile) {
  MF_CHECK(c.batch % group->world_size() == 0, "bench_distributed: the {} config's batch of {} does not split over "
           "{} ranks", c.name, c.batch, group->world_size());
  mf::manual_seed(0);
  mf::models::Transformer model(c.model());
  mf::optim::Adam adam(model.parameters(), {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  const int64_t bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
  auto options = [&](bool overlapping) {
    return dist::DataParallelOptions{.bucket_bytes = bucket_bytes, .overlap = overlapping, .compression = compression};
  };
  dist::DistributedDataParallel ddp(model, group, options(overlap));
  // With several ranks each step through ddp has two twins, timed in turn with it: one reducing
  // the other way (after backward, or while it runs), and one without communication (the same
  // ranks computing at the same time, each over a group of its own). What a step takes longer than
  // the quiet twin is what its reduction adds.
  std::optional<dist::DistributedDataParallel> other_way, quiet;
  if (group->world_size() > 1) {
    other_way.emplace(model, group, options(!overlap));
    quiet.emplace(model, dist::local_process_group(), options(false));
  }
  std::vector<dist::DistributedDataParallel*> kinds{&ddp};
  const std::string during = "step, reduced while backward runs", after = "step, reduced after backward";
  std::vector<std::string> kind_names{overlap ? during : after};
  if (quiet) {
    kinds.insert(kinds.end(), {&*other_way, &*quiet});
    kind_names.insert(kind_names.end(), {overlap ? after : during, "step without communication"});
  }
  std::optional<mf::profiler::Profiler> profiler;
  const std::vector<StepTimes> times = time_steps(model, adam, kinds, kind_names, *group, c, steps, [&] {
    if (profile.wanted()) profiler.emplace(mf::profiler::ProfilerOptions{.record_shapes = true});
  });
  if (profiler) {
    profiler->stop();
    if (!profile.trace.empty())
      profiler->export_chrome_trace(fmt::format("{}.rank{}.json", profile.trace, group->rank()));
    if (profile.table && group->rank() == 0)
      fmt::print(stderr, "rank 0's timed steps, every kind:\n{}", profiler->table({.row_limit = 30}));
  }
  const StepResult result = times[0].medians();
  // Per kind, the median over steps of how much longer it took than its quiet twin.
  auto added = [&](size_t kind) {
    if (!quiet) return 0.0;
    std::vector<double> longer;
    for (size_t i = 0; i < times[kind].step.size(); ++i) longer.push_back(times[kind].step[i] - times[2].step[i]);
    return median(longer);
  };
  const double exposed = added(0), exposed_other_way = added(1);
  const double reduction_s = time_reduction(ddp, 5);
  const double tokens = static_cast<double>(c.batch * c.length) * 2;  // source + target, the global batch
  // Of the reduction's time alone, the part the step does not take longer for.
  const double hidden = reduction_s > 0 ? std::clamp(1 - exposed / reduction_s, 0.0, 1.0) : 1.0;
  if (group->rank() != 0) return;
  if (json) {
    fmt::print("{{\"config\": \"{}\", \"world_size\": {}, \"threads\": {}, \"overlap\": {}, \"ms_per_step\": {:.2f}, "
               "\"tokens_per_s\": {:.1f}, \"reduction_ms\": {:.2f}, \"exposed_ms\": {:.2f}, \"hidden\": {:.3f}, "
               "\"exposed_other_way_ms\": {:.2f}}}\n",
               c.name, group->world_size(), mf::get_num_threads(), overlap, result.step_s * 1e3,
               tokens / result.step_s, reduction_s * 1e3, exposed * 1e3, hidden, exposed_other_way * 1e3);
    return;
  }
  fmt::print("{} x {} thread(s), {}: {:.1f} ms/step, {:.0f} tokens/s; gradient reduction alone {:.1f} ms, the step "
             "{:.1f} ms longer than without it: {:.0f}% hidden behind backward\n"
             "  phases (rank 0): forward {:.1f} ms, backward {:.1f} ms, gradient sync {:.1f} ms, optimizer {:.1f} ms\n",
             group->world_size(), mf::get_num_threads(), c.name, result.step_s * 1e3, tokens / result.step_s,
             reduction_s * 1e3, exposed * 1e3, 100 * hidden, result.forward_s * 1e3, result.backward_s * 1e3,
             result.sync_s * 1e3, result.optimizer_s * 1e3);
  if (quiet)
    fmt::print("  reducing {} instead, in the same run: {:.1f} ms longer than without communication\n",
               overlap ? "after backward" : "while backward runs", exposed_other_way * 1e3);
}

/// all_reduce (sum, float32) over message sizes from 4 KiB to 64 MiB.
void bench_sweep(dist::ProcessGroup& group, bool json) {
  const double w = group.world_size();
  if (group.rank() == 0 && !json)
    fmt::print("{:>12} {:>10} {:>14} {:>14}\n", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  for (int64_t bytes = 4 << 10; bytes <= int64_t{64} << 20; bytes *= 4) {
    mf::Tensor t = mf::ones({bytes / 4});
    const int repeats = bytes <= (1 << 20) ? 50 : 10;
    std::vector<double> times;
    for (int r = 0; r < repeats + 2; ++r) {
      group.barrier();
      auto start = Clock::now();
      group.all_reduce(t);
      double seconds = slowest(group, seconds_since(start));
      if (r >= 2) times.push_back(seconds);
    }
    const double seconds = median(times);
    const double algbw = static_cast<double>(bytes) / seconds / 1e9;
    const double busbw = algbw * 2 * (w - 1) / w;  // what each link carries in a ring all-reduce
    if (group.rank() != 0) continue;
    if (json)
      fmt::print("{{\"bytes\": {}, \"world_size\": {}, \"us\": {:.1f}, \"algbw\": {:.3f}, \"busbw\": {:.3f}}}\n", bytes,
                 group.world_size(), seconds * 1e6, algbw, busbw);
    else
      fmt::print("{:>12} {:>10.1f} {:>14.3f} {:>14.3f}\n", bytes, seconds * 1e6, algbw, busbw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("bench_distributed", [&] {
    std::string config = "small";
    int threads = mf::get_num_threads();
    int64_t steps = 10;
    double bucket_mb = 4;
    bool distributed = false, sweep = false, json = false, no_overlap = false;
    std::string grad_compression = "none";
    mf::tools::ArgParser args("bench_distributed",
                              "Times data-parallel training steps (run it under mpirun with --distributed), or "
                              "all_reduce bandwidth with --sweep.");
    args.add("config", &config, "seed, small or base");
    args.add("threads", &threads, "intra-op threads per process");
    args.add("steps", &steps, "timed steps, after 2 warm-up steps");
    args.add("bucket-mb", &bucket_mb, "megabytes of gradients per bucket");
    args.add_switch("distributed", &distributed, "join the job mpirun started (else: one process)");
    args.add_switch("no-overlap", &no_overlap, "reduce the gradients after backward, not while it runs");
    args.add("grad-compression", &grad_compression, "what gradients travel as: none (float32) or bf16");
    args.add_switch("sweep", &sweep, "time all_reduce over message sizes instead of training");
    args.add_switch("json", &json, "print JSON lines");
    mf::tools::ProfileFlags profile;
    args.add_switch("profile", &profile.table, "print rank 0's steps op by op (mf::profiler) to stderr");
    args.add("profile-trace", &profile.trace,
             "write each rank's steps as a Chrome trace, PREFIX.rankR.json: ops, backward steps, each bucket's "
             "all_reduce on the MPI thread and the waits for them");
    if (!args.parse(argc, argv)) return 0;
    const mf::tools::BenchConfig* c = mf::tools::find_bench_config(config);
    if (c == nullptr) throw mf::tools::UsageError(fmt::format("unknown config '{}' (seed, small or base)", config));
    if (threads < 1 || steps < 1 || !(bucket_mb > 0))
      throw mf::tools::UsageError("--threads, --steps and --bucket-mb must be positive");
    if (grad_compression != "none" && grad_compression != "bf16")
      throw mf::tools::UsageError(fmt::format("--grad-compression must be none or bf16, not '{}'", grad_compression));
    mf::set_num_threads(threads);
    auto group = distributed ? dist::init_process_group(dist::Backend::Mpi) : dist::local_process_group();
    if (group->rank() == 0 && !json)
      fmt::print("CPU: {}; {}; {} rank(s), backend {}\n", mf::cpu_model_name(), mf::describe_kernel_isa(),
                 group->world_size(), group->backend());
    if (sweep)
      bench_sweep(*group, json);
    else
      bench_training(group, *c, steps, bucket_mb, !no_overlap,
                     grad_compression == "bf16" ? dist::GradientCompression::BFloat16 : dist::GradientCompression::None,
                     json, profile);
    return 0;
  });
}
