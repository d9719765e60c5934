// The CUDA suite: every op with a CUDA kernel, on every registry sample, against the CPU result
// (float64, float32 and strided inputs), and CUDA backward against CPU backward. Without a GPU those
// checks are counted and reported as skipped, visibly; what runs everywhere is that the build says
// whether it has CUDA and that CUDA tensors without a GPU fail with a clear error.
#include <doctest/doctest.h>

#include "cuda/cuda.h"
#include "miniflow.h"
#include "ops/reference.h"
#include "helpers.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

using namespace mf;
using mf::testing::check_close;

#ifndef MF_CUDA
#define MF_CUDA 0
#endif

namespace {

const Device kGpu = Device::cuda(0);

/// The ops MF_CUDA_OPS names (comma-separated; unset: every op). The GPU kit runs compute-sanitizer's
/// slower tools over a few ops this way.
std::vector<std::string> requested_ops() {
  std::vector<std::string> names;
  const char* list = std::getenv("MF_CUDA_OPS");
  if (list == nullptr) return names;
  std::string_view rest = list;
  while (!rest.empty()) {
    size_t comma = std::min(rest.find(','), rest.size());
    if (comma > 0) names.emplace_back(rest.substr(0, comma));
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
  return names;
}

bool has_cuda_kernel(const OpDef& def) {
  return def.view != nullptr || def.kernels[static_cast<size_t>(DeviceType::CUDA)] != nullptr;
}

/// Copies of `tensors` on `device`, in float32 when `single` (float inputs only).
std::vector<Tensor> prepared(const std::vector<Tensor>& tensors, Device device, bool single) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) {
    Tensor c = single && t.dtype() == DType::Float64 ? t.to(DType::Float32) : t.clone();
    out.push_back(c.to(device));
  }
  return out;
}

/// Same values on `device`, laid out as every other element of a twice-as-wide buffer there.
Tensor strided_on(const Tensor& t, Device device) {
  if (t.dim() == 0 || t.numel() == 0) return t.to(device);
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor view = zeros(wide, t.dtype(), device).slice(-1, 0, wide.back(), 2);
  view.copy_(t.to(device));
  return view;
}

/// An op's attrs with the device it copies to moved onto the GPU (to_device's samples target the CPU).
Attrs on_gpu(OpId id, Attrs attrs) {
  if (id == OpId::to_device) attrs = ToDeviceParams{.device = kGpu};
  return attrs;
}

void check_same(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, double rtol, double atol) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t k = 0; k < gpu.size(); ++k) {
    CAPTURE(k);
    CHECK(gpu[k].device() == (cpu[k].device().is_cpu() ? kGpu : cpu[k].device()));
    check_close(gpu[k].to(Device::cpu()), cpu[k], rtol, atol);
  }
}

/// Gradients of sum_k <outputs_k, w_k> (fixed random w_k) with respect to the float64 inputs the
/// sample differentiates, computed on `device`; undefined where an input gets none.
std::vector<Tensor> gradients(OpId id, const Sample& sample, Device device) {
  std::vector<Tensor> inputs = prepared(sample.inputs, device, false), leaves;
  for (size_t k = 0; k < inputs.size(); ++k) {
    bool excluded = k < sample.no_grad_inputs.size() && sample.no_grad_inputs[k];
    if (inputs[k].dtype() == DType::Float64 && !excluded) leaves.push_back(inputs[k].set_requires_grad());
  }
  if (leaves.empty()) return {};
  std::vector<Tensor> outputs, weights;
  uint64_t seed = 900;
  Attrs attrs = sample.attrs;
  if (id == OpId::to_device) attrs = ToDeviceParams{.device = device};
  for (const Tensor& out : call(id, inputs, attrs)) {
    if (!out.requires_grad()) continue;
    outputs.push_back(out);
    weights.push_back(reference::randn(out.shape(), seed++).to(out.dtype()).to(device));
  }
  if (outputs.empty()) return {};
  std::vector<Tensor> grads = autograd::grad(outputs, leaves, weights, false, true);
  for (Tensor& g : grads)
    if (g.defined()) g = g.to(Device::cpu());
  return grads;
}

}  // namespace

