// Float32 GEMM rates, miniflow's matmul against OpenBLAS's cblas_sgemm in the same run: the 2048^3
// product and the products of a training step of the benchmark configs (bench_configs.h): a linear
// layer's forward X W^T, its input gradient dY W and its weight gradient dY^T X, for the attention
// projections, the feed-forward layers and the tied output projection. The two are timed in turn,
// product by product, and each figure is the fastest of --reps: this machine's neighbours come and go.
//
// miniflow's figure is its kernel path (MINIFLOW_ISA narrows it); OpenBLAS picks its own kernel by
// CPU, so on an AVX-512 machine OPENBLAS_CORETYPE=Haswell gives the AVX2 peer of MINIFLOW_ISA=avx2.
// --float32-matmul-precision medium times miniflow's bfloat16 GEMM instead (operands rounded to
// bfloat16, float32 sums) where the CPU runs it on vdpbf16ps (core/isa.h), and prints the peak rates
// of vdpbf16ps and of the float32 FMA on one core, measured in the same run (16 independent chains in
// registers each), so that the GEMM's rate reads as a share of the first and the choice of path
// against the second. --int8 times miniflow's int8 linear on the decoding products
// instead (mf::linear_int8 as decoding runs it: each call quantizes its rows, then the int8 GEMM on
// the weight packed once) beside its float32 linear; tools/bench_onednn.sh --int8 sets oneDNN's int8
// matmul beside it in the same run.
#include "miniflow.h"
#include "tools/bench_configs.h"
#include "tools/cli.h"

#include <cblas.h>
#include <fmt/format.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <tuple>


namespace {

using Clock = std::chrono::steady_clock;

/// One product c = op(a) op(b): op(a) rows x depth, op(b) depth x cols.
struct Product {
  std::string name;
  int64_t rows, cols, depth;
  bool trans_a, trans_b;
};

/// The products of one config's training step, those of a decoding step of `small` (the linear
/// layers' X W^T over one row per sentence, 32 sentences, greedy and beam 4), and the square one
/// every BLAS is measured on.
std::vector<Product> products(const std::string& only) {
  std::vector<Product> list;
  if (only.empty() || only == "square") list.push_back({"2048^3", 2048, 2048, 2048, false, false});
  if (only.empty() || only == "decoding") {
    const mf::tools::BenchConfig& c = *mf::tools::find_bench_config("small");
    for (int64_t rows : {32, 128})
      for (auto [layer, in, out] : {std::tuple{"attention projection", c.d_model, c.d_model},
                                    std::tuple{"feed-forward in", c.d_model, c.d_ff},
                                    std::tuple{"output projection", c.d_model, c.vocab}})
        list.push_back({fmt::format("decoding {} [{}x{}] X W^T", layer, out, in), rows, out, in, false, true});
  }
  for (const mf::tools::BenchConfig& c : mf::tools::kBenchConfigs) {
    if (std::string(c.name) == "seed" || (!only.empty() && only != c.name)) continue;
    int64_t tokens = c.batch * c.length;
    auto linear = [&](const std::string& layer, int64_t in, int64_t out) {
      std::string prefix = fmt::format("{} {} [{}x{}]", c.name, layer, out, in);
      list.push_back({prefix + " X W^T", tokens, out, in, false, true});
      list.push_back({prefix + " dY W", tokens, in, out, false, false});
      list.push_back({prefix + " dY^T X", out, in, tokens, true, false});
    };
    linear("attention projection", c.d_model, c.d_model);
    linear("feed-forward in", c.d_model, c.d_ff);
    linear("feed-forward out", c.d_ff, c.d_model);
    linear("output projection", c.d_model, c.vocab);
  }
  return list;
}

/// GFLOP/s on one core of vdpbf16ps (`dot_products`: 16 lanes x 2 products x 2 flops an instruction)
/// or of the float32 FMA (16 lanes x 2 flops): 16 independent accumulators, more than either's latency
/// times its throughput. The fastest of 5 runs.
template <bool dot_products>
[[gnu::target("avx512f,avx512bf16")]] double peak_gflops() {
  constexpr int kChains = 16;
  constexpr int64_t kIterations = 20'000'000;
  constexpr double kFlopsPerInstruction = dot_products ? 64 : 32;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    __m512 acc[kChains];  // distinct starts, or the compiler merges identical chains into one
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x3C003C00);
    const __m512 one = _mm512_set1_ps(1), tiny = _mm512_set1_ps(1e-9f);
    auto start = Clock::now();
    for (int64_t i = 0; i < kIterations; ++i)
#pragma GCC unroll 16
      for (__m512& a : acc) a = dot_products ? _mm512_dpbf16_ps(a, x, y) : _mm512_fmadd_ps(a, one, tiny);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    alignas(64) float lanes[16];
    __m512 total = _mm512_setzero_ps();
    for (__m512& a : acc) total = _mm512_add_ps(total, a);
    _mm512_store_ps(lanes, total);
    if (lanes[0] == 42) fmt::print(" ");  // keeps the chains alive
    best = std::max(best, kFlopsPerInstruction * kChains * static_cast<double>(kIterations) / seconds / 1e9);
  }
  return best;
}

