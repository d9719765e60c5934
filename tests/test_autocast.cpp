// Autocast (AutocastGuard, ops/functional.h): the ops it lowers take their products from operands
// rounded to bfloat16, in forward and backward, and every other op computes as outside it. The
// references are float64 sums of the rounded operands, formed here with naive loops: each product
// of two bfloat16 values is exact, so only the float32 accumulation of the k products may differ.
#include "helpers.h"
#include "miniflow.h"
#include "ops/kernel_api.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace {

using mf::DType;
using mf::Tensor;

double rounded(float x) { return static_cast<double>(static_cast<float>(mf::bfloat16(x))); }

/// a [n, k] times b [k, m] (or b^T when b is [m, k] and `b_transposed`), each operand rounded to
/// bfloat16 first, summed in float64.
std::vector<double> rounded_product(const Tensor& a, const Tensor& b, bool b_transposed) {
  const std::vector<float> av = a.contiguous().to_vector<float>(), bv = b.contiguous().to_vector<float>();
  const int64_t n = a.size(0), k = a.size(1), m = b_transposed ? b.size(0) : b.size(1);
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += rounded(av[static_cast<size_t>(i * k + p)]) *
               rounded(bv[static_cast<size_t>(b_transposed ? j * k + p : p * m + j)]);
      c[static_cast<size_t>(i * m + j)] = sum;
    }
  return c;
}

/// The largest |got - want| over the elements.
double largest_gap(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double gap = 0;
  for (size_t i = 0; i < got.size(); ++i) gap = std::max(gap, std::fabs(double(got[i]) - want[i]));
  return gap;
}

std::vector<double> as_doubles(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

// 64 products of magnitude ~1 summed in float32: the order of the additions moves a sum by a few
// ulps of ~8, under 1e-4; rounding the operands to bfloat16 (2^-9 relative each) moves it by ~1e-2.
constexpr double kFloat32Sums = 1e-4;
constexpr double kBfloat16Rounding = 1e-3;

}  // namespace

TEST_CASE("AutocastGuard turns autocast on for its scope, on its thread and device type, and refuses other dtypes") {
  CHECK_FALSE(mf::is_autocast_enabled());
  {
    mf::AutocastGuard autocast;
    CHECK(mf::is_autocast_enabled());
    CHECK_FALSE(mf::is_autocast_enabled(mf::DeviceType::CUDA));  // one state per device type
    {
      mf::AutocastGuard cuda(mf::DeviceType::CUDA);
      CHECK(mf::is_autocast_enabled(mf::DeviceType::CUDA));
    }
    CHECK_FALSE(mf::is_autocast_enabled(mf::DeviceType::CUDA));
    {
      mf::AutocastGuard off(mf::DeviceType::CPU, DType::BFloat16, false);
      CHECK_FALSE(mf::is_autocast_enabled());
    }
    CHECK(mf::is_autocast_enabled());
    bool elsewhere = true;
    std::thread([&] { elsewhere = mf::is_autocast_enabled(); }).join();
    CHECK_FALSE(elsewhere);
  }
  CHECK_FALSE(mf::is_autocast_enabled());
  CHECK_THROWS_WITH_AS((mf::AutocastGuard{mf::DeviceType::CPU, DType::Float32}), "AutocastGuard: autocast lowers to "
                       "bfloat16, got float32", mf::Error);
}

TEST_CASE("under autocast, linear and matmul sum the products of operands rounded to bfloat16") {
  mf::manual_seed(11);
  Tensor x = mf::randn({40, 64}), w = mf::randn({48, 64}), bias = mf::randn({48});
  std::vector<double> want = rounded_product(x, w, true);
  const std::vector<float> bias_values = bias.to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) want[i] += bias_values[i % 48];
  const std::vector<float> exact = mf::linear(x, w, bias).to_vector<float>();
  mf::AutocastGuard autocast;
  const std::vector<float> got = mf::linear(x, w, bias).to_vector<float>();
  CHECK(largest_gap(got, want) < kFloat32Sums);
  CHECK(largest_gap(exact, want) > kBfloat16Rounding);  // the rounding is what the reference holds

  std::vector<double> relu_want = want;
  for (double& v : relu_want) v = std::max(v, 0.0);
  CHECK(largest_gap(mf::relu(mf::linear(x, w, bias)).to_vector<float>(), relu_want) < kFloat32Sums);
}

TEST_CASE("autocast reaches the pool's threads: a batch of products split over two threads rounds every one") {
  const int threads = mf::get_num_threads();
  mf::set_num_threads(2);
  mf::manual_seed(12);
  Tensor a = mf::randn({6, 36, 64}), b = mf::randn({6, 64, 40});  // 6 products, each on one of the threads
  Tensor c;
  {
    mf::AutocastGuard autocast;
    c = mf::matmul(a, b);
  }
  mf::set_num_threads(threads);
  for (int64_t i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(largest_gap(c.select(0, i).to_vector<float>(), rounded_product(a.select(0, i), b.select(0, i), false)) <
          kFloat32Sums);
  }
}

