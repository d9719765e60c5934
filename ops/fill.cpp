// Ops that write values into an existing tensor (fill, arange, random draws) and the factories built
// on them.
//
// Random draws are counter-based: element i (row-major) of a draw keyed by (Attrs.seed,
// Attrs.counter) takes its bits from the Philox block (seed, counter + i / 2), so a draw does not
// depend on the thread count or the device, and a draw of n elements uses (n + 1) / 2 blocks, which
// the public functions reserve from a Generator.
#include "core/graph.h"
#include "ops/families.h"
#include "ops/kernel_checks.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/reference.h"

#include <array>
#include <cmath>

namespace mf {
namespace {

std::vector<OutputSpec> infer_in_place(const std::vector<Tensor>& in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

// ---- fill ---------------------------------------------------------------------------------------

std::vector<OutputSpec> infer_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  detail::expect_representable(attrs.value, in[0].dtype(), "fill value");
  return infer_in_place(in, attrs);
}

void cpu_fill(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    T value = static_cast<T>(attrs.value);
    cpu::map<T>(out[0], {}, [value]() { return value; });
  });
}

std::vector<Tensor> reference_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  return {reference::map({in[0]}, in[0].dtype(), [&](std::span<const double>) { return attrs.value; })};
}

/// Writes pair(p)[k] into row-major element 2p + k of `out`, pairs split across threads; a tensor
/// that is not contiguous is filled through a contiguous buffer.
template <typename T, typename Pair>
void fill_pairs(Tensor& out, Pair pair) {
  Tensor dst = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype());
  T* data = dst.data_ptr<T>();
  int64_t n = dst.numel();
  int64_t full_pairs = n / 2;
  parallel_for(0, full_pairs, cpu::kParallelGrain / 8, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {  // no tail test inside, so that the loop can vectorise
      std::array<T, 2> values = pair(p);
      data[2 * p] = values[0];
      data[2 * p + 1] = values[1];
    }
  });
  if (n % 2 == 1) data[n - 1] = pair(full_pairs)[0];
  if (!dst.is_same(out)) cpu::map<T, T>(out, {&dst}, [](T x) { return x; });
}

// ---- arange -------------------------------------------------------------------------------------
// Writes start + i * step into the 1-D input: Attrs.value = start, Attrs.eps = step. Computed in
// double and rounded once, as torch.arange.

std::vector<OutputSpec> infer_arange(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& t = in[0];
  MF_CHECK(t.dim() == 1, "fills a 1-D tensor, got shape {}", shape_str(t.shape()));
  MF_CHECK(t.dtype() != DType::Bool, "not defined for bool tensors");
  MF_CHECK(attrs.eps != 0, "step must be nonzero");
  MF_CHECK(std::isfinite(attrs.value) && std::isfinite(attrs.eps), "start ({}) and step ({}) must be finite",
           attrs.value, attrs.eps);
  detail::expect_representable(attrs.value, t.dtype(), "start");
  detail::expect_representable(attrs.value + static_cast<double>(std::max<int64_t>(t.numel() - 1, 0)) * attrs.eps,
                               t.dtype(), "last value");
  return infer_in_place(in, attrs);
}

void cpu_arange(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  double start = attrs.value, step = attrs.eps;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], [=](int64_t p) {
      double i = static_cast<double>(2 * p);
      return std::array<T, 2>{static_cast<T>(start + i * step), static_cast<T>(start + (i + 1) * step)};
    });
  });
}

std::vector<Tensor> reference_arange(const std::vector<Tensor>& in, const Attrs& attrs) {
  std::vector<double> values;
  for (int64_t i = 0; i < in[0].numel(); ++i) values.push_back(attrs.value + static_cast<double>(i) * attrs.eps);
  return {reference::make(in[0].shape(), in[0].dtype(), values)};
}

// ---- random draws -------------------------------------------------------------------------------
// uniform: Attrs.min = low, Attrs.max = high; float tensors get low + (high - low) u with u in [0, 1)
//   (24 random bits for float32: the top bits of the float64 draw), int64 tensors get
//   low + floor((high - low) u), integers in [low, high).
// normal: Attrs.value = mean, Attrs.eps = std; Box-Muller on block (u1, u2) gives the pair
//   r cos(theta), r sin(theta), r = sqrt(-2 log(1 - u1)), theta = 2 pi u2.
// bernoulli: Attrs.value = p; 1 where u < p, else 0, with u = w / 2^32 from the element's first word.

