// Ops that write values into an existing tensor (fill, arange, random draws) and the factories built
// on them.
#include "core/graph.h"
#include "ops/families.h"
#include "ops/loops.h"
#include "ops/ops.h"
#include "ops/reference.h"

namespace mf {
namespace {

std::vector<OutputSpec> infer_in_place(const std::vector<Tensor>& in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

// ---- fill ---------------------------------------------------------------------------------------

void cpu_fill(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    T value = static_cast<T>(attrs.value);
    cpu::map<T>(out[0], {}, [value]() { return value; });
  });
}

std::vector<Tensor> reference_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {reference::map({in[0]}, in[0].dtype(), [&](std::span<const double>) { return attrs.value; })};
}

}  // namespace

void register_fill_ops(Registry& r) {
  r.define(OpId::fill, {.name = "fill", .infer = infer_in_place, .kernels = {cpu_fill}, .writes_input = true,
                        .samples = [] {
                          return std::vector<Sample>{
                              {"float", {reference::randn({3, 4}, 51)}, {.value = 2.5}},
                              {"int64", {reference::randint({5}, 9, 52)}, {.value = -3}},
                          };
                        },
                        .reference = reference_fill});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor& Tensor::fill_(double value, Site site) {
  call_inplace(OpId::fill, *this, {*this}, {.value = value}, site);
  return *this;
}

Tensor& Tensor::zero_(Site site) { return fill_(0.0, site); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor out = Tensor::empty(shape, dtype, device);
  NoGradGuard no_grad;
  out.fill_(value);
  return out;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& like) { return zeros(like.shape(), like.dtype(), like.device()); }
Tensor ones_like(const Tensor& like) { return ones(like.shape(), like.dtype(), like.device()); }
Tensor empty_like(const Tensor& like) { return Tensor::empty(like.shape(), like.dtype(), like.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  Shape target = shape.empty() && values.size() != 1 ? Shape{static_cast<int64_t>(values.size())} : shape;
  MF_CHECK(shape_numel(target) == static_cast<int64_t>(values.size()),
           "from_vector: {} values do not fill shape {}", values.size(), shape_str(target));
  Tensor host = Tensor::empty(target, dtype_v<T>);
  T* data = host.data_ptr<T>();
  for (size_t i = 0; i < values.size(); ++i) data[i] = values[i];
  return device.is_cpu() ? host : host.to(device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<bool>&, const Shape&, Device);

Tensor tensor(std::initializer_list<double> values, DType dtype, Device device) {
  return from_vector(std::vector<double>(values)).to(dtype).to(device);
}

}  // namespace mf