TEST_CASE("a linear layer recorded under autocast takes its gradients' products in bfloat16, wherever backward runs") {
  mf::manual_seed(13);
  Tensor x = mf::randn({40, 64}).set_requires_grad(true), w = mf::randn({48, 64}).set_requires_grad(true),
         bias = mf::randn({48}).set_requires_grad(true), upstream = mf::randn({40, 48});
  Tensor y;
  {
    mf::AutocastGuard autocast;
    y = mf::linear(x, w, bias);
  }
  (y * upstream).sum().backward();  // outside the guard: dy = upstream
  // dx = dy W and dW = dy^T x, from rounded operands.
  CHECK(largest_gap(x.grad().to_vector<float>(), rounded_product(upstream, w, false)) < kFloat32Sums);
  CHECK(largest_gap(w.grad().to_vector<float>(), rounded_product(upstream.t(), x, false)) < kFloat32Sums);
  CHECK(largest_gap(bias.grad().to_vector<float>(), as_doubles(upstream.sum({0}))) < 1e-5);  // a sum, not a product

  // Recorded outside autocast, backward inside it keeps float32: the forward's precision decides.
  Tensor x2 = x.detach().set_requires_grad(true), w2 = w.detach().set_requires_grad(true);
  Tensor y2 = mf::matmul(x2, w2.t());
  {
    mf::AutocastGuard autocast;
    (y2 * upstream).sum().backward();
  }
  Tensor x3 = x.detach().set_requires_grad(true), w3 = w.detach().set_requires_grad(true);
  (mf::matmul(x3, w3.t()) * upstream).sum().backward();
  CHECK(x2.grad().to_vector<float>() == x3.grad().to_vector<float>());
  CHECK(w2.grad().to_vector<float>() == w3.grad().to_vector<float>());
}

TEST_CASE("attention under autocast rounds its products' operands, forward and backward") {
  mf::manual_seed(14);
  auto make = [] { return mf::randn({2, 4, 24, 16}).set_requires_grad(true); };
  Tensor q = make(), k = make(), v = make();
  Tensor exact = mf::scaled_dot_product_attention(q, k, v);
  exact.sum().backward();
  const Tensor exact_dq = q.grad().clone();
  for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  mf::AttentionResult lowered;
  {
    mf::AutocastGuard autocast;
    lowered = mf::scaled_dot_product_attention_with_weights(q, k, v);
  }
  lowered.output.sum().backward();  // outside the guard: the node keeps the forward's precision
  // Scores of ~4 (16 products of unit normals) lose ~2^-9 relative per operand; the weights stay
  // within [0, 1] and the outputs within the values' range.
  const double forward_gap = largest_gap(lowered.output.to_vector<float>(), as_doubles(exact));
  CHECK(forward_gap > 0);
  CHECK(forward_gap < 0.05);
  CHECK(largest_gap(q.grad().to_vector<float>(), as_doubles(exact_dq)) < 0.05);
  // dv = W^T dO with dO all ones: dv[b, h, s, :] = sum over t of W[b, h, t, s], each weight rounded
  // to bfloat16 by the lowered backward (1 is exact). The weights are the forward's own.
  const std::vector<float> w = lowered.weights.to_vector<float>();  // [2, 4, 24, 24]
  std::vector<double> rounded_sums, exact_sums;
  for (int64_t pair = 0; pair < 8; ++pair)
    for (int64_t key = 0; key < 24; ++key) {
      double with_rounding = 0, without = 0;
      for (int64_t t = 0; t < 24; ++t) {
        const float weight = w[static_cast<size_t>((pair * 24 + t) * 24 + key)];
        with_rounding += rounded(weight);
        without += weight;
      }
      for (int64_t d = 0; d < 16; ++d) {
        rounded_sums.push_back(with_rounding);
        exact_sums.push_back(without);
      }
    }
  const std::vector<float> dv = v.grad().to_vector<float>();
  CHECK(largest_gap(dv, rounded_sums) < 1e-5);
  CHECK(largest_gap(dv, exact_sums) > 1e-4);
}

