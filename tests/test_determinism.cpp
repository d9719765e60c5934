// Determinism on the CPU. The same seed and thread count give bitwise-identical training (losses and
// parameters, dropout on) run after run. Across thread counts every op gives the same bits, because
// kernels split work by output elements or by chunks the data alone fixes, with two exceptions. A
// matmul large enough to be split over threads that runs on OpenBLAS (float64 always, float32 on CPUs
// without AVX2) makes one call per block, and OpenBLAS's kernel for a block (small-matrix kernels,
// GEMV for one row, edge tiles) may round the sums differently; miniflow's own float32 GEMM
// (ops/cpu/sgemm_kernel.inc) computes each element of C alike whatever block holds it. And on 2 threads a
// linear layer's dX adds itself into the gradient summed so far (beta = 1), which rounds differently
// from adding it afterwards once k spans more than one of the GEMM's blocks.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/cpu/simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace mf;
using mf::testing::ThreadCountGuard;

namespace {

constexpr int kSteps = 6;

/// Per-step losses and the final parameters (all, flattened) of one training run.
struct Trace {
  std::vector<float> losses;
  std::vector<float> params;
};

/// [B, L] token ids in [1, vocab) with row r padded (id 0) over its last r % 4 positions, so that
/// the padding masks take part.
Tensor padded_tokens(int64_t rows, int64_t length, int64_t vocab, Generator& generator) {
  std::vector<int64_t> ids = randint(1, vocab, {rows, length}, Device::cpu(), &generator).to_vector<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = length - r % 4; t < length; ++t) ids[static_cast<size_t>(r * length + t)] = 0;
  return from_vector(ids, {rows, length});
}

