#include "ops/reference.h"

#include "core/generator.h"

#include <cmath>

namespace mf::reference {

void for_each_index(const Shape& shape, const std::function<void(const Shape&)>& fn) {
  int64_t total = shape_numel(shape);
  Shape index(shape.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    fn(index);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

double value_at_broadcast(const Tensor& t, const Shape& index) {
  Shape own(t.shape().size());
  size_t lead = index.size() - own.size();
  for (size_t d = 0; d < own.size(); ++d) own[d] = t.shape()[d] == 1 ? 0 : index[lead + d];
  return t.at<double>(own);
}

Tensor map(const std::vector<Tensor>& inputs, DType out_dtype,
           const std::function<double(std::span<const double>)>& fn) {
  Shape shape;
  for (const Tensor& t : inputs) shape = broadcast_shapes(shape, t.shape());
  std::vector<double> values;
  std::vector<double> args(inputs.size());
  for_each_index(shape, [&](const Shape& index) {
    for (size_t k = 0; k < inputs.size(); ++k) args[k] = value_at_broadcast(inputs[k], index);
    values.push_back(fn(args));
  });
  return make(shape, out_dtype, values);
}

Tensor make(const Shape& shape, DType dtype, const std::vector<double>& values) {
  MF_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "reference::make: {} values for shape {}",
           values.size(), shape_str(shape));
  Tensor out = Tensor::empty(shape, dtype);
  visit_any_dtype(dtype, [&]<typename T>() {
    T* data = out.data_ptr<T>();
    for (size_t i = 0; i < values.size(); ++i) data[i] = convert<T>(values[i]);
  });
  return out;
}

namespace {
std::vector<double> uniform_values(int64_t count, uint64_t seed) {
  std::vector<double> values;
  for (int64_t i = 0; i < count; ++i) {
    auto bits = Philox::block(seed, 0, static_cast<uint64_t>(i));
    values.push_back(uniform_double(bits[0], bits[1]));
  }
  return values;
}
}  // namespace

Tensor randn(const Shape& shape, uint64_t seed) {
  std::vector<double> u = uniform_values(2 * shape_numel(shape), seed), values;
  for (size_t i = 0; i + 1 < u.size(); i += 2)
    values.push_back(std::sqrt(-2.0 * std::log(1.0 - u[i])) * std::cos(2.0 * M_PI * u[i + 1]));
  return make(shape, DType::Float64, values);
}

Tensor uniform(const Shape& shape, double low, double high, uint64_t seed) {
  std::vector<double> values = uniform_values(shape_numel(shape), seed);
  for (double& v : values) v = low + (high - low) * v;
  return make(shape, DType::Float64, values);
}

Tensor randint(const Shape& shape, int64_t high, uint64_t seed) {
  std::vector<double> values = uniform_values(shape_numel(shape), seed);
  for (double& v : values) v = std::floor(v * static_cast<double>(high));
  return make(shape, DType::Int64, values);
}

double dropout_scale(uint64_t seed, uint64_t counter, double p, int64_t i) {
  uint32_t bits = Philox::block(seed, 0, counter + static_cast<uint64_t>(i) / 4)[i % 4];
  return static_cast<double>(uniform_float(bits)) >= p ? 1 / (1 - p) : 0.0;
}

}  // namespace mf::reference
