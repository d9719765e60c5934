// Ops that write values into an existing tensor (fill, arange, random draws) and the factories built
// on them.
//
// Random draws are counter-based: element i (row-major) of a draw keyed by its PhiloxStream (seed,
// counter) takes its bits from the Philox block (seed, counter + i / 2), so a draw does not
// depend on the thread count or the device, and a draw of n elements uses (n + 1) / 2 blocks, which
// the public functions reserve from a Generator.
#include "core/graph.h"
#include "ops/families.h"
#include "ops/kernel_checks.h"
#include "ops/cpu/loops.h"
#include "ops/functional.h"
#include "ops/reference.h"
#include "ops/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace mf {
namespace {

std::vector<OutputSpec> infer_in_place(const std::vector<Tensor>& in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

// ---- fill ---------------------------------------------------------------------------------------

std::vector<OutputSpec> infer_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  detail::expect_representable(std::get<FillParams>(attrs).value, in[0].dtype(), "fill value");
  return infer_in_place(in, attrs);
}

void cpu_fill(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  visit_any_dtype(out[0].dtype(), [&]<typename T>() {
    auto value = convert<T>(std::get<FillParams>(attrs).value);
    cpu::map<T>(out[0], {}, [value]() { return value; });
  });
}

std::vector<Tensor> reference_fill(const std::vector<Tensor>& in, const Attrs& attrs) {
  double value = std::get<FillParams>(attrs).value;
  return {reference::map({in[0]}, in[0].dtype(), [&](std::span<const double>) { return value; })};
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
// Writes start + i * step into the 1-D input. Computed in
// double and rounded once, as torch.arange.

std::vector<OutputSpec> infer_arange(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& t = in[0];
  MF_CHECK(t.dim() == 1, "fills a 1-D tensor, got shape {}", shape_str(t.shape()));
  MF_CHECK(t.dtype() != DType::Bool, "not defined for bool tensors");
  const auto& [start, step] = std::get<ArangeParams>(attrs);
  MF_CHECK(step != 0, "step must be nonzero");
  MF_CHECK(std::isfinite(start) && std::isfinite(step), "start ({}) and step ({}) must be finite", start, step);
  detail::expect_representable(start, t.dtype(), "start");
  detail::expect_representable(start + static_cast<double>(std::max<int64_t>(t.numel() - 1, 0)) * step, t.dtype(),
                               "last value");
  return infer_in_place(in, attrs);
}

void cpu_arange(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  auto [start, step] = std::get<ArangeParams>(attrs);
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], [=](int64_t p) {
      double i = static_cast<double>(2 * p);
      return std::array<T, 2>{static_cast<T>(start + i * step), static_cast<T>(start + (i + 1) * step)};
    });
  });
}

std::vector<Tensor> reference_arange(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [start, step] = std::get<ArangeParams>(attrs);
  std::vector<double> values;
  for (int64_t i = 0; i < in[0].numel(); ++i) values.push_back(start + static_cast<double>(i) * step);
  return {reference::make(in[0].shape(), in[0].dtype(), values)};
}

// ---- random draws -------------------------------------------------------------------------------
// uniform: float tensors get low + (high - low) u with u in [0, 1)
//   (24 random bits for float32: the top bits of the float64 draw), int64 tensors get
//   low + floor((high - low) u), integers in [low, high).
// normal: Box-Muller on block (u1, u2) gives the pair
//   r cos(theta), r sin(theta), r = sqrt(-2 log(1 - u1)), theta = 2 pi u2.
// bernoulli: 1 where u < p, else 0, with u = w / 2^32 from the element's first word.

std::vector<OutputSpec> infer_uniform(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& t = in[0];
  MF_CHECK(t.dtype() != DType::Bool, "not defined for bool tensors");
  const UniformParams& uniform = std::get<UniformParams>(attrs);
  double low = uniform.low, high = uniform.high;
  MF_CHECK(std::isfinite(low) && std::isfinite(high), "bounds must be finite, got [{}, {})", low, high);
  MF_CHECK(low <= high, "low ({}) must not exceed high ({})", low, high);
  detail::expect_representable(low, t.dtype(), "low");
  detail::expect_representable(high, t.dtype(), "high");
  if (!is_floating(t.dtype())) MF_CHECK(low < high, "the integer range [{}, {}) is empty", low, high);
  return infer_in_place(in, attrs);
}

