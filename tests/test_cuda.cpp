// The CUDA runtime: the build says whether it has CUDA, CUDA tensors without a GPU fail with a clear
// error, the CUDA allocator caches, and ops without a CUDA kernel are listed and refused by name. The
// ops themselves are checked on every device by the registry suite (test_ops_registry).
#include <doctest/doctest.h>

#include "cuda/cuda.h"
#include "miniflow.h"
#include "helpers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

using namespace mf;

#ifndef MF_CUDA
#define MF_CUDA 0
#endif

namespace {

const Device kGpu = Device::cuda(0);

}  // namespace

TEST_CASE("the build says whether it includes CUDA") {
  CHECK(cuda::is_built() == bool(MF_CUDA));
  CHECK(cuda::device_count() >= 0);
  CHECK(cuda::is_available() == (cuda::device_count() > 0));
  if (!cuda::is_built()) CHECK(cuda::device_count() == 0);
  // The reason is empty exactly when CUDA is available, and names the missing build where that is why.
  CHECK(cuda::unavailable_reason().empty() == cuda::is_available());
  if (!cuda::is_built()) CHECK(cuda::unavailable_reason().find("built without CUDA") != std::string::npos);
  MESSAGE("CUDA built: ", cuda::is_built(), ", GPUs visible: ", cuda::device_count(), ", ",
          cuda::is_available() ? "available" : "unavailable: " + cuda::unavailable_reason());
}

TEST_CASE("without a GPU, CUDA tensors fail with a clear error and the CPU path is unaffected") {
  if (cuda::is_available()) {
    MESSAGE("not checked here: a GPU is present, so CUDA tensors cannot fail for want of one");
    return;
  }
  CHECK_THROWS_WITH_AS(Tensor::empty({2, 3}, DType::Float32, kGpu), doctest::Contains("cuda:0 is not available"),
                       Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({2, 3}, DType::Float32, kGpu),
                       doctest::Contains(cuda::unavailable_reason().c_str()), Error);
  Tensor x = ones({2, 3});
  CHECK_THROWS_WITH_AS(x.to(kGpu), doctest::Contains("to_device: device cuda:0 is not available"), Error);
  Tensor y = x.to(Device::cpu()).add(x);  // the CPU to_device and add still work
  CHECK(y.sum().item<double>() == 12.0);  // 6 elements of 1 + 1
}

TEST_CASE("the CUDA allocator caches freed blocks and empty_cache gives them back") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: the CUDA allocator's cache is not checked");
    return;
  }
  empty_cache(kGpu);
  const AllocatorStats start = memory_stats(kGpu);
  { Tensor t = Tensor::empty({1000}, DType::Float32, kGpu); }  // 4,000 bytes: a 4,096-byte block
  const AllocatorStats freed = memory_stats(kGpu);
  CHECK(freed.allocated_bytes == start.allocated_bytes);
  CHECK(freed.cached_bytes == 4096);
  CHECK(freed.system_allocations == start.system_allocations + 1);
  { Tensor t = Tensor::empty({1000}, DType::Float32, kGpu); }
  CHECK(memory_stats(kGpu).cache_hits == freed.cache_hits + 1);
  CHECK(empty_cache(kGpu) == 4096);
  CHECK(memory_stats(kGpu).cached_bytes == 0);
}

