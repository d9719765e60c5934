// oneDNN's bfloat16 matmul on the products tools/bench_gemm times (2048^3 and small's training
// products), for issue 19's question whether Debian's oneDNN does bfloat16 GEMMs better than
// miniflow's kernel. Standalone: it links oneDNN, not miniflow; tools/bench_onednn.sh builds it and
// runs bench_gemm beside it. Two figures per product:
//   - "bf16 operands": A and B already bfloat16, C float32 (oneDNN's best case);
//   - "from float32": the float32 operands converted by oneDNN reorders inside the timing, as
//     miniflow's kernel takes float32 operands and rounds them while packing.
// The fastest of --reps runs counts. One thread unless OMP_NUM_THREADS says otherwise.
//
// With "int8" after the repetitions it times oneDNN's int8 matmul on bench_gemm --int8's decoding
// products instead (X W^T, 32 and 128 rows of small's layers): int8 rows times the int8 weight [out,
// in] (in the layout oneDNN picks, reordered once), int32 sums scaled per output channel into float32,
// as miniflow's int8 GEMM. Two figures again: "int8 operands" (the rows already quantized) and "from
// float32" (the rows quantized by a oneDNN reorder inside the timing, as mf::linear_int8 quantizes its
// rows at each call; the reorder takes one scale for all rows, miniflow's one per row).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using Clock = std::chrono::steady_clock;

struct Product {
  std::string name;
  int64_t rows, cols, depth;  // C [rows, cols] = op(A) [rows, depth] op(B) [depth, cols]
  bool trans_a, trans_b;
};

std::vector<Product> products() {
  std::vector<Product> list{{"2048^3", 2048, 2048, 2048, false, false}};
  // small: d_model 256, d_ff 1024, vocab 8000, 32 sentences of 32 tokens (tools/bench_configs.h).
  const int64_t tokens = 32 * 32;
  struct Layer { const char* name; int64_t in, out; };
  for (Layer layer : {Layer{"attention projection", 256, 256}, Layer{"feed-forward in", 256, 1024},
                      Layer{"feed-forward out", 1024, 256}, Layer{"output projection", 256, 8000}}) {
    std::string prefix = "small " + std::string(layer.name) + " [" + std::to_string(layer.out) + "x" +
                         std::to_string(layer.in) + "]";
    list.push_back({prefix + " X W^T", tokens, layer.out, layer.in, false, true});
    list.push_back({prefix + " dY W", tokens, layer.in, layer.out, false, false});
    list.push_back({prefix + " dY^T X", layer.out, layer.in, tokens, true, false});
  }
  return list;
}

/// bench_gemm --int8's products: X W^T for one decoding step of 32 or 128 rows through small's layers.
std::vector<Product> decoding_products() {
  std::vector<Product> list;
  struct Layer { const char* name; int64_t in, out; };
  for (int64_t rows : {32, 128})
    for (Layer layer : {Layer{"attention projection", 256, 256}, Layer{"feed-forward in", 256, 1024},
                        Layer{"output projection", 256, 8000}})
      list.push_back({"decoding " + std::string(layer.name) + " [" + std::to_string(layer.out) + "x" +
                          std::to_string(layer.in) + "] X W^T (" + std::to_string(rows) + " rows)",
                      rows, layer.out, layer.in, false, true});
  return list;
}

/// A [rows, cols] operand as stored: row-major, or the transposed view of a row-major [cols, rows].
dnnl::memory::desc operand(int64_t rows, int64_t cols, bool transposed, dt type) {
  return dnnl::memory::desc({rows, cols}, type, transposed ? tag::ba : tag::ab);
}

void fill(dnnl::memory& m, int64_t count) {
  auto* p = static_cast<float*>(m.get_data_handle());
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>((i * 7919 % 2001) - 1000) / 1000.0f;
}

/// Int8 values in [-limit, limit] (miniflow's ranges: 127 for rows, 63 for weights).
void fill_int8(dnnl::memory& m, int64_t count, int limit) {
  auto* p = static_cast<int8_t*>(m.get_data_handle());
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<int8_t>(i * 7919 % (2 * limit + 1) - limit);
}

/// Seconds of the fastest of `reps` runs of body().
template <typename Body>
double fastest(int reps, Body&& body) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