std::vector<OutputSpec> infer_normal(const std::vector<Tensor>& in, const Attrs& attrs) {
  MF_CHECK(is_floating(in[0].dtype()), "needs a floating tensor, got {}", dtype_name(in[0].dtype()));
  double std = std::get<NormalParams>(attrs).std;
  MF_CHECK(std >= 0, "std must be non-negative, got {}", std);
  return infer_in_place(in, attrs);
}

std::vector<OutputSpec> infer_bernoulli(const std::vector<Tensor>& in, const Attrs& attrs) {
  double p = std::get<BernoulliParams>(attrs).p;
  MF_CHECK(p >= 0 && p <= 1, "p must be in [0, 1], got {}", p);
  return infer_in_place(in, attrs);
}

/// The pair of [0, 1) draws of one Philox block, at T's precision (words 0-1 and 2-3).
template <typename T>
std::array<T, 2> uniform_pair(const std::array<uint32_t, 4>& w) {
  if constexpr (std::is_same_v<T, float>) return {uniform_float(w[0]), uniform_float(w[2])};
  else return {uniform_double(w[0], w[1]), uniform_double(w[2], w[3])};
}

void cpu_uniform(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  const UniformParams& uniform = std::get<UniformParams>(attrs);
  double low = uniform.low, range = uniform.high - uniform.low;
  auto [seed, counter] = uniform.stream;
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
  const NormalParams& normal = std::get<NormalParams>(attrs);
  double mean = normal.mean, std = normal.std;
  auto [seed, counter] = normal.stream;
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
  const BernoulliParams& bernoulli = std::get<BernoulliParams>(attrs);
  auto threshold = static_cast<uint64_t>(std::ceil(bernoulli.p * 0x1p32));
  auto [seed, counter] = bernoulli.stream;
  visit_dtype(out[0].dtype(), [&]<typename T>() {
    fill_pairs<T>(out[0], [=](int64_t p) {
      std::array<uint32_t, 4> w = Philox::block(seed, 0, counter + p);
      return std::array<T, 2>{static_cast<T>(uint64_t{w[0]} < threshold), static_cast<T>(uint64_t{w[2]} < threshold)};
    });
  });
}

// ---- randperm: Fisher-Yates from the last position down; position i swaps with
// scaled_below(bits of element i, i + 1) (ops/sampling.h). The shuffle is one sequential pass.

std::vector<OutputSpec> infer_randperm(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& t = in[0];
  MF_CHECK(t.dim() == 1 && t.dtype() == DType::Int64, "fills a 1-D int64 tensor, got {} {}", dtype_name(t.dtype()),
           shape_str(t.shape()));
  return infer_in_place(in, attrs);
}

void cpu_randperm(const std::vector<Tensor>&, std::vector<Tensor>& out, const Attrs& attrs) {
  auto [seed, counter] = std::get<RandpermParams>(attrs).stream;
  Tensor& t = out[0];
  std::vector<int64_t> permutation(static_cast<size_t>(t.numel()));
  std::iota(permutation.begin(), permutation.end(), int64_t{0});
  for (uint64_t i = permutation.size(); i-- > 1;)
    std::swap(permutation[i], permutation[sampling::scaled_below(sampling::element_bits(seed, counter, i), i + 1)]);
  int64_t* data = t.data_ptr<int64_t>();
  for (size_t i = 0; i < permutation.size(); ++i) data[static_cast<int64_t>(i) * t.strides()[0]] = permutation[i];
}

// ---- multinomial (weights [N] or [B, N]) -> [num_samples] or [B, num_samples]: draw s of row b uses
// element b * num_samples + s of the stream, through sampling::pick_category; without replacement the
// rows' earlier draws are left out.