std::vector<OutputSpec> infer_uniform(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& t = in[0];
  MF_CHECK(t.dtype() != DType::Bool, "not defined for bool tensors");
  MF_CHECK(attrs.min && attrs.max, "needs both bounds (Attrs.min and Attrs.max)");
  MF_CHECK(std::isfinite(*attrs.min) && std::isfinite(*attrs.max), "bounds must be finite, got [{}, {})", *attrs.min,
           *attrs.max);
  MF_CHECK(*attrs.min <= *attrs.max, "low ({}) must not exceed high ({})", *attrs.min, *attrs.max);
  detail::expect_representable(*attrs.min, t.dtype(), "low");
  detail::expect_representable(*attrs.max, t.dtype(), "high");
  if (!is_floating(t.dtype()))
    MF_CHECK(*attrs.min < *attrs.max, "the integer range [{}, {}) is empty", *attrs.min, *attrs.max);
  return infer_in_place(in, attrs);
}

std::vector<OutputSpec> infer_normal(const std::vector<Tensor>& in, const Attrs& attrs) {
  MF_CHECK(is_floating(in[0].dtype()), "needs a floating tensor, got {}", dtype_name(in[0].dtype()));
  MF_CHECK(attrs.eps >= 0, "std must be non-negative, got {}", attrs.eps);
  return infer_in_place(in, attrs);
}

std::vector<OutputSpec> infer_bernoulli(const std::vector<Tensor>& in, const Attrs& attrs) {
  MF_CHECK(attrs.value >= 0 && attrs.value <= 1, "p must be in [0, 1], got {}", attrs.value);
  return infer_in_place(in, attrs);
}

/// The pair of [0, 1) draws of one Philox block, at T's precision (words 0-1 and 2-3).
template <typename T>
std::array<T, 2> uniform_pair(const std::array<uint32_t, 4>& w) {
  if constexpr (std::is_same_v<T, float>) return {uniform_float(w[0]), uniform_float(w[2])};
  else return {uniform_double(w[0], w[1]), uniform_double(w[2], w[3])};
}

void cpu_uniform(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  double low = *attrs.min, range = *attrs.max - *attrs.min;
  uint64_t seed = attrs.seed, counter = attrs.counter;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) {
      fill_pairs<T>(out[0], [=](int64_t p) {
        std::array<T, 2> u = uniform_pair<T>(Philox::block(seed, 0, counter + p));
        return std::array<T, 2>{static_cast<T>(low + range * u[0]), static_cast<T>(low + range * u[1])};
      });
    } else if constexpr (std::is_same_v<T, int64_t>) {
      fill_pairs<T>(out[0], [=](int64_t p) {
        std::array<double, 2> u = uniform_pair<double>(Philox::block(seed, 0, counter + p));
        return std::array<T, 2>{static_cast<T>(low + std::floor(range * u[0])),
                                static_cast<T>(low + std::floor(range * u[1]))};
      });
    }
  });
}

void cpu_normal(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  double mean = attrs.value, std = attrs.eps;
  uint64_t seed = attrs.seed, counter = attrs.counter;
  visit_floating(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], [=](int64_t p) {
      std::array<double, 2> u = uniform_pair<double>(Philox::block(seed, 0, counter + p));
      double r = std::sqrt(-2.0 * std::log(1.0 - u[0])), theta = 2.0 * M_PI * u[1];
      return std::array<T, 2>{static_cast<T>(mean + std * r * std::cos(theta)),
                              static_cast<T>(mean + std * r * std::sin(theta))};
    });
  });
}