class Timer {
 public:
  explicit Timer(const Product& p)
      : p_(p),
        a_(p.trans_a ? mf::randn({p.depth, p.rows}) : mf::randn({p.rows, p.depth})),
        b_(p.trans_b ? mf::randn({p.cols, p.depth}) : mf::randn({p.depth, p.cols})),
        c_(mf::Tensor::empty({p.rows, p.cols})) {}

  double miniflow_seconds() {
    mf::NoGradGuard no_grad;
    auto start = Clock::now();
    mf::Tensor c = mf::matmul(p_.trans_a ? a_.t() : a_, p_.trans_b ? b_.t() : b_);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // cblas_sgemm with the rows of c split over the pool, as miniflow gives OpenBLAS its products.
  double openblas_seconds() {
    auto start = Clock::now();
    const float *pa = a_.data_ptr<float>(), *pb = b_.data_ptr<float>();
    float* pc = c_.data_ptr<float>();
    int64_t lda = a_.size(1), ldb = b_.size(1);
    int64_t per_thread = (p_.rows + mf::get_num_threads() - 1) / mf::get_num_threads();
    mf::parallel_for(0, p_.rows, per_thread, [&](int64_t lo, int64_t hi) {
      cblas_sgemm(CblasRowMajor, p_.trans_a ? CblasTrans : CblasNoTrans, p_.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(hi - lo), static_cast<int>(p_.cols), static_cast<int>(p_.depth), 1.0f,
                  p_.trans_a ? pa + lo : pa + lo * lda, static_cast<int>(lda), pb, static_cast<int>(ldb), 0.0f,
                  pc + lo * p_.cols, static_cast<int>(p_.cols));
    });
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // linear_int8 of the rows op(a) by the weight op(b)^T [cols, depth] quantized once (X W^T only).
  double int8_seconds() {
    mf::NoGradGuard no_grad;  // as decoding runs: the packed weight is reused while it is unchanged
    if (!quantized_.values.defined()) quantized_ = mf::quantize_per_channel(b_);
    auto start = Clock::now();
    mf::Tensor c = mf::linear_int8(a_, quantized_);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // linear(op(a), op(b)^T) in float32, the weight packed once as decoding has it (X W^T only).
  double float32_linear_seconds() {
    mf::NoGradGuard no_grad;
    auto start = Clock::now();
    mf::Tensor c = mf::linear(a_, b_);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  double gflops(double seconds) const {
    return 2.0 * static_cast<double>(p_.rows) * static_cast<double>(p_.cols) * static_cast<double>(p_.depth) /
           seconds / 1e9;
  }

 private:
  Product p_;
  mf::Tensor a_, b_, c_;
  mf::QuantizedWeight quantized_;
};

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("bench_gemm", [&] {
    std::string only, precision = "highest";
    bool int8 = false;
    int threads = 1;
    int64_t reps = 7;
    mf::tools::ArgParser args("bench_gemm",
                              "Times float32 GEMMs, miniflow's matmul against OpenBLAS's cblas_sgemm in turn.");
    args.add("shapes", &only, "only these products: square, small, base or decoding");
    args.add("threads", &threads, "intra-op threads (OpenBLAS runs single-threaded inside them)");
    args.add("reps", &reps, "timed runs of each product on each side; the fastest counts");
    args.add("float32-matmul-precision", &precision,
             "miniflow's products: highest or high (float32), or medium (bfloat16 operands where AVX512-BF16 "
             "runs)");
    args.add_switch("int8", &int8,
                    "the decoding products in int8 (linear_int8: rows quantized at each call, int32 sums) against "
                    "miniflow's float32 linear, instead of miniflow against OpenBLAS");
    if (!args.parse(argc, argv)) return 0;
    if (!only.empty() && only != "square" && only != "small" && only != "base" && only != "decoding")
      throw mf::tools::UsageError(fmt::format("unknown --shapes '{}' (square, small, base or decoding)", only));
    if (reps < 1) throw mf::tools::UsageError("--reps must be at least 1");
    if (int8 && !only.empty() && only != "decoding")
      throw mf::tools::UsageError("--int8 times the decoding products only (--shapes decoding)");
    if (int8) only = "decoding";
    mf::tools::set_matmul_precision_flag(precision);
    mf::set_num_threads(threads);
    openblas_set_num_threads(1);

    fmt::print("CPU {}: {}; {} with its {} kernels; threads {}\n", mf::cpu_model_name(), mf::describe_kernel_isa(),
               openblas_get_config(), openblas_get_corename(), threads);
    if (precision == "medium") {
      if (mf::cpu_has_avx512_bf16()) {
        const double dot_products = peak_gflops<true>(), fma = peak_gflops<false>();
        fmt::print("peak on one core: vdpbf16ps {:.1f} GFLOP/s, float32 FMA {:.1f} ({:.2f}x)\n", dot_products, fma,
                   dot_products / fma);
      }
      const std::string_view why = mf::why_no_bfloat16_dot_products();
      if (why.empty()) fmt::print("miniflow in bfloat16 (float32 sums) on vdpbf16ps\n");
      else fmt::print("{}: medium precision stays float32\n", why);
    }
    if (int8) fmt::print("int8 kernel: {}\n", mf::linear_int8_kernel());
    const char* peer = int8 ? "float32" : "OpenBLAS";
    fmt::print("{:<64} {:>10} {:>10} {:>7}\n", "product (rows x cols x depth)", int8 ? "int8" : "miniflow", peer,
               "ratio");
    double log_ratio_sum = 0;
    int count = 0;
    for (const Product& p : products(only)) {
      Timer timer(p);
      // The side timed, against its peer (miniflow's float32 linear for int8, else OpenBLAS).
      auto ours = [&] { return int8 ? timer.int8_seconds() : timer.miniflow_seconds(); };
      auto theirs = [&] { return int8 ? timer.float32_linear_seconds() : timer.openblas_seconds(); };
      ours();  // warm-up: outputs' first touch, packing buffers
      theirs();
      double our_best = std::numeric_limits<double>::infinity(), their_best = our_best;
      for (int64_t r = 0; r < reps; ++r) {
        our_best = std::min(our_best, ours());
        their_best = std::min(their_best, theirs());
      }
      double ratio = their_best / our_best;
      log_ratio_sum += std::log(ratio);
      ++count;
      fmt::print("{:<64} {:>10.1f} {:>10.1f} {:>6.2f}x\n",
                 fmt::format("{} ({}x{}x{})", p.name, p.rows, p.cols, p.depth), timer.gflops(our_best),
                 timer.gflops(their_best), ratio);
    }
    fmt::print("{}; ratio = {} rate / {}'s; geometric mean {:.2f}x\n",
               int8 ? "GOP/s (multiply-adds count two)" : "GFLOP/s", int8 ? "int8's" : "miniflow's", peer,
               std::exp(log_ratio_sum / count));
    return 0;
  });
}
