// Int8 quantized inference: per-channel weight quantization and linear_int8, the op a quantized
// model's Linear layers run (PyTorch's dynamic quantization: weights quantized once, activations per
// row at each call; ops/cpu/gemm_int8.h holds the arithmetic).
#include "ops/cpu/gemm_int8.h"
#include "ops/families.h"
#include "ops/functional.h"
#include "ops/packed_weights.h"
#include "ops/reference.h"
#include "ops/registry.h"

#include <cmath>
#include <limits>

namespace mf {
namespace {

/// The packed int8 weights linear_int8 has met (ops/packed_weights.h), by their values and scales: a
/// second copy of the int8 weights, a quarter of the float32 model's size.
PackedWeightCache<cpu::PackedInt8Weight, 2>& packed_weights() {
  static PackedWeightCache<cpu::PackedInt8Weight, 2> cache;
  return cache;
}

std::vector<OutputSpec> infer_linear_int8(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &values = in[1], &scales = in[2], &bias = in[3];
  MF_CHECK(x.dim() >= 1 && values.dim() == 2 && scales.dim() == 1 && bias.dim() == 1,
           "expects input [..., in], values [out, in], scales [out] and bias [out], got {}, {}, {} and {}",
           shape_str(x.shape()), shape_str(values.shape()), shape_str(scales.shape()), shape_str(bias.shape()));
  MF_CHECK(x.dtype() == DType::Float32 && values.dtype() == DType::Int8 && scales.dtype() == DType::Float32 &&
               bias.dtype() == DType::Float32,
           "expects a float32 input, int8 values and float32 scales and bias (quantized inference computes in "
           "float32), got {}, {}, {} and {}",
           dtype_name(x.dtype()), dtype_name(values.dtype()), dtype_name(scales.dtype()), dtype_name(bias.dtype()));
  MF_CHECK(x.size(-1) == values.size(1) && scales.size(0) == values.size(0) && bias.size(0) == values.size(0),
           "input {}, values {}, scales {} and bias {} do not fit: values must be [{}, {}], scales and bias [{}]",
           shape_str(x.shape()), shape_str(values.shape()), shape_str(scales.shape()), shape_str(bias.shape()),
           bias.size(0), x.size(-1), values.size(0));
  Shape shape = x.shape();
  shape.back() = values.size(0);
  return {{shape, DType::Float32}};
}

void cpu_linear_int8(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs&) {
  Tensor x = in[0].contiguous(), values = in[1].contiguous(), scales = in[2].contiguous(), bias = in[3].contiguous();
  Tensor& c = out[0];  // [..., out], contiguous and not empty (the dispatcher skips empty outputs)
  const int64_t cols = values.size(0), depth = values.size(1), rows = c.numel() / cols;
  std::shared_ptr<const cpu::PackedInt8Weight> packed = packed_weights().get({&values, &scales}, [&] {
    return cpu::PackedInt8Weight(cols, depth, values.data_ptr<int8_t>(), depth, scales.data_ptr<float>());
  });
  thread_local std::vector<int8_t> q_x;  // reused across calls: decoding makes thousands
  thread_local std::vector<float> x_scales;
  q_x.resize(static_cast<size_t>(rows * depth));
  x_scales.resize(static_cast<size_t>(rows));
  cpu::quantize_rows(rows, depth, x.data_ptr<float>(), depth, q_x.data(), depth, x_scales.data(), cpu::kInputLimit);
  cpu::gemm_int8(rows, q_x.data(), depth, x_scales.data(), *packed, c.data_ptr<float>(), cols, bias.data_ptr<float>());
}

/// The op's formula in naive loops, in float32 as the kernel's epilogue: x's rows quantized with
/// multiplier 127 / max|row| (ties to even), exact integer sums, then sum * (x_scale * w_scale) + bias.
/// (Weight values outside [-63, 63] are refused by the kernel's packing, not checked here.)
std::vector<Tensor> reference_linear_int8(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &values = in[1], &scales = in[2], &bias = in[3];
  Shape shape = infer_linear_int8(in, attrs)[0].shape;
  const int64_t depth = values.size(1);
  std::vector<double> results;
  reference::for_each_index(shape, [&](const Shape& index) {
    Shape at_x = index;
    float largest = 0;
    bool finite = true;
    for (int64_t k = 0; k < depth; ++k) {
      at_x.back() = k;
      float v = x.at<float>(at_x);
      finite = finite && std::isfinite(v);
      largest = std::max(largest, std::fabs(v));
    }
    float x_scale = !finite ? std::numeric_limits<float>::quiet_NaN() : largest == 0 ? 1.0f : largest / 127.0f;
    float multiplier = largest == 0 ? 1.0f : 127.0f / largest;
    int64_t j = index.back(), sum = 0;
    for (int64_t k = 0; k < depth && finite; ++k) {
      at_x.back() = k;
      sum += static_cast<int64_t>(std::nearbyint(x.at<float>(at_x) * multiplier)) * values.at<int64_t>({j, k});
    }
    results.push_back(static_cast<float>(sum) * (x_scale * scales.at<float>({j})) + bias.at<float>({j}));
  });
  return {reference::make(shape, DType::Float32, results)};
}

std::vector<Sample> linear_int8_samples() {
  auto weight = [](int64_t out, int64_t in, uint64_t seed) { return quantize_per_channel(reference::randn({out, in}, seed)
                                                                                             .to(DType::Float32)); };
  auto f32 = [](const Shape& shape, uint64_t seed) { return reference::randn(shape, seed).to(DType::Float32); };
  QuantizedWeight a = weight(5, 4, 200), b = weight(9, 6, 201), c = weight(3, 11, 202);
  return {
      {"2-d", {f32({3, 4}, 203), a.values, a.scales, f32({5}, 204)}},
      {"batched", {f32({2, 3, 6}, 205), b.values, b.scales, f32({9}, 206)}},
      {"1-d input", {f32({11}, 207), c.values, c.scales, f32({3}, 208)}},
      {"a row of zeros", {from_vector<float>({0, 0, 0, 0, 1, -2, 0.5f, 4}, {2, 4}), a.values, a.scales, f32({5}, 209)}},
  };
}

}  // namespace

void register_quantized_ops(Registry& r) {
  r.define(OpId::linear_int8, {.name = "linear_int8", .infer = infer_linear_int8, .kernels = {cpu_linear_int8},
                               .takes_storage_dtypes = true, .samples = linear_int8_samples,
                               .reference = reference_linear_int8});
}

// ---- public API -----------------------------------------------------------------------------------

QuantizedWeight quantize_per_channel(const Tensor& weight, Site site) {
  MF_CHECK(weight.dim() == 2 && weight.dtype() == DType::Float32 && weight.device().is_cpu(),
           "quantize_per_channel: expects a float32 CPU weight [out, in], got {} {} on {} at {}",
           dtype_name(weight.dtype()), shape_str(weight.shape()), weight.device().str(), format_location(site));
  Tensor w = weight.contiguous();
  const int64_t rows = w.size(0), depth = w.size(1);
  QuantizedWeight q{.values = Tensor::empty({rows, depth}, DType::Int8), .scales = Tensor::empty({rows})};
  cpu::quantize_rows(rows, depth, w.data_ptr<float>(), depth, q.values.data_ptr<int8_t>(), depth,
                     q.scales.data_ptr<float>(), cpu::kWeightLimit);
  return q;
}

Tensor dequantize_per_channel(const QuantizedWeight& weight, Site site) {
  return weight.values.to(DType::Float32, site).mul(weight.scales.unsqueeze(-1, site), site);
}

Tensor linear_int8(const Tensor& x, const QuantizedWeight& weight, const Tensor& bias, Site site) {
  Tensor b = bias.defined() ? bias : zeros({weight.values.dim() == 2 ? weight.values.size(0) : 0}, DType::Float32);
  return call1<OpId::linear_int8>({x, weight.values, weight.scales, b}, {}, site);
}

std::string_view linear_int8_kernel() {
  switch (cpu::int8_kernel_isa(kernel_isa())) {
    case Isa::avx512: return "AVX512-VNNI";
    case Isa::avx2: return "AVX2";
    case Isa::baseline: return "baseline";
  }
  return "baseline";
}

}  // namespace mf