// One 32-bit word per element (words 0 and 2 of the pair's block), compared as integers so that the
// loop vectorises: 1 where w < p 2^32.
void cpu_bernoulli(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  auto threshold = static_cast<uint64_t>(std::ceil(attrs.value * 0x1p32));
  uint64_t seed = attrs.seed, counter = attrs.counter;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], [=](int64_t p) {
      std::array<uint32_t, 4> w = Philox::block(seed, 0, counter + p);
      return std::array<T, 2>{static_cast<T>(uint64_t{w[0]} < threshold), static_cast<T>(uint64_t{w[2]} < threshold)};
    });
  });
}

/// Element i's Philox words, recomputed one element at a time for the references.
std::array<uint32_t, 4> words_of(const Attrs& attrs, int64_t i) {
  return Philox::block(attrs.seed, 0, attrs.counter + static_cast<uint64_t>(i / 2));
}

/// The 53-bit uniform of element i: words 2 (i % 2) and 2 (i % 2) + 1 of its block.
double reference_u(const Attrs& attrs, int64_t i) {
  std::array<uint32_t, 4> w = words_of(attrs, i);
  size_t k = static_cast<size_t>(i % 2) * 2;
  return static_cast<double>((static_cast<uint64_t>(w[k]) << 32 | w[k + 1]) >> 11) / 9007199254740992.0;
}

std::vector<Tensor> reference_draw(const Tensor& t, const std::function<double(int64_t)>& value_of) {
  std::vector<double> values;
  for (int64_t i = 0; i < t.numel(); ++i) values.push_back(value_of(i));
  return {reference::make(t.shape(), t.dtype(), values)};
}

std::vector<Tensor> reference_uniform(const std::vector<Tensor>& in, const Attrs& attrs) {
  double low = *attrs.min, high = *attrs.max;
  bool integer = !is_floating(in[0].dtype());
  return reference_draw(in[0], [&](int64_t i) {
    double scaled = (high - low) * reference_u(attrs, i);
    return low + (integer ? std::floor(scaled) : scaled);
  });
}

std::vector<Tensor> reference_normal(const std::vector<Tensor>& in, const Attrs& attrs) {
  return reference_draw(in[0], [&](int64_t i) {
    double u1 = reference_u(attrs, i - i % 2), u2 = reference_u(attrs, i - i % 2 + 1);
    double angle = 2 * M_PI * u2, radius = std::sqrt(-2 * std::log(1 - u1));
    return attrs.value + attrs.eps * radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
  });
}

std::vector<Tensor> reference_bernoulli(const std::vector<Tensor>& in, const Attrs& attrs) {
  return reference_draw(in[0], [&](int64_t i) {
    double u = words_of(attrs, i)[static_cast<size_t>(i % 2) * 2] / 4294967296.0;
    return u < attrs.value ? 1.0 : 0.0;
  });
}

}  // namespace