TEST_CASE("ops without a CUDA kernel are listed and refused by name") {
  std::vector<std::string> missing = cuda::missing_ops();
  std::string list;
  for (const std::string& name : missing) list += (list.empty() ? "" : ", ") + name;
  MESSAGE("ops without a CUDA kernel (", missing.size(), "): ", list.empty() ? "none" : list);
  auto listed = [&](std::string_view name) { return std::find(missing.begin(), missing.end(), name) != missing.end(); };
  // Views never need kernels; a build without CUDA has none, so every other op is listed there.
  CHECK(!listed("view"));
  CHECK(!listed("permute"));
  CHECK(listed("add") == !cuda::is_built());
  CHECK(listed("matmul") == !cuda::is_built());
  CHECK(listed("softmax") == !cuda::is_built());
  if (!cuda::is_available()) return;
  for (const std::string& name : missing) {
    auto index = std::find(std::begin(kOpNames), std::end(kOpNames), name) - std::begin(kOpNames);
    const OpDef& def = registry()[static_cast<OpId>(index)];
    CAPTURE(name);
    const std::vector<Sample> samples = def.samples();  // held: front() of the temporary would dangle
    const Sample& sample = samples.front();
    std::vector<Tensor> inputs;
    for (const Tensor& t : sample.inputs) inputs.push_back(t.to(kGpu));
    CHECK_THROWS_WITH_AS(call(static_cast<OpId>(index), inputs, sample.attrs),
                         doctest::Contains("no kernel for device cuda:0"), Error);
  }
}

// cuBLAS's compute types (cuda/matmul.cu): float32 by default, TF32 under "high", operands rounded to
// bfloat16 under autocast (and its gradients) and "medium". References: float64 sums on the CPU of
// the exact operands and of the bfloat16-rounded ones; TF32 (10 mantissa bits) and bfloat16 (7)
// round each operand by at most 2^-11 and 2^-8 relative, so 64 products of unit normals move by
// well under 0.02 and 0.2 in all.
TEST_CASE("CUDA GEMMs compute in float32, TF32 or bfloat16 as the precision settings ask") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: cuBLAS's compute types are not checked");
    return;
  }
  manual_seed(21);
  Tensor x = randn({40, 64}), w = randn({48, 64}), bias = randn({48});
  auto reference = [&](bool round) {
    auto operand = [&](const Tensor& t) { return round ? t.to(DType::BFloat16).to(DType::Float32) : t; };
    return linear(operand(x).to(DType::Float64), operand(w).to(DType::Float64), bias.to(DType::Float64));
  };
  auto largest_gap = [](const Tensor& a, const Tensor& b) {
    return (a.to(Device::cpu()).to(DType::Float64) - b).abs().max().item<double>();
  };
  const Tensor exact = reference(false), rounded = reference(true);
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = bias.to(kGpu);
  CHECK(largest_gap(linear(xg, wg, bg), exact) < 1e-4);
  set_float32_matmul_precision("high");
  CHECK(largest_gap(linear(xg, wg, bg), exact) < 0.02);
  set_float32_matmul_precision("highest");
  Tensor xr = xg.detach().set_requires_grad(true);
  Tensor lowered;
  {
    AutocastGuard autocast(DeviceType::CUDA);
    lowered = linear(xr, wg, bg);
  }
  CHECK(largest_gap(lowered, rounded) < 0.2);
  CHECK(largest_gap(lowered, exact) < 0.2);
  lowered.sum().backward();  // dx = ones W: sums of 48 weights, each rounded
  const Tensor dx_exact = w.to(DType::Float64).sum({0}).expand({40, 64});
  CHECK(largest_gap(xr.grad(), dx_exact) < 0.2);
}

