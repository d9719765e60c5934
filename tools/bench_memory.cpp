// Does a long training loop hold its memory flat? Trains a small Transformer the way train_transformer
// does (Adam, Noam schedule, label smoothing, dropout, gradient clipping) on random token ids, with a
// fresh source and target length each step (up to --max-len, padded rows included, like length-bucketed
// batches), and prints the resident set size and the CPU allocator's statistics every --every steps.
// Exits 1 when RSS or the allocator's reserved bytes grow by more than --tolerance-mb between step
// --warmup and the last step, so it serves as a regression check.
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace {

/// The resident set size now (not the peak), from /proc/self/statm.
double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

double mb(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

/// A length in [low, high], drawn from `gen`.
int64_t random_length(int64_t low, int64_t high, mf::Generator& gen) {
  return mf::randint(low, high + 1, {1}, mf::Device::cpu(), &gen).item<int64_t>();
}

/// Random ids in [1, vocab) for each row, padded (id 0) after a random length in [1, length]; the
/// first row keeps its full length so the tensor's shape is [batch, length].
mf::Tensor random_tokens(int64_t batch, int64_t length, int64_t vocab, mf::Generator& gen) {
  mf::NoGradGuard no_grad;
  mf::Tensor ids = mf::randint(1, vocab, {batch, length}, mf::Device::cpu(), &gen);
  mf::Tensor lengths = mf::randint(1, length + 1, {batch, 1}, mf::Device::cpu(), &gen);
  lengths.narrow(0, 0, 1).fill_(static_cast<double>(length));
  mf::Tensor positions = mf::arange(length, mf::DType::Int64).view({1, length});
  return mf::where(positions.lt(lengths), ids, mf::zeros_like(ids));
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("bench_memory", [&] {
    int64_t steps = 1000, warmup = 100, every = 100, batch = 32, max_len = 24;
    int64_t d_model = 64, layers = 2, vocab = 500;
    int threads = mf::get_num_threads();
    double tolerance_mb = 3.0;
    mf::tools::ArgParser args("bench_memory",
                              "Trains a small Transformer for --steps steps and checks that memory stays flat.");
    args.add("steps", &steps, "training steps");
    args.add("warmup", &warmup, "steps before the baseline measurement");
    args.add("every", &every, "steps between measurements");
    args.add("batch", &batch, "sentences per batch");
    args.add("max-len", &max_len, "longest source or target of a batch; each step draws new lengths up to it");
    args.add("d-model", &d_model, "model width (4 heads, d_ff = 4 * d_model)");
    args.add("layers", &layers, "encoder and decoder layers");
    args.add("vocab", &vocab, "vocabulary size (shared source and target)");
    args.add("threads", &threads, "intra-op threads");
    args.add("tolerance-mb", &tolerance_mb, "largest growth of RSS or reserved memory allowed after warm-up");
    if (!args.parse(argc, argv)) return 0;
    if (steps < 1 || warmup < 1 || warmup > steps || every < 1)
      throw mf::tools::UsageError("need 1 <= --warmup <= --steps and --every >= 1");
    if (max_len < 2 || batch < 1 || vocab < 2)
      throw mf::tools::UsageError("need --max-len >= 2, --batch >= 1 and --vocab >= 2");
    mf::set_num_threads(threads);

    mf::manual_seed(1);
    mf::models::TransformerConfig config{.src_vocab = vocab, .tgt_vocab = vocab, .d_model = d_model, .heads = 4,
                                         .encoder_layers = layers, .decoder_layers = layers, .d_ff = 4 * d_model,
                                         .dropout = 0.1, .max_len = max_len + 1};
    mf::models::Transformer model(config);
    std::vector<mf::Tensor> params = model.parameters();
    mf::optim::Adam adam(params, {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
    mf::optim::NoamLR schedule(adam, d_model, 400);
    mf::Generator data(2);

    fmt::print("{:>6} {:>9} {:>13} {:>11} {:>11} {:>9}\n", "step", "RSS MB", "allocated MB", "cached MB",
               "peak MB", "loss");
    double rss_base = 0, reserved_base = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      // The first step takes the longest batch, so that the working set peaks during warm-up, as a
      // real loop's does at its longest batch; later growth can then only be the pool's or a leak's.
      const int64_t src_len = step == 1 ? max_len : random_length(1, max_len, data);
      const int64_t tgt_len = step == 1 ? max_len : random_length(2, max_len, data);
      mf::Tensor src = random_tokens(batch, src_len, vocab, data);
      mf::Tensor tgt = random_tokens(batch, tgt_len, vocab, data);
      mf::Tensor tgt_in = tgt.narrow(1, 0, tgt_len - 1), tgt_out = tgt.narrow(1, 1, tgt_len - 1);
      mf::Tensor loss = model.loss(model.forward(src, tgt_in), tgt_out, 0.1);
      loss.backward();
      mf::optim::clip_grad_norm_(params, 1.0);
      adam.step();
      schedule.step();
      adam.zero_grad();

      if (step % every != 0 && step != warmup) continue;
      mf::AllocatorStats stats = mf::memory_stats();
      const double rss = rss_mb();
      fmt::print("{:>6} {:>9.1f} {:>13.1f} {:>11.1f} {:>11.1f} {:>9.3f}\n", step, rss, mb(stats.allocated_bytes),
                 mb(stats.cached_bytes), mb(stats.peak_allocated_bytes), loss.item<double>());
      std::fflush(stdout);
      if (step == warmup) {
        rss_base = rss;
        reserved_base = mb(stats.reserved_bytes());
      }
    }
    const double rss_growth = rss_mb() - rss_base;
    const double reserved_growth = mb(mf::memory_stats().reserved_bytes()) - reserved_base;
    fmt::print("growth from step {} to step {}: RSS {:+.1f} MB, allocator reserved {:+.1f} MB (tolerance {} MB)\n",
               warmup, steps, rss_growth, reserved_growth, tolerance_mb);
    fmt::print("empty_cache released {:.1f} MB\n", mb(mf::empty_cache()));
    if (rss_growth > tolerance_mb || reserved_growth > tolerance_mb) {
      fmt::print(stderr, "bench_memory: memory grew by more than {} MB after warm-up\n", tolerance_mb);
      return 1;
    }
    return 0;
  });
}