std::vector<OutputSpec> infer_multinomial(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& weights = in[0];
  const MultinomialParams& params = std::get<MultinomialParams>(attrs);
  MF_CHECK(weights.dim() == 1 || weights.dim() == 2, "weights must be 1-D or 2-D, got shape {}",
           shape_str(weights.shape()));
  MF_CHECK(is_floating(weights.dtype()), "weights must be floating, got {} (shape {})", dtype_name(weights.dtype()),
           shape_str(weights.shape()));
  int64_t categories = weights.shape().back();
  MF_CHECK(categories > 0, "needs at least one category, got shape {}", shape_str(weights.shape()));
  MF_CHECK(params.num_samples > 0, "num_samples must be positive, got {}", params.num_samples);
  MF_CHECK(params.replacement || params.num_samples <= categories,
           "cannot draw {} samples without replacement from {} categories", params.num_samples, categories);
  Shape shape = weights.shape();
  shape.back() = params.num_samples;
  return {{shape, DType::Int64}};
}

void cpu_multinomial(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  const Tensor& weights = in[0];
  const auto& [num_samples, replacement, stream] = std::get<MultinomialParams>(attrs);
  int64_t categories = weights.shape().back(), rows = weights.dim() == 2 ? weights.shape()[0] : 1;
  int64_t row_stride = weights.dim() == 2 ? weights.strides()[0] : 0, stride = weights.strides().back();
  Tensor& drawn = out[0];
  int64_t out_row = drawn.dim() == 2 ? drawn.strides()[0] : 0, out_stride = drawn.strides().back();
  int64_t* picks = drawn.data_ptr<int64_t>();
  visit_floating(weights.dtype(), [&]<typename T>() {
    const T* base = static_cast<const T*>(weights.raw_data());
    parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<char> taken(static_cast<size_t>(categories));
      for (int64_t b = begin; b < end; ++b) {
        std::fill(taken.begin(), taken.end(), 0);
        auto is_taken = [&](int64_t j) { return taken[static_cast<size_t>(j)] != 0; };
        for (int64_t s = 0; s < num_samples; ++s) {
          auto element = static_cast<uint64_t>(b * num_samples + s);
          double u = sampling::unit_interval(sampling::element_bits(stream.seed, stream.counter, element));
          int64_t pick = sampling::pick_category(base + b * row_stride, categories, stride, u, is_taken);
          picks[b * out_row + s * out_stride] = pick;
          if (!replacement && pick >= 0) taken[static_cast<size_t>(pick)] = 1;
        }
      }
    });
  });
}

/// Element i's Philox words, recomputed one element at a time for the references.
std::array<uint32_t, 4> words_of(const PhiloxStream& stream, int64_t i) {
  return Philox::block(stream.seed, 0, stream.counter + static_cast<uint64_t>(i / 2));
}

/// The 53-bit uniform of element i: words 2 (i % 2) and 2 (i % 2) + 1 of its block.
double reference_u(const PhiloxStream& stream, int64_t i) {
  std::array<uint32_t, 4> w = words_of(stream, i);
  size_t k = static_cast<size_t>(i % 2) * 2;
  return static_cast<double>((static_cast<uint64_t>(w[k]) << 32 | w[k + 1]) >> 11) / 9007199254740992.0;
}

std::vector<Tensor> reference_draw(const Tensor& t, const std::function<double(int64_t)>& value_of) {
  std::vector<double> values;
  for (int64_t i = 0; i < t.numel(); ++i) values.push_back(value_of(i));
  return {reference::make(t.shape(), t.dtype(), values)};
}

std::vector<Tensor> reference_uniform(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [low, high, stream] = std::get<UniformParams>(attrs);
  bool integer = !is_floating(in[0].dtype());
  return reference_draw(in[0], [&](int64_t i) {
    double scaled = (high - low) * reference_u(stream, i);
    return low + (integer ? std::floor(scaled) : scaled);
  });
}

std::vector<Tensor> reference_normal(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [mean, std, stream] = std::get<NormalParams>(attrs);
  return reference_draw(in[0], [&](int64_t i) {
    double u1 = reference_u(stream, i - i % 2), u2 = reference_u(stream, i - i % 2 + 1);
    double angle = 2 * M_PI * u2, radius = std::sqrt(-2 * std::log(1 - u1));
    return mean + std * radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
  });
}