void register_fill_ops(Registry& r) {
  r.define(OpId::fill, {.name = "fill", .infer = infer_fill, .kernels = {cpu_fill}, .writes_input = true,
                        .samples = [] {
                          return std::vector<Sample>{
                              {"float", {reference::randn({3, 4}, 51)}, {.value = 2.5}},
                              {"int64", {reference::randint({5}, 9, 52)}, {.value = -3}},
                          };
                        },
                        .reference = reference_fill});
  r.define(OpId::arange, {.name = "arange", .infer = infer_arange, .kernels = {cpu_arange}, .writes_input = true,
                          .samples = [] {
                            return std::vector<Sample>{
                                {"float, fractional step", {reference::randn({7}, 53)}, {.value = -1.5, .eps = 0.25}},
                                {"int64, negative step", {reference::randint({4}, 9, 54)}, {.value = 10, .eps = -3}},
                                {"one element", {reference::randn({1}, 55)}, {.value = 2, .eps = 1}},
                            };
                          },
                          .reference = reference_arange});
  r.define(OpId::uniform, {.name = "uniform", .infer = infer_uniform, .kernels = {cpu_uniform},
                           .writes_input = true,
                           .samples = [] {
                             return std::vector<Sample>{
                                 {"float", {reference::randn({3, 4}, 56)}, {.min = -1, .max = 3, .seed = 7}},
                                 {"odd count, counter", {reference::randn({5}, 57)},
                                  {.min = 0, .max = 1, .seed = 8, .counter = 12}},
                                 {"int64", {reference::randint({2, 5}, 9, 58)}, {.min = -3, .max = 4, .seed = 9}},
                                 {"scalar", {reference::randn({}, 59)}, {.min = 2, .max = 2.5, .seed = 10}},
                             };
                           },
                           .reference = reference_uniform});
  r.define(OpId::normal, {.name = "normal", .infer = infer_normal, .kernels = {cpu_normal}, .writes_input = true,
                          .samples = [] {
                            return std::vector<Sample>{
                                {"standard", {reference::randn({3, 4}, 60)}, {.value = 0, .eps = 1, .seed = 11}},
                                {"odd count, shifted", {reference::randn({2, 3, 3}, 61)},
                                 {.value = 2, .eps = 0.5, .seed = 12, .counter = 5}},
                                {"scalar", {reference::randn({}, 62)}, {.value = -1, .eps = 3, .seed = 13}},
                            };
                          },
                          .reference = reference_normal});
  r.define(OpId::bernoulli, {.name = "bernoulli", .infer = infer_bernoulli, .kernels = {cpu_bernoulli},
                             .writes_input = true,
                             .samples = [] {
                               return std::vector<Sample>{
                                   {"float", {reference::randn({4, 5}, 63)}, {.value = 0.3, .seed = 14}},
                                   {"bool, odd count", {reference::randint({7}, 2, 64).to(DType::Bool)},
                                    {.value = 0.5, .seed = 15, .counter = 3}},
                                   {"int64, p = 1", {reference::randint({3}, 9, 65)}, {.value = 1, .seed = 16}},
                               };
                             },
                             .reference = reference_bernoulli});
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

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  MF_CHECK(step != 0, "arange: step must be nonzero");
  MF_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start ({}) and end ({}) must be finite", start, end);
  double count = std::ceil((end - start) / step);
  MF_CHECK(count >= 0, "arange: step {} points away from end: cannot go from {} to {}", step, start, end);
  Tensor out = Tensor::empty({static_cast<int64_t>(count)}, dtype, device);
  NoGradGuard no_grad;
  call_inplace(OpId::arange, out, {out}, {.value = start, .eps = step});
  return out;
}

Tensor arange(int64_t end, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

namespace {
/// Runs a random fill on `t` with the next counters of `generator` (the default one when null),
/// outside autograd as torch.nn.init does.
void random_fill(OpId id, Tensor& t, Attrs attrs, Generator* generator, const Site& site) {
  Generator& source = generator != nullptr ? *generator : default_generator();
  attrs.seed = source.seed();
  attrs.counter = source.reserve(static_cast<uint64_t>(t.numel() + 1) / 2);
  NoGradGuard no_grad;
  call_inplace(id, t, {t}, attrs, site);
}
}  // namespace

void uniform_(Tensor& t, double low, double high, Generator* generator, Site site) {
  random_fill(OpId::uniform, t, {.min = low, .max = high}, generator, site);
}

void normal_(Tensor& t, double mean, double std, Generator* generator, Site site) {
  random_fill(OpId::normal, t, {.value = mean, .eps = std}, generator, site);
}

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Device device, Generator* generator) {
  Tensor out = Tensor::empty(shape, dtype, device);
  uniform_(out, low, high, generator);
  return out;
}

Tensor rand(const Shape& shape, DType dtype, Device device, Generator* generator) {
  return uniform(shape, 0.0, 1.0, dtype, device, generator);
}

Tensor randn(const Shape& shape, DType dtype, Device device, Generator* generator) {
  Tensor out = Tensor::empty(shape, dtype, device);
  normal_(out, 0.0, 1.0, generator);
  return out;
}

Tensor bernoulli(const Shape& shape, double p, DType dtype, Device device, Generator* generator) {
  Tensor out = Tensor::empty(shape, dtype, device);
  random_fill(OpId::bernoulli, out, {.value = p}, generator, Site::current());
  return out;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device, Generator* generator) {
  MF_CHECK(low < high, "randint: the range [{}, {}) is empty", low, high);
  return uniform(shape, static_cast<double>(low), static_cast<double>(high), DType::Int64, device, generator);
}

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