/// Trains a small Transformer (dropout 0.1, label smoothing, clipping, Adam) for kSteps steps on
/// `threads` threads from fixed seeds. The sizes put the larger GEMMs (e.g. the output projection,
/// 8*11 rows x 64 x 96 = 540,672 multiply-adds) above matmul's threshold for splitting over threads.
Trace train_trace(int threads) {
  set_num_threads(threads);
  manual_seed(2024);
  models::TransformerConfig config{.src_vocab = 96, .tgt_vocab = 96, .d_model = 64, .heads = 4,
                                   .encoder_layers = 2, .decoder_layers = 2, .d_ff = 128, .dropout = 0.1,
                                   .max_len = 16};
  models::Transformer model(config);
  model.train();
  std::vector<Tensor> params = model.parameters();
  optim::Adam adam(params, {.lr = 1e-3});
  Generator data(7);
  Trace trace;
  for (int step = 0; step < kSteps; ++step) {
    Tensor src = padded_tokens(8, 10, config.src_vocab, data);
    Tensor tgt = padded_tokens(8, 12, config.tgt_vocab, data);
    Tensor tgt_in = tgt.narrow(1, 0, 11), tgt_out = tgt.narrow(1, 1, 11);
    Tensor loss = model.loss(model.forward(src, tgt_in), tgt_out, 0.1);
    loss.backward();
    optim::clip_grad_norm_(params, 1.0);
    adam.step();
    adam.zero_grad();
    trace.losses.push_back(loss.item<float>());
  }
  for (const Tensor& p : params) {
    std::vector<float> values = p.to_vector<float>();
    trace.params.insert(trace.params.end(), values.begin(), values.end());
  }
  return trace;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Every value of `tensors` in order, widened to double (exact for float32).
std::vector<double> flat(const std::vector<Tensor>& tensors) {
  std::vector<double> values;
  for (const Tensor& t : tensors) {
    std::vector<double> v = t.to_vector<double>();
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

/// fn's output and the gradients of sum(output * w) (w fixed) for float32 inputs of `shapes` drawn
/// from a fixed seed, at `threads` threads, flattened.
std::vector<double> forward_backward(int threads, const std::vector<Shape>& shapes,
                                     const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  set_num_threads(threads);
  manual_seed(3);  // dropout's stream
  Generator generator(17);
  std::vector<Tensor> inputs;
  for (const Shape& shape : shapes)
    inputs.push_back(randn(shape, DType::Float32, Device::cpu(), &generator).set_requires_grad());
  Tensor out = fn(inputs);
  (out * randn(out.shape(), DType::Float32, Device::cpu(), &generator)).sum().backward();
  std::vector<Tensor> results{out.detach()};
  for (const Tensor& input : inputs) results.push_back(input.grad());
  return flat(results);
}

}  // namespace

TEST_CASE("every op but matmul gives the same bits on 1, 2 and 3 threads, forward and backward") {
  // Each case is large enough (>= 32768 elements, the pool's grain) to be split across threads.
  ThreadCountGuard restore;
  Generator index_generator(5);
  Tensor classes = randint(0, 50, {2048}, Device::cpu(), &index_generator);          // cross_entropy targets
  Tensor tokens = randint(0, 100, {64, 64}, Device::cpu(), &index_generator);        // embedding ids
  struct Case {
    const char* name;
    std::vector<Shape> shapes;
    std::function<Tensor(const std::vector<Tensor>&)> fn;
  };
  const std::vector<Case> cases = {
      {"broadcast elementwise", {{300, 257}, {257}}, [](auto& in) { return (in[0] * in[1] + in[0].exp()).tanh(); }},
      {"sum over rows", {{300, 257}}, [](auto& in) { return in[0].sum({0}); }},
      {"mean over columns", {{300, 257}}, [](auto& in) { return in[0].mean({1}); }},
      {"full sum (chunked)", {{300, 600}}, [](auto& in) { return in[0].sum(); }},
      {"var", {{257, 300}}, [](auto& in) { return in[0].var({1}); }},
      {"amax", {{300, 257}}, [](auto& in) { return amax(in[0], {1}); }},
      {"softmax", {{512, 129}}, [](auto& in) { return in[0].softmax(-1); }},
      {"log_softmax", {{512, 129}}, [](auto& in) { return in[0].log_softmax(-1); }},
      {"layer_norm", {{1024, 64}, {64}, {64}}, [](auto& in) { return layer_norm(in[0], {64}, in[1], in[2]); }},
      {"cross_entropy", {{2048, 50}},
       [&](auto& in) { return cross_entropy(in[0], classes, 7, 0.1); }},  // class 7 ignored
      {"embedding", {{100, 64}}, [&](auto& in) { return embedding(in[0], tokens); }},
      {"dropout", {{300, 257}}, [](auto& in) { return dropout(in[0], 0.3, true); }},
      // Below matmul's threshold for splitting (2^18 multiply-adds): one BLAS call whatever the pool.
      {"small matmul", {{64, 32}, {32, 64}}, [](auto& in) { return matmul(in[0], in[1]); }},
      // A batch of at least as many products as threads: one whole product per thread.
      {"batched matmul", {{8, 40, 200}, {8, 200, 30}}, [](auto& in) { return matmul(in[0], in[1]); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<double> one = forward_backward(1, c.shapes, c.fn);
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      std::vector<double> many = forward_backward(threads, c.shapes, c.fn);
      REQUIRE(one.size() == many.size());
      CHECK(std::memcmp(one.data(), many.data(), one.size() * sizeof(double)) == 0);
    }
  }
}

TEST_CASE("a matmul split over threads gives one thread's bits on miniflow's GEMM, rounding-close on OpenBLAS's") {
  // [33, 513] @ [513, 65]: 1.1M multiply-adds, split by columns over 2 and 3 threads. Each element is
  // a 513-term float32 dot product of standard normals (|value| ~ sqrt(513) ~ 23): summed in another
  // order it moves by rounding error, ~sqrt(513) * 2^-24 * 23 ~ 3e-5 typically, below the 1e-4 allowed
  // (relative to 1 + |value|). On OpenBLAS (0.3.21 on an AVX-512 machine, before miniflow had its
  // own GEMM) about 1,970 of the 52,419 values differed, by <= 1.5e-5; miniflow's GEMM, which takes
  // float32 products on AVX-512 and AVX2 CPUs, sums every element in the same order whatever the split.
  ThreadCountGuard restore;
  bool own_gemm = kernel_isa() >= Isa::avx2;  // the condition under which cpu::sgemm runs
  auto product = [](auto& in) { return matmul(in[0], in[1]); };
  std::vector<double> one = forward_backward(1, {{33, 513}, {513, 65}}, product);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    std::vector<double> many = forward_backward(threads, {{33, 513}, {513, 65}}, product);
    REQUIRE(one.size() == many.size());
    size_t differ = 0;
    double worst = 0;  // largest |difference| relative to 1 + |value|
    for (size_t i = 0; i < one.size(); ++i) {
      differ += one[i] != many[i] ? 1 : 0;
      worst = std::max(worst, std::abs(one[i] - many[i]) / (1 + std::abs(one[i])));
    }
    CHECK(worst <= 1e-4);
    if (own_gemm) CHECK(differ == 0);
    MESSAGE(differ << " of " << one.size() << " values (product and gradients) differ in their bits, by at most "
                   << worst << " relative" << (own_gemm ? " (miniflow's GEMM)" : " (OpenBLAS)"));
  }
}

TEST_CASE("the same seed and thread count give bitwise-identical losses and parameters") {
  ThreadCountGuard restore;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    Trace first = train_trace(threads), second = train_trace(threads);
    REQUIRE(first.losses.size() == static_cast<size_t>(kSteps));
    CHECK(same_bits(first.losses, second.losses));
    CHECK(same_bits(first.params, second.params));
    // The run really trains (a test that cannot fail is no test): the loss moves between steps.
    CHECK(first.losses.front() != first.losses.back());
  }
}

TEST_CASE("1 and 2 threads train alike; bit for bit only where no matmul split rounds differently") {
  // The larger GEMMs here are split on 2 threads, and on 2 threads a linear layer's dX adds itself
  // into the gradient summed so far (beta = 1), which rounds differently from adding afterwards once
  // k spans several of the GEMM's blocks; OpenBLAS's kernels for split blocks may round differently
  // too. So only closeness is required (here no k exceeds one block, and the bits come out the same).
  ThreadCountGuard restore;
  Trace one = train_trace(1), two = train_trace(2);
  for (int step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    CHECK(two.losses[step] == doctest::Approx(one.losses[step]).epsilon(1e-5));
  }
  REQUIRE(one.params.size() == two.params.size());
  float worst = 0;
  for (size_t i = 0; i < one.params.size(); ++i) worst = std::max(worst, std::abs(one.params[i] - two.params[i]));
  CHECK(worst <= 1e-4f);
  auto bits = [](bool same) { return std::string(same ? "bitwise identical" : "different in their bits"); };
  MESSAGE("1 vs 2 threads: losses " << bits(same_bits(one.losses, two.losses)) << ", parameters "
                                    << bits(same_bits(one.params, two.params)));
}