TEST_CASE("the build says whether it includes CUDA") {
  CHECK(cuda::is_built() == bool(MF_CUDA));
  CHECK(cuda::device_count() >= 0);
  CHECK(cuda::is_available() == (cuda::device_count() > 0));
  if (!cuda::is_built()) CHECK(cuda::device_count() == 0);
  MESSAGE("CUDA built: ", cuda::is_built(), ", GPUs visible: ", cuda::device_count());
}

TEST_CASE("without a GPU, CUDA tensors fail with a clear error and the CPU path is unaffected") {
  if (cuda::is_available()) {
    MESSAGE("SKIPPED: a GPU is present, so the no-GPU errors cannot be checked");
    return;
  }
  CHECK_THROWS_WITH_AS(Tensor::empty({2, 3}, DType::Float32, kGpu), doctest::Contains("cuda:0 is not available"),
                       Error);
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
    const Sample& sample = def.samples().front();
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(call(static_cast<OpId>(index), prepared(sample.inputs, kGpu, false), sample.attrs),
                         doctest::Contains("no kernel for device cuda:0"), Error);
  }
}

TEST_CASE("every op with a CUDA kernel matches the CPU on its samples, forward and backward") {
  const std::vector<std::string> only = requested_ops();
  for (const std::string& name : only) {
    CAPTURE(name);
    CHECK(std::find(std::begin(kOpNames), std::end(kOpNames), name) != std::end(kOpNames));  // MF_CUDA_OPS spelled right
  }
  auto selected = [&](std::string_view name) {
    return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
  };
  int checks = 0, run = 0;
  for (size_t i = 0; i < kOpCount; ++i) {
    auto id = static_cast<OpId>(i);
    const OpDef& def = registry()[id];
    if (!cuda::is_built() || !has_cuda_kernel(def) || !selected(kOpNames[i])) continue;
    for (const Sample& sample : def.samples()) {
      CAPTURE(kOpNames[i]);
      CAPTURE(sample.name);
      bool backward = def.backward != nullptr && sample.gradcheck;
      checks += backward ? 4 : 3;
      if (!cuda::is_available()) continue;
      ++run;
      std::vector<Tensor> expected = call(id, prepared(sample.inputs, Device::cpu(), false), sample.attrs);
      // Tolerances: GPU math functions are within a few ulp of glibc's, and sums fold in another order.
      check_same(call(id, prepared(sample.inputs, kGpu, false), on_gpu(id, sample.attrs)), expected, 1e-9, 1e-12);
      std::vector<Tensor> expected32 = call(id, prepared(sample.inputs, Device::cpu(), true), sample.attrs);
      check_same(call(id, prepared(sample.inputs, kGpu, true), on_gpu(id, sample.attrs)), expected32, 1e-5, 1e-5);
      std::vector<Tensor> strided;
      for (const Tensor& t : sample.inputs) strided.push_back(strided_on(t, kGpu));
      check_same(call(id, strided, on_gpu(id, sample.attrs)), expected, 1e-9, 1e-12);
      if (!backward) continue;
      std::vector<Tensor> cpu_grads = gradients(id, sample, Device::cpu()), gpu_grads = gradients(id, sample, kGpu);
      REQUIRE(cpu_grads.size() == gpu_grads.size());
      for (size_t k = 0; k < cpu_grads.size(); ++k) {
        CAPTURE(k);
        REQUIRE(cpu_grads[k].defined() == gpu_grads[k].defined());
        if (cpu_grads[k].defined()) check_close(gpu_grads[k], cpu_grads[k], 1e-9, 1e-12);
      }
    }
  }
  if (!cuda::is_built()) {
    MESSAGE("SKIPPED: miniflow was built without CUDA: no CUDA op checks exist in this build");
  } else if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: ", checks, " CUDA op checks not run");
  } else {
    MESSAGE("ran ", checks, " CUDA op checks over ", run, " samples on ", cuda::device_count(), " GPU(s)");
  }
}