/// oneDNN's int8 matmul on the decoding products (the header comment's "int8" mode).
void time_int8(int reps, const dnnl::engine& engine, dnnl::stream& stream) {
  std::printf("oneDNN %d.%d.%d, int8 matmul (s8 x s8, int32 sums, float32 C scaled per column); GOP/s, the "
              "fastest of %d runs\n", dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, reps);
  for (const Product& p : decoding_products()) {
    auto a32 = operand(p.rows, p.depth, false, dt::f32), a8 = operand(p.rows, p.depth, false, dt::s8);
    auto b8 = operand(p.depth, p.cols, p.trans_b, dt::s8);
    auto c32 = dnnl::memory::desc({p.rows, p.cols}, dt::f32, tag::ab);
    dnnl::primitive_attr scaled;
    scaled.set_output_scales(1 << 1, std::vector<float>(static_cast<size_t>(p.cols), 1e-4f));
    // The weight in the layout oneDNN picks, reordered once outside the timing, as miniflow packs once.
    auto any_layout = dnnl::memory::desc({p.depth, p.cols}, dt::s8, tag::any);
    dnnl::matmul::primitive_desc product(dnnl::matmul::desc(a8, any_layout, c32), scaled, engine);
    dnnl::matmul matmul(product);
    dnnl::primitive_attr quantizing;
    quantizing.set_output_scales(0, {127.0f});
    dnnl::reorder quantize(dnnl::reorder::primitive_desc(engine, a32, engine, a8, quantizing));
    dnnl::memory a_f32(a32, engine), a_s8(a8, engine), b_s8(b8, engine), b_packed(product.weights_desc(), engine),
        c(c32, engine);
    fill(a_f32, p.rows * p.depth);
    fill_int8(a_s8, p.rows * p.depth, 127);
    fill_int8(b_s8, p.depth * p.cols, 63);
    dnnl::reorder(b_s8, b_packed).execute(stream, b_s8, b_packed);
    auto multiply = [&] {
      matmul.execute(stream, {{DNNL_ARG_SRC, a_s8}, {DNNL_ARG_WEIGHTS, b_packed}, {DNNL_ARG_DST, c}});
    };
    multiply();  // warm-up: the first run JIT-compiles
    stream.wait();
    const double ops = 2.0 * static_cast<double>(p.rows) * static_cast<double>(p.cols) * static_cast<double>(p.depth);
    const double operands_only = fastest(reps, [&] { multiply(); stream.wait(); });
    const double with_quantizing = fastest(reps, [&] {
      quantize.execute(stream, a_f32, a_s8);
      multiply();
      stream.wait();
    });
    std::printf("%-64s int8 operands %7.1f   from float32 %7.1f\n", p.name.c_str(), ops / operands_only / 1e9,
                ops / with_quantizing / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  if (argc > 2 && std::string(argv[2]) == "int8") {
    time_int8(reps, engine, stream);
    return 0;
  }
  std::printf("oneDNN %d.%d.%d, bfloat16 matmul, float32 C; GFLOP/s, the fastest of %d runs\n",
              dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, reps);
  for (const Product& p : products()) {
    auto a32 = operand(p.rows, p.depth, p.trans_a, dt::f32), b32 = operand(p.depth, p.cols, p.trans_b, dt::f32);
    auto a16 = operand(p.rows, p.depth, p.trans_a, dt::bf16), b16 = operand(p.depth, p.cols, p.trans_b, dt::bf16);
    auto c32 = dnnl::memory::desc({p.rows, p.cols}, dt::f32, tag::ab);
    dnnl::matmul matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a16, b16, c32), engine));
    dnnl::memory a_f32(a32, engine), b_f32(b32, engine), a_bf16(a16, engine), b_bf16(b16, engine), c(c32, engine);
    fill(a_f32, p.rows * p.depth);
    fill(b_f32, p.depth * p.cols);
    dnnl::reorder to_a(a_f32, a_bf16), to_b(b_f32, b_bf16);
    auto convert = [&] {
      to_a.execute(stream, a_f32, a_bf16);
      to_b.execute(stream, b_f32, b_bf16);
    };
    auto multiply = [&] {
      matmul.execute(stream, {{DNNL_ARG_SRC, a_bf16}, {DNNL_ARG_WEIGHTS, b_bf16}, {DNNL_ARG_DST, c}});
    };
    convert();
    multiply();  // warm-up: the first run JIT-compiles
    stream.wait();
    const double flops = 2.0 * static_cast<double>(p.rows) * static_cast<double>(p.cols) * static_cast<double>(p.depth);
    const double operands_only = fastest(reps, [&] { multiply(); stream.wait(); });
    const double with_conversion = fastest(reps, [&] { convert(); multiply(); stream.wait(); });
    std::printf("%-52s bf16 operands %7.1f   from float32 %7.1f\n", p.name.c_str(), flops / operands_only / 1e9,
                flops / with_conversion / 1e9);
  }
  return 0;
}