TEST_CASE("under autocast, bfloat16 inputs are cast to float32, gradients flowing back to them in bfloat16") {
  for (mf::Device device : mf::testing::test_devices()) {
    CAPTURE(device);
    Tensor x = mf::from_vector(std::vector<float>{1.5f, -2.0f, 0.25f}, {3}, device).to(DType::BFloat16);
    x.set_requires_grad(true);
    CHECK(mf::softmax(x, 0).dtype() == DType::BFloat16);  // outside autocast: bfloat16 arithmetic
    Tensor y;
    {
      mf::AutocastGuard autocast(device.type);
      y = mf::softmax(x, 0);
      CHECK(y.dtype() == DType::Float32);
      CHECK(y.device() == device);
      CHECK(y.to(mf::Device::cpu()).to_vector<float>() ==
            mf::softmax(x.detach().to(DType::Float32), 0).to(mf::Device::cpu()).to_vector<float>());
      (x * 3.0).sum().backward();
      // Fills write into their input, so bfloat16 ones keep it: fill_ takes bfloat16 itself.
      Tensor filled = mf::zeros({2}, DType::BFloat16, device);
      filled.fill_(0.5);
      CHECK(filled.dtype() == DType::BFloat16);
    }
    REQUIRE(x.grad().defined());
    CHECK(x.grad().dtype() == DType::BFloat16);
    CHECK(x.grad().device() == device);
    CHECK(x.grad().to(DType::Float32).to(mf::Device::cpu()).to_vector<float>() == std::vector<float>{3, 3, 3});
  }
}

namespace {

// A stand-in for a kernel that reads bfloat16 (cuBLAS's: OpDef::lowered_kernel_reads_bfloat16), so
// that the dispatcher's side of it is checked on every machine: it records the dtypes it is given,
// then computes as the CPU's matmul does on float32 copies of them.
std::vector<DType> dtypes_given;
mf::KernelFn cpu_matmul = nullptr;

void recording_matmul(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, const mf::Attrs& attrs) {
  std::vector<Tensor> float32;
  for (const Tensor& t : inputs) {
    dtypes_given.push_back(t.dtype());
    float32.push_back(t.to(DType::Float32));
  }
  cpu_matmul(float32, outputs, attrs);
}

/// Puts the recording kernel in the CPU's matmul slot for its scope.
struct RecordingMatmul {
  RecordingMatmul() {
    mf::Registry& registry = mf::detail::registry_to_extend();
    cpu_matmul = registry[mf::OpId::matmul].kernels[static_cast<size_t>(mf::DeviceType::CPU)];
    registry.set_kernel(mf::OpId::matmul, mf::DeviceType::CPU, recording_matmul, /*reads_bfloat16_when_lowered=*/true);
  }
  ~RecordingMatmul() { mf::detail::registry_to_extend().set_kernel(mf::OpId::matmul, mf::DeviceType::CPU, cpu_matmul); }
  RecordingMatmul(const RecordingMatmul&) = delete;
  RecordingMatmul& operator=(const RecordingMatmul&) = delete;
};

}  // namespace

// Values worked by hand: a [[1, 2, 3], [4, 5, 6]] times b [[0.5, 1], [1.5, 2], [2.5, 3]], all exact in
// bfloat16; the gradients of the sum are row sums of b (a's, in each row) and column sums of a (b's).
TEST_CASE("a kernel that reads bfloat16 under autocast gets bfloat16 inputs as they are, and float32 results") {
  RecordingMatmul recording;
  Tensor a = mf::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).to(DType::BFloat16).set_requires_grad(true);
  Tensor b = mf::from_vector(std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}, {3, 2}).set_requires_grad(true);
  CHECK(mf::matmul(a, b).dtype() == DType::Float32);  // outside autocast: b's float32 makes the result float32
  mf::AutocastGuard autocast;
  dtypes_given.clear();
  Tensor y = mf::matmul(a, b);
  CHECK(dtypes_given == std::vector<DType>{DType::BFloat16, DType::Float32});  // no cast in between
  CHECK(y.dtype() == DType::Float32);
  CHECK(y.to_vector<float>() == std::vector<float>{11, 14, 24.5f, 32});
  dtypes_given.clear();
  y.sum().backward();  // da = dy b^T (float32 operands), db = a^T dy (a still bfloat16)
  CHECK(dtypes_given == std::vector<DType>{DType::Float32, DType::Float32, DType::BFloat16, DType::Float32});
  CHECK(a.grad().dtype() == DType::BFloat16);
  CHECK(a.grad().to(DType::Float32).to_vector<float>() == std::vector<float>{1.5f, 3.5f, 5.5f, 1.5f, 3.5f, 5.5f});
  CHECK(b.grad().dtype() == DType::Float32);
  CHECK(b.grad().to_vector<float>() == std::vector<float>{5, 5, 7, 7, 9, 9});
  // Both operands bfloat16: still a float32 result, as autocast's lowered ops give.
  dtypes_given.clear();
  Tensor both = mf::matmul(a.detach(), b.detach().to(DType::BFloat16));
  CHECK(dtypes_given == std::vector<DType>{DType::BFloat16, DType::BFloat16});
  CHECK(both.dtype() == DType::Float32);
  CHECK(both.to_vector<float>() == std::vector<float>{11, 14, 24.5f, 32});
}