std::vector<Tensor> reference_bernoulli(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& [p, stream] = std::get<BernoulliParams>(attrs);
  return reference_draw(in[0], [&](int64_t i) {
    double u = words_of(stream, i)[static_cast<size_t>(i % 2) * 2] / 4294967296.0;
    return u < p ? 1.0 : 0.0;
  });
}

// Fisher-Yates written with a 128-bit product for floor(bits * (i + 1) / 2^64).
std::vector<Tensor> reference_randperm(const std::vector<Tensor>& in, const Attrs& attrs) {
  const PhiloxStream& stream = std::get<RandpermParams>(attrs).stream;
  std::vector<double> values(static_cast<size_t>(in[0].numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  for (size_t i = values.size(); i-- > 1;) {
    std::array<uint32_t, 4> w = words_of(stream, static_cast<int64_t>(i));
    size_t k = (i % 2) * 2;
    unsigned __int128 bits = (static_cast<uint64_t>(w[k]) << 32) | w[k + 1];
    std::swap(values[i], values[static_cast<size_t>((bits * (i + 1)) >> 64)]);
  }
  return {reference::make(in[0].shape(), DType::Int64, values)};
}

// Inverse transform over the categories still available: their cumulative weights in order, and the
// first that exceeds u times their total.
std::vector<Tensor> reference_multinomial(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& weights = in[0];
  const auto& [num_samples, replacement, stream] = std::get<MultinomialParams>(attrs);
  int64_t categories = weights.shape().back(), rows = weights.dim() == 2 ? weights.shape()[0] : 1;
  std::vector<double> values;
  for (int64_t b = 0; b < rows; ++b) {
    std::vector<int64_t> available;
    std::vector<double> row;
    for (int64_t j = 0; j < categories; ++j) {
      row.push_back(weights.dim() == 2 ? weights.at<double>({b, j}) : weights.at<double>({j}));
      if (row.back() > 0) available.push_back(j);
    }
    for (int64_t s = 0; s < num_samples; ++s) {
      std::vector<double> cumulative;
      for (int64_t j : available) cumulative.push_back((cumulative.empty() ? 0.0 : cumulative.back()) + row[j]);
      double target = reference_u(stream, b * num_samples + s) * cumulative.back();
      size_t pick = 0;
      while (pick + 1 < cumulative.size() && !(cumulative[pick] > target)) ++pick;
      values.push_back(static_cast<double>(available[pick]));
      if (!replacement) available.erase(available.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  Shape shape = weights.shape();
  shape.back() = num_samples;
  return {reference::make(shape, DType::Int64, values)};
}

}  // namespace

void register_fill_ops(Registry& r) {
  r.define(OpId::fill, {.name = "fill", .infer = infer_fill, .kernels = {cpu_fill}, .writes_input = true,
                        .takes_storage_dtypes = true, .samples = [] {
                          return std::vector<Sample>{
                              {"float", {reference::randn({3, 4}, 51)}, FillParams{.value = 2.5}},
                              {"int64", {reference::randint({5}, 9, 52)}, FillParams{.value = -3}},
                          };
                        },
                        .reference = reference_fill});
  r.define(
      OpId::arange,
      {.name = "arange",
       .infer = infer_arange,
       .kernels = {cpu_arange},
       .writes_input = true,
       .samples =
           [] {
             return std::vector<Sample>{
                 {"float, fractional step", {reference::randn({7}, 53)}, ArangeParams{.start = -1.5, .step = 0.25}},
                 {"int64, negative step", {reference::randint({4}, 9, 54)}, ArangeParams{.start = 10, .step = -3}},
                 {"one element", {reference::randn({1}, 55)}, ArangeParams{.start = 2, .step = 1}},
             };
           },
       .reference = reference_arange});
  r.define(
      OpId::uniform,
      {.name = "uniform",
       .infer = infer_uniform,
       .kernels = {cpu_uniform},
       .writes_input = true,
       .samples =
           [] {
             return std::vector<Sample>{
                 {"float", {reference::randn({3, 4}, 56)}, UniformParams{.low = -1, .high = 3, .stream = {7}}},
                 {"odd count, counter",
                  {reference::randn({5}, 57)},
                  UniformParams{.low = 0, .high = 1, .stream = {8, 12}}},
                 {"int64", {reference::randint({2, 5}, 9, 58)}, UniformParams{.low = -3, .high = 4, .stream = {9}}},
                 {"scalar", {reference::randn({}, 59)}, UniformParams{.low = 2, .high = 2.5, .stream = {10}}},
             };
           },
       .reference = reference_uniform});
  r.define(OpId::normal,
           {.name = "normal",
            .infer = infer_normal,
            .kernels = {cpu_normal},
            .writes_input = true,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"standard", {reference::randn({3, 4}, 60)}, NormalParams{.mean = 0, .std = 1, .stream = {11}}},
                      {"odd count, shifted",
                       {reference::randn({2, 3, 3}, 61)},
                       NormalParams{.mean = 2, .std = 0.5, .stream = {12, 5}}},
                      {"scalar", {reference::randn({}, 62)}, NormalParams{.mean = -1, .std = 3, .stream = {13}}},
                  };
                },
            .reference = reference_normal});
  r.define(OpId::bernoulli,
           {.name = "bernoulli",
            .infer = infer_bernoulli,
            .kernels = {cpu_bernoulli},
            .writes_input = true,
            .samples =
                [] {
                  return std::vector<Sample>{
                      {"float", {reference::randn({4, 5}, 63)}, BernoulliParams{.p = 0.3, .stream = {14}}},
                      {"bool, odd count",
                       {reference::randint({7}, 2, 64).to(DType::Bool)},
                       BernoulliParams{.p = 0.5, .stream = {15, 3}}},
                      {"int64, p = 1", {reference::randint({3}, 9, 65)}, BernoulliParams{.p = 1, .stream = {16}}},
                  };
                },
            .reference = reference_bernoulli});
  r.define(OpId::randperm, {.name = "randperm", .infer = infer_randperm, .kernels = {cpu_randperm},
                            .writes_input = true, .samples = [] {
    return std::vector<Sample>{
        {"ten", {reference::randint({10}, 9, 66)}, RandpermParams{.stream = {17}}},
        {"odd count, counter", {reference::randint({7}, 9, 67)}, RandpermParams{.stream = {18, 4}}},
        {"one", {reference::randint({1}, 9, 68)}, RandpermParams{.stream = {19}}},
    };
  }, .reference = reference_randperm});
  r.define(OpId::multinomial, {.name = "multinomial", .infer = infer_multinomial, .kernels = {cpu_multinomial},
                               .saves_inputs = false, .samples = [] {
    Tensor zeros_inside = reference::make({2, 5}, DType::Float64, {0, 1, 0, 2, 0.5, 3, 0, 0, 1, 0});
    return std::vector<Sample>{
        {"one row, with replacement", {reference::uniform({6}, 0, 1, 69)},
         MultinomialParams{.num_samples = 9, .replacement = true, .stream = {20}}},
        {"rows, without replacement", {reference::uniform({3, 5}, 0, 1, 70)},
         MultinomialParams{.num_samples = 4, .replacement = false, .stream = {21, 7}}},
        {"zero weights are never drawn", {zeros_inside},
         MultinomialParams{.num_samples = 2, .replacement = false, .stream = {22}}},
        {"float32, every category", {reference::uniform({2, 4}, 0.1, 1, 71).to(DType::Float32)},
         MultinomialParams{.num_samples = 4, .replacement = false, .stream = {23}}},
    };
  }, .reference = reference_multinomial});
}

// ---- public API -----------------------------------------------------------------------------------

Tensor& Tensor::fill_(double value, Site site) {
  call_inplace<OpId::fill>(*this, {*this}, {.value = value}, site);
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
  call_inplace<OpId::arange>(out, {out}, {.start = start, .step = step});
  return out;
}

Tensor arange(int64_t end, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

namespace {
/// Runs a random fill on `t` with the next counters of `generator` (the default one when null),
/// outside autograd as torch.nn.init does.
template <OpId Id>
void random_fill(Tensor& t, ParamsOf<Id> params, Generator* generator, const Site& site) {
  Generator& source = generator != nullptr ? *generator : default_generator();
  params.stream.seed = source.seed();
  params.stream.counter = source.reserve(static_cast<uint64_t>(t.numel() + 1) / 2);
  NoGradGuard no_grad;
  call_inplace<Id>(t, {t}, params, site);
}
}  // namespace

void uniform_(Tensor& t, double low, double high, Generator* generator, Site site) {
  random_fill<OpId::uniform>(t, {.low = low, .high = high}, generator, site);
}

void normal_(Tensor& t, double mean, double std, Generator* generator, Site site) {
  random_fill<OpId::normal>(t, {.mean = mean, .std = std}, generator, site);
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
  random_fill<OpId::bernoulli>(out, {.p = p}, generator, Site::current());
  return out;
}

Tensor randperm(int64_t n, Device device, Generator* generator, Site site) {
  MF_CHECK(n >= 0, "randperm: n must be >= 0, got {} at {}", n, format_location(site));
  Tensor out = Tensor::empty({n}, DType::Int64, device);
  random_fill<OpId::randperm>(out, {}, generator, site);
  return out;
}

Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement, Generator* generator, Site site) {
  // The values are checked here, with ops that run where the weights are; the op itself checks
  // shapes and dtypes, so a tensor it would refuse goes straight to it.
  bool checkable = (weights.dim() == 1 || weights.dim() == 2) && is_floating(weights.dtype()) &&
                   weights.numel() > 0 && num_samples > 0 && (replacement || num_samples <= weights.shape().back());
  if (checkable) {
    NoGradGuard no_grad;
    Tensor rows = weights.detach().dim() == 1 ? weights.detach().unsqueeze(0) : weights.detach();
    auto per_row = [](const Tensor& t) { return t.to(DType::Float64).to(Device::cpu()).to_vector<double>(); };
    std::vector<double> totals = per_row(rows.sum({1})), lowest = per_row(amin(rows, {1}));
    std::vector<double> positive = per_row((rows > 0.0).sum({1}));
    for (size_t b = 0; b < totals.size(); ++b) {
      MF_CHECK(std::isfinite(totals[b]) && lowest[b] >= 0 && totals[b] > 0,
               "multinomial: weights must be finite, non-negative and not all zero in a row; row {} of {} {} sums to {} "
               "(smallest weight {}) at {}",
               b, dtype_name(weights.dtype()), shape_str(weights.shape()), totals[b], lowest[b], format_location(site));
      MF_CHECK(replacement || positive[b] >= static_cast<double>(num_samples),
               "multinomial: cannot draw {} samples without replacement from row {}, which has {} nonzero weights at {}",
               num_samples, b, static_cast<int64_t>(positive[b]), format_location(site));
    }
  }
  MultinomialParams params{.num_samples = num_samples, .replacement = replacement};
  Generator& source = generator != nullptr ? *generator : default_generator();
  int64_t rows = weights.dim() == 2 ? weights.shape()[0] : 1;
  params.stream.seed = source.seed();
  params.stream.counter = source.reserve(static_cast<uint64_t>(std::max<int64_t>(rows * num_samples, 0) + 1) / 2);
  return call1<OpId::multinomial>({weights}, params, site);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device, Generator* generator) {
  MF_CHECK(low < high, "randint: the range [{}, {}) is empty", low, high);
  return uniform(shape, static_cast<double>(low), static_cast<double>(high), DType::Int64, device, generator);
}

template <ElementType T>
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
template Tensor from_vector(const std::vector<bfloat16>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int8_t>&, const Shape&, Device);

Tensor tensor(std::initializer_list<double> values, DType dtype, Device device) {
  return from_vector(std::vector<double>(values)).to(dtype).to(device);
}

}  // namespace mf