// Under autocast, cuBLAS reads bfloat16 tensors as they are (CUDA_R_16BF operands, float32 sums and
// results) where the CPU casts them to float32 first. Reference: float64 sums, on the CPU, of the
// operands rounded to bfloat16 (a float32 operand beside a bfloat16 one is rounded as autocast would
// round it); their products are exact in float32, so only the float32 sums of 64 of them (each
// within about 2^-24 relative) separate the two: 1e-4 of sums of size ~10. Gradients are float32
// sums of 40 or 48 bfloat16 values, then rounded to the leaf's bfloat16: within 2^-8 relative.
TEST_CASE("CUDA GEMMs read bfloat16 tensors as they are under autocast, their gradients too") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: cuBLAS's bfloat16 operands are not checked");
    return;
  }
  manual_seed(23);
  const Tensor x = randn({40, 64}), w = randn({48, 64}), bias = randn({48}), b = randn({64, 7});
  auto rounded = [](const Tensor& t) { return t.to(DType::BFloat16).to(DType::Float64); };
  auto largest_gap = [](const Tensor& a, const Tensor& reference) {
    return (a.to(Device::cpu()).to(DType::Float64) - reference).abs().max().item<double>();
  };
  const Tensor xb = x.to(DType::BFloat16).to(kGpu), wb = w.to(DType::BFloat16).to(kGpu), bg = bias.to(kGpu);
  CHECK_THROWS_WITH_AS(linear(xb, wb, bg), doctest::Contains("bfloat16 tensors are stored"), Error);

  AutocastGuard autocast(DeviceType::CUDA);
  const Tensor linear_reference = linear(rounded(x), rounded(w), bias.to(DType::Float64));
  {
    NoGradGuard no_grad;
    const size_t allocations = memory_stats(kGpu).allocations;
    Tensor out = linear(xb, wb, bg);
    CHECK(memory_stats(kGpu).allocations == allocations + 1);  // the result alone: no float32 copies
    CHECK(out.dtype() == DType::Float32);
    CHECK(largest_gap(out, linear_reference) < 1e-4);
  }
  CHECK(largest_gap(linear(x.to(kGpu), wb, bg), linear_reference) < 1e-4);  // float32 x rounded, as autocast does
  Tensor both = matmul(xb, wb.t());  // two bfloat16 operands: a float32 result still
  CHECK(both.dtype() == DType::Float32);
  CHECK(largest_gap(both, matmul(rounded(x), rounded(w).t())) < 1e-4);
  // A batched matmul with a broadcast bfloat16 right operand and a float32 left one.
  const Tensor a = randn({3, 5, 64});
  Tensor product = matmul(a.to(kGpu), b.to(DType::BFloat16).to(kGpu));
  CHECK(product.dtype() == DType::Float32);
  CHECK(largest_gap(product, matmul(rounded(a), rounded(b))) < 1e-4);

  Tensor xl = xb.detach().set_requires_grad(true), wl = wb.detach().set_requires_grad(true);
  linear(xl, wl, bg).sum().backward();  // dx = ones W (column sums of W), dW = ones^T x (column sums of x)
  auto check_gradient = [&](const Tensor& grad, const Tensor& reference) {
    CHECK(grad.dtype() == DType::BFloat16);
    const Tensor gap = grad.to(Device::cpu()).to(DType::Float64) - reference;
    CHECK((gap.abs() - reference.abs() * std::ldexp(1.0, -8)).max().item<double>() <= 1e-5);
  };
  check_gradient(xl.grad(), rounded(w).sum({0}).expand({40, 64}));
  check_gradient(wl.grad(), rounded(x).sum({0}).expand({48, 64}));
}

// index_select_out into x's own memory moves rows in place on the CPU; the CUDA kernel reads a copy of
// x instead. Both must leave the buffer as the CPU does (a beam search's cache reorder and compaction).
TEST_CASE("index_select_out on CUDA writes a strided view and x's own memory as the CPU does") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: index_select_out is not checked on CUDA");
    return;
  }
  for (const std::vector<int64_t>& pattern : std::vector<std::vector<int64_t>>{{1, 2, 3, 0}, {0, 0, 1, 2}, {3, 1}}) {
    manual_seed(22);
    Tensor cpu_buffer = randn({5, 3, 6}), gpu_buffer = cpu_buffer.to(kGpu);
    const Tensor index = from_vector(pattern, {static_cast<int64_t>(pattern.size())});
    for (Tensor* buffer : {&cpu_buffer, &gpu_buffer}) {
      Tensor x = buffer->narrow(0, 0, 4).narrow(2, 0, 4);
      Tensor out = buffer->narrow(0, 0, index.numel()).narrow(2, 0, 4);
      index_select_out(out, x, 0, index.to(buffer->device()));
    }
    mf::testing::check_close(gpu_buffer.to(Device::cpu()), cpu_buffer, 0, 0);
  }
}
