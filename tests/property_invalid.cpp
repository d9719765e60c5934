// Calls every op must refuse with mf::Error: each breaks one rule of the op's contract (as its
// documentation and PyTorch's semantics state it), starting from a valid random case, so the broken
// rule is the only thing wrong with the call.
#include "property_support.h"

#include "ops/reference.h"

#include <cmath>
#include <limits>
#include <optional>

namespace mf::props {
namespace {

constexpr int64_t kHuge = int64_t{1} << 62;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// The same values (truncated or truthy where they must be) in another dtype.
Tensor as(const Tensor& t, DType dtype) {
  std::vector<double> values = t.contiguous().to_vector<double>();
  if (dtype == DType::Bool)
    for (double& v : values) v = v != 0;
  if (dtype == DType::Int64)
    for (double& v : values) v = std::trunc(v);
  return reference::make(t.shape(), dtype, values);
}

Tensor filled(const Shape& shape, DType dtype, double value = 0) {
  return reference::make(shape, dtype, std::vector<double>(static_cast<size_t>(shape_numel(shape)), value));
}

DType other_float(DType dtype) { return dtype == DType::Float32 ? DType::Float64 : DType::Float32; }

/// The `dim` parameter of an op that works along one dim.
int64_t& dim_param(Attrs& attrs) {
  return std::visit(
      [](auto& params) -> int64_t& {
        if constexpr (requires { params.dim; }) return params.dim;
        else throw Error("the op takes no dim");
      },
      attrs);
}

/// Collects the refusals of one op.
class Cases {
 public:
  Cases(const Case& valid, Rng& rng) : valid_(valid), rng_(rng) {}

  /// The valid call with input k replaced.
  Cases& input(const std::string& what, size_t k, const Tensor& t) {
    std::vector<Tensor> inputs = valid_.inputs;
    inputs[k] = t;
    return call(what, inputs, valid_.attrs);
  }
  Cases& dtype(const std::string& what, size_t k, DType dtype) { return input(what, k, as(valid_.inputs[k], dtype)); }
  Cases& attrs(const std::string& what, const Attrs& attrs) { return call(what, valid_.inputs, attrs); }
  /// In-place ops: an output whose elements share memory (a stride-0 view of one element).
  Cases& expanded_output() {
    std::vector<Tensor> inputs = valid_.inputs;
    inputs[0] = filled({1}, inputs[0].dtype()).expand({3});
    out_.push_back({"an expanded output", inputs, valid_.attrs, true});
    return *this;
  }
  Cases& call(const std::string& what, const std::vector<Tensor>& inputs, const Attrs& attrs) {
    out_.push_back({what, inputs, attrs});
    return *this;
  }
  /// Parameters with `dim` out of range for input 0 (rank r accepts [-r, r), a scalar [-1, 1)).
  Cases& bad_dim(const std::string& what) {
    int64_t bound = std::max<int64_t>(valid_.inputs[0].dim(), 1);
    Attrs attrs = valid_.attrs;
    dim_param(attrs) = rng_.chance(0.5) ? bound + rng_.integer(0, 2) : -bound - 1 - rng_.integer(0, 2);
    return call(what, valid_.inputs, attrs);
  }
  /// Inputs a and b (positions ka, kb) of shapes that do not broadcast, dtypes kept.
  Cases& no_broadcast(size_t ka, size_t kb) {
    int64_t size = rng_.integer(2, 4);
    Shape a = random_shape(rng_, 0, 2, true), b = random_shape(rng_, 0, 2, true);
    a.push_back(size);
    b.push_back(size + rng_.integer(1, 2));
    std::vector<Tensor> inputs = valid_.inputs;
    inputs[ka] = draw_like(valid_.inputs[ka], a, rng_);
    inputs[kb] = draw_like(valid_.inputs[kb], b, rng_);
    return call("shapes that do not broadcast", inputs, valid_.attrs);
  }
  const Case& valid() const { return valid_; }
  Rng& rng() { return rng_; }
  std::vector<Invalid> take() { return std::move(out_); }

 private:
  const Case& valid_;
  Rng& rng_;
  std::vector<Invalid> out_;
};

/// `attrs`, whose struct is P, after `change`.
template <typename P, typename Change>
Attrs with(Attrs attrs, Change change) {
  change(std::get<P>(attrs));
  return attrs;
}

/// x with one more leading dim (rank mismatches).
Tensor lifted(const Tensor& t) {
  Shape shape = t.shape();
  shape.insert(shape.begin(), 2);
  return filled(shape, t.dtype());
}

/// x with dim d one larger.
Tensor grown(const Tensor& t, int64_t d) {
  Shape shape = t.shape();
  shape[static_cast<size_t>(d)] += 1;
  return filled(shape, t.dtype());
}

/// The case's dim in [0, rank) of input 0.
int64_t dim_of(const Case& c) {
  int64_t bound = std::max<int64_t>(c.inputs[0].dim(), 1);
  Attrs attrs = c.attrs;
  return (dim_param(attrs) + bound) % bound;
}

void unary_float(Cases& c) { c.dtype("int64 input", 0, DType::Int64).dtype("bool input", 0, DType::Bool); }

void binary(Cases& c, bool arithmetic) {
  DType dtype = c.valid().inputs[0].dtype();
  c.dtype("dtypes differ", 1, is_floating(dtype) ? other_float(dtype) : DType::Float64);
  if (arithmetic)
    c.call("bool operands", {as(c.valid().inputs[0], DType::Bool), as(c.valid().inputs[1], DType::Bool)},
           c.valid().attrs);
  c.no_broadcast(0, 1);
}

/// P: ReduceParams, or VarParams for var.
template <typename P>
void reduction(Cases& c, bool needs_float, bool needs_elements) {
  const Tensor& x = c.valid().inputs[0];
  int64_t rank = x.dim(), bound = std::max<int64_t>(rank, 1);
  c.attrs("dim out of range", with<P>(c.valid().attrs, [&](P& a) { a.dims = {bound + c.rng().integer(0, 2)}; }));
  if (rank > 0) c.attrs("repeated dim", with<P>(c.valid().attrs, [&](P& a) { a.dims = {0, -rank}; }));
  if (needs_float) c.dtype("int64 input", 0, DType::Int64);
  if (needs_elements) {
    Shape shape = x.shape();
    shape.push_back(0);
    c.call("reduction over a size-0 dim", {filled(shape, x.dtype())},
           with<P>(c.valid().attrs, [](P& a) { a.dims = {-1}; }));
  }
}

void along_dim(Cases& c) {
  const Tensor& x = c.valid().inputs[0];
  c.bad_dim("dim out of range");
  Shape shape = x.shape();
  shape.push_back(0);
  c.call("a size-0 dim", {filled(shape, x.dtype())},
         with<ReduceDimParams>(c.valid().attrs, [](auto& a) { a.dim = -1; }));
}

void index_ops(Cases& c, OpId id) {
  const Case& v = c.valid();
  const Tensor &x = v.inputs[0], &index = v.inputs[1];
  int64_t size = x.shape()[static_cast<size_t>(dim_of(v))];
  c.dtype("float index", 1, x.dtype() == DType::Int64 ? DType::Float64 : x.dtype());
  c.bad_dim("dim out of range");
  c.call(
      "0-dim x",
      [&] {
        std::vector<Tensor> in = v.inputs;
        in[0] = filled({}, x.dtype());
        return in;
      }(),
      v.attrs);
  Shape bad_shape = index.dim() == 0 ? Shape{1} : index.shape();
  if (shape_numel(bad_shape) == 0) bad_shape.assign(bad_shape.size(), 1);
  c.input("index past the end", 1, filled(bad_shape, DType::Int64, static_cast<double>(size + c.rng().integer(0, 3))));
  c.input("negative index", 1, filled(bad_shape, DType::Int64, -1 - static_cast<double>(c.rng().integer(0, 3))));
  if (id == OpId::index_select) c.input("2-d index", 1, filled({1, 1}, DType::Int64));
  if (id != OpId::index_select) c.input("index of another rank", 1, lifted(index));
  if (id != OpId::index_select && x.dim() > 1) {
    int64_t d = (dim_of(v) + 1) % x.dim();  // a dim other than `dim`
    Shape shape = index.shape();
    shape[static_cast<size_t>(d)] = x.shape()[static_cast<size_t>(d)] + 1;
    c.input("index larger than x outside dim", 1, filled(shape, DType::Int64));
  }
  if (id == OpId::scatter_add) {
    c.dtype("x and src dtypes differ", 2, x.dtype() == DType::Float64 ? DType::Float32 : DType::Float64);
    c.call("bool x and src", {as(x, DType::Bool), index, as(v.inputs[2], DType::Bool)}, v.attrs);
    Shape src = index.shape();
    for (int64_t& s : src) s = std::max<int64_t>(s - 1, 0);
    if (src != index.shape()) c.input("src smaller than index", 2, filled(src, x.dtype()));
  }
}

}  // namespace

std::optional<std::vector<Invalid>> invalid_cases(OpId id, const Case& v, Rng& rng) {
  Cases c(v, rng);
  const Tensor& x = v.inputs.empty() ? Tensor() : v.inputs[0];
  using enum OpId;
  switch (id) {
    case exp:
    case log:
    case sqrt:
    case rsqrt:
    case gelu:
    case gelu_tanh:
    case tanh:
    case sigmoid:
    case normal:
    case dropout:
      unary_float(c);
      if (id == normal) c.expanded_output();
      if (id == normal) c.attrs("negative std", with<NormalParams>(v.attrs, [](auto& a) { a.std = -1; }));
      if (id == dropout)
        for (double p : {-0.5, 1.5, std::nan("")})
          c.attrs("p outside [0, 1]", with<DropoutParams>(v.attrs, [&](auto& a) { a.p = p; }));
      return c.take();
    case neg:
    case abs:
    case relu:
    case pow_scalar:
    case clamp:
      c.dtype("bool input", 0, DType::Bool);
      if (id == clamp) {
        c.attrs("no bounds", with<ClampParams>(v.attrs, [](auto& a) { a.min = a.max = std::nullopt; }));
        c.call("a bound int64 cannot hold", {as(x, DType::Int64)},
               with<ClampParams>(v.attrs, [](auto& a) { a.min = -kInf; }));
        c.call("a bound int64 cannot hold", {as(x, DType::Int64)},
               with<ClampParams>(v.attrs, [](auto& a) { a.max = std::nan(""); }));
      }
      if (id == pow_scalar)
        for (double e : {-1.0, 0.5, kInf})
          c.call("int64 base with a negative or fractional exponent", {as(x, DType::Int64)},
                 with<PowParams>(v.attrs, [&](auto& a) { a.exponent = e; }));
      return c.take();
    case add:
    case sub:
    case mul:
    case div:
    case pow: binary(c, true); return c.take();
    case relu_backward:
    case gelu_backward:
    case gelu_tanh_backward:
      binary(c, true);
      c.call("int64 operands", {as(x, DType::Int64), as(v.inputs[1], DType::Int64)}, v.attrs);
      return c.take();
    case eq:
    case ne:
    case lt:
    case le:
    case gt:
    case ge: binary(c, false); return c.take();
    case logical_and:
    case logical_or: c.no_broadcast(0, 1); return c.take();
    case where:
      c.dtype("float condition", 0, DType::Float64).no_broadcast(1, 2);
      c.dtype("operand dtypes differ", 2, v.inputs[1].dtype() == DType::Float64 ? DType::Float32 : DType::Float64);
      return c.take();
    case masked_fill: {
      c.dtype("int64 mask", 1, DType::Int64);
      c.call("a value int64 cannot hold", {as(x, DType::Int64), v.inputs[1]},
             with<FillParams>(v.attrs, [](auto& a) { a.value = kInf; }));
      c.input("mask of higher rank", 1, lifted(filled(x.shape(), DType::Bool)));
      if (x.dim() > 0 && x.shape().back() > 0)
        c.input("mask of another size", 1, grown(filled(x.shape(), DType::Bool), x.dim() - 1));
      return c.take();
    }
    case logical_not:
    case cast:
    case copy: return c.take();  // any input is fine
    case fill:
      c.expanded_output();
      for (double value : {std::nan(""), kInf, 1e300})
        c.call("a value int64 cannot hold", {as(x, DType::Int64)},
               with<FillParams>(v.attrs, [&](auto& a) { a.value = value; }));
      return c.take();
    case to_device:
      if (!cuda::is_available())
        c.attrs("a CUDA target without a GPU", ToDeviceParams{.device = Device::cuda()});
      return c.take();
    case arange:
      c.expanded_output().input("2-d tensor", 0, filled({2, 2}, x.dtype())).dtype("bool tensor", 0, DType::Bool);
      c.attrs("step 0", with<ArangeParams>(v.attrs, [](auto& a) { a.step = 0; }));
      c.attrs("NaN start", with<ArangeParams>(v.attrs, [](auto& a) { a.start = std::nan(""); }));
      c.call("values past int64", {filled({3}, DType::Int64)}, ArangeParams{.start = 0, .step = 0x1p62});
      return c.take();
    case uniform:
      c.expanded_output().dtype("bool tensor", 0, DType::Bool);
      c.attrs("low above high", with<UniformParams>(v.attrs, [](auto& a) {
                a.low = 2;
                a.high = 1;
              }));
      c.attrs("an infinite bound", with<UniformParams>(v.attrs, [](auto& a) {
                a.low = 0;
                a.high = kInf;
              }));
      c.call("an empty integer range", {as(x, DType::Int64)},
             with<UniformParams>(v.attrs, [](auto& a) { a.low = a.high = 3; }));
      return c.take();
    case bernoulli:
      c.expanded_output();
      for (double p : {-0.1, 1.5, std::nan("")})
        c.attrs("p outside [0, 1]", with<BernoulliParams>(v.attrs, [&](auto& a) { a.p = p; }));
      return c.take();
    case sum: reduction<ReduceParams>(c, false, false); return c.take();
    case mean: reduction<ReduceParams>(c, true, false); return c.take();
    case var:
      reduction<VarParams>(c, true, false);
      c.attrs("negative correction", with<VarParams>(v.attrs, [](auto& a) { a.correction = -1; }));
      return c.take();
    case amax:
    case amin: reduction<ReduceParams>(c, false, true); return c.take();
    case max_dim:
    case min_dim:
    case argmax: along_dim(c); return c.take();
    case view:
      c.attrs("another element count", ShapeParams{.shape = {x.numel() + 1}});
      c.attrs("two -1", ShapeParams{.shape = {-1, -1, std::max<int64_t>(x.numel(), 1)}});
      c.attrs("a negative size", ShapeParams{.shape = {-2, -x.numel()}});
      c.attrs("sizes whose product overflows", ShapeParams{.shape = {kHuge, 8}});
      return c.take();
    case permute: {
      Shape order = std::get<PermuteParams>(v.attrs).dims;
      order.push_back(0);
      c.attrs("one entry too many", PermuteParams{.dims = order});
      if (x.dim() > 1) c.attrs("a repeated dim", PermuteParams{.dims = Shape(static_cast<size_t>(x.dim()), 0)});
      if (x.dim() > 0)
        c.attrs("dim out of range", with<PermuteParams>(v.attrs, [&](auto& a) { a.dims[0] = x.dim(); }));
      return c.take();
    }
    case slice:
      c.attrs("step 0", with<SliceParams>(v.attrs, [](auto& a) { a.step = 0; }));
      c.attrs("negative step", with<SliceParams>(v.attrs, [](auto& a) { a.step = -1; }));
      c.input("0-dim input", 0, filled({}, x.dtype())).bad_dim("dim out of range");
      return c.take();
    case select: {
      int64_t size = x.shape()[static_cast<size_t>(dim_of(v))];
      c.attrs("index past the end", with<SelectParams>(v.attrs, [&](auto& a) { a.index = size; }));
      c.attrs("index before the start", with<SelectParams>(v.attrs, [&](auto& a) { a.index = -size - 1; }));
      c.input("0-dim input", 0, filled({}, x.dtype())).bad_dim("dim out of range");
      return c.take();
    }
    case expand: {
      Shape shape = x.shape();
      if (!shape.empty()) c.attrs("fewer dims", ShapeParams{.shape = Shape(shape.begin() + 1, shape.end())});
      c.attrs("-1 for a new leading dim", ShapeParams{.shape = [&] {
                Shape s = shape;
                s.insert(s.begin(), -1);
                return s;
              }()});
      c.call("a negative size", {filled({1}, x.dtype())}, ShapeParams{.shape = {-2}});
      for (size_t d = 0; d < shape.size(); ++d)
        if (shape[d] > 1) {
          Shape target = shape;
          target[d] += 1;
          c.attrs("a size-n dim to another size", ShapeParams{.shape = target});
        }
      return c.take();
    }
    case cat: {
      c.call("no tensors", {}, v.attrs)
          .call("0-dim tensors", {filled({}, x.dtype()), filled({}, x.dtype())}, DimParams{.dim = 0});
      c.call("dtypes differ", {x, as(x, x.dtype() == DType::Int64 ? DType::Float64 : DType::Int64)}, v.attrs);
      c.call("ranks differ", {x, lifted(x)}, v.attrs).bad_dim("dim out of range");
      if (x.dim() > 1) {
        int64_t other = (dim_of(v) + 1) % x.dim();
        c.call("another dim differs", {x, grown(x, other)}, v.attrs);
      }
      return c.take();
    }
    case index_select:
    case gather:
    case scatter_add: index_ops(c, id); return c.take();
    case topk:
    case log_softmax_topk: {
      int64_t size = x.shape()[static_cast<size_t>(dim_of(v))];
      c.attrs("k larger than the dim", with<TopKParams>(v.attrs, [&](auto& a) { a.k = size + 1; }));
      c.attrs("negative k", with<TopKParams>(v.attrs, [](auto& a) { a.k = -1; }));
      c.dtype("bool input", 0, DType::Bool).input("0-dim input", 0, filled({}, x.dtype())).bad_dim("dim out of range");
      if (id == log_softmax_topk) c.dtype("int64 input", 0, DType::Int64);
      return c.take();
    }
    case sort:
      c.dtype("bool input", 0, DType::Bool).input("0-dim input", 0, filled({}, x.dtype())).bad_dim("dim out of range");
      return c.take();
    case cumsum: c.bad_dim("dim out of range"); return c.take();
    case randperm:
      c.expanded_output().input("2-d tensor", 0, filled({2, 2}, DType::Int64)).dtype("float tensor", 0, DType::Float64);
      return c.take();
    case multinomial: {
      int64_t categories = x.shape().back();
      c.input("3-d weights", 0, filled({1, 2, categories}, x.dtype())).input("0-dim weights", 0, filled({}, x.dtype()));
      c.dtype("int64 weights", 0, DType::Int64).input("no categories", 0, filled({2, 0}, x.dtype()));
      c.attrs("no samples", with<MultinomialParams>(v.attrs, [](auto& a) { a.num_samples = 0; }));
      c.attrs("more samples than categories, without replacement", with<MultinomialParams>(v.attrs, [&](auto& a) {
                a.num_samples = categories + 1;
                a.replacement = false;
              }));
      return c.take();
    }
    case one_hot:
      c.dtype("float indices", 0, DType::Float64);
      for (int64_t k : {int64_t{0}, int64_t{-3}}) c.attrs("num_classes <= 0", OneHotParams{.num_classes = k});
      c.input("index >= num_classes", 0,
              filled({2}, DType::Int64, static_cast<double>(std::get<OneHotParams>(v.attrs).num_classes)));
      c.input("negative index", 0, filled({2}, DType::Int64, -1));
      c.call("output too large", {filled({4}, DType::Int64, 1)}, OneHotParams{.num_classes = kHuge});
      return c.take();
    case tril:
    case triu:
      c.input("1-d input", 0, filled({3}, x.dtype())).input("0-dim input", 0, filled({}, x.dtype()));
      return c.take();
    case matmul: {
      const Tensor& b = v.inputs[1];
      c.input("1-d operand", 0, filled({x.shape().back()}, x.dtype()));
      c.input("inner sizes differ", 1, grown(b, b.dim() - 2)).dtype("dtypes differ", 1, other_float(b.dtype()));
      c.call("int64 operands", {as(x, DType::Int64), as(b, DType::Int64)}, v.attrs);
      c.call("batches that do not broadcast", {filled({2, 1, 1}, x.dtype()), filled({3, 1, 1}, x.dtype())}, v.attrs);
      return c.take();
    }
    case linear:
    case linear_relu: {
      const Tensor &weight = v.inputs[1], &bias = v.inputs[2];
      c.input("0-dim input", 0, filled({}, x.dtype())).input("weight of another in-size", 1, grown(weight, 1));
      c.input("1-d weight", 1, filled({x.shape().back()}, x.dtype())).input("bias of another size", 2, grown(bias, 0));
      c.dtype("dtypes differ", 2, other_float(bias.dtype()));
      c.call("int64 operands", {as(x, DType::Int64), as(weight, DType::Int64), as(bias, DType::Int64)}, v.attrs);
      return c.take();
    }
    case linear_int8: {
      const Tensor &values = v.inputs[1], &scales = v.inputs[2];
      c.input("0-dim input", 0, filled({}, x.dtype())).input("values of another in-size", 1, grown(values, 1));
      c.input("1-d values", 1, filled({x.shape().back()}, DType::Int8)).input("scales of another size", 2, grown(scales, 0));
      c.dtype("float64 input", 0, DType::Float64).dtype("float32 values", 1, DType::Float32);
      c.dtype("float64 bias", 3, DType::Float64);
      return c.take();
    }
    case softmax:
    case log_softmax: c.dtype("int64 input", 0, DType::Int64).bad_dim("dim out of range"); return c.take();
    case layer_norm: {
      c.attrs("normalized_shape not at the end",
              with<LayerNormParams>(v.attrs, [](auto& a) { a.normalized_shape.back() += 1; }));
      c.attrs("empty normalized_shape", with<LayerNormParams>(v.attrs, [](auto& a) { a.normalized_shape = {}; }));
      c.attrs("negative eps", with<LayerNormParams>(v.attrs, [](auto& a) { a.eps = -1; }));
      c.input("weight of another shape", 1, lifted(v.inputs[1]))
          .dtype("bias of another dtype", 2, other_float(x.dtype()));
      c.call("int64 input", {as(x, DType::Int64), as(v.inputs[1], DType::Int64), as(v.inputs[2], DType::Int64)},
             v.attrs);
      return c.take();
    }
    case layer_norm_backward:
      c.input("mean of another shape", 2, lifted(v.inputs[2]))
          .dtype("dout of another dtype", 0, other_float(x.dtype()));
      c.input("weight of another shape", 4, lifted(v.inputs[4]))
          .input("drstd of another shape", 6, lifted(v.inputs[6]));
      return c.take();
    case embedding: {
      int64_t rows = x.shape()[0];
      c.input("1-d weight", 0, filled({rows}, x.dtype()))
          .input("3-d weight", 0, lifted(x))
          .dtype("int64 weight", 0, DType::Int64);
      c.dtype("float indices", 1, DType::Float64);
      c.input("index >= rows", 1, filled({2}, DType::Int64, static_cast<double>(rows)))
          .input("negative index", 1, filled({2}, DType::Int64, -1));
      return c.take();
    }
    case embedding_backward:
      c.input("dout of another shape", 0, lifted(x)).dtype("int64 dout", 0, DType::Int64);
      c.attrs("negative row count", with<EmbeddingBackwardParams>(v.attrs, [](auto& a) {
                a.num_embeddings = -1;
                a.padding_idx = -2;
              }));
      c.attrs("padding index past the rows",
              with<EmbeddingBackwardParams>(v.attrs, [](auto& a) { a.padding_idx = a.num_embeddings; }));
      if (auto rows = static_cast<double>(std::get<EmbeddingBackwardParams>(v.attrs).num_embeddings);
          v.inputs[1].numel() > 0)
        c.input("index >= rows", 1, filled(v.inputs[1].shape(), DType::Int64, rows));
      else
        c.call("index >= rows", {filled({2, 1}, x.dtype()), filled({2}, DType::Int64, rows)}, v.attrs);
      return c.take();
    case cross_entropy:
    case cross_entropy_backward: {
      size_t l = id == cross_entropy ? 0 : 1;  // position of the logits
      const Tensor& logits = v.inputs[l];
      int64_t rows = logits.shape()[0], classes = logits.shape()[1];
      c.input("1-d logits", l, filled({classes}, logits.dtype())).input("3-d logits", l, lifted(logits));
      c.input("no classes", l, filled({rows, 0}, logits.dtype())).dtype("int64 logits", l, DType::Int64);
      c.input("target of another length", l + 1, filled({rows + 1}, DType::Int64))
          .dtype("float target", l + 1, DType::Float64);
      int64_t ignore_index = std::get<CrossEntropyParams>(v.attrs).ignore_index;
      double past = static_cast<double>(classes == ignore_index ? classes + 1 : classes);
      c.call(
          "target past the classes",
          [&] {
            std::vector<Tensor> in = v.inputs;
            in[l] = filled({2, classes}, logits.dtype());
            in[l + 1] = filled({2}, DType::Int64, past);
            if (l == 1) in[0] = in[3] = in[4] = filled({2}, logits.dtype());
            return in;
          }(),
          v.attrs);
      for (double e : {-0.1, 1.5})
        c.attrs("label_smoothing outside [0, 1]",
                with<CrossEntropyParams>(v.attrs, [&](auto& a) { a.label_smoothing = e; }));
      if (l == 1) {
        c.input("dloss of another length", 0, filled({rows + 1}, logits.dtype()))
            .dtype("dloss of another dtype", 0, other_float(logits.dtype()));
        c.input("lse of another length", 3, filled({rows + 1}, logits.dtype()))
            .dtype("dlse of another dtype", 4, other_float(logits.dtype()));
      }
      return c.take();
    }
    case attention:
    case attention_backward: {
      size_t q = id == attention ? 0 : 2;  // position of q; k and v follow
      const Tensor& key = v.inputs[q + 1];
      // Operands changed together (inputs first..q + 2), so that each case breaks its own rule and not
      // the agreement of k and v that is checked first.
      auto changed = [&](size_t first, const std::function<Tensor(const Tensor&)>& change) {
        std::vector<Tensor> in = v.inputs;
        for (size_t k = first; k < q + 3; ++k) in[k] = change(in[k]);
        return in;
      };
      auto without_head_dim = [](const Tensor& t) {
        Shape shape = t.shape();
        shape[3] = 0;
        return filled(shape, t.dtype());
      };
      c.input("3-d q", q, filled({2, 3, 4}, x.dtype()));
      c.input("v of another length", q + 2, grown(key, 2)).dtype("v of another dtype", q + 2, other_float(x.dtype()));
      c.call("k and v of another head dim", changed(q + 1, [](const Tensor& t) { return grown(t, 3); }), v.attrs);
      c.call("k and v of another batch", changed(q + 1, [](const Tensor& t) { return grown(t, 0); }), v.attrs);
      c.call("no head dim", changed(q, without_head_dim), v.attrs);
      c.call("int64 operands", changed(q, [](const Tensor& t) { return as(t, DType::Int64); }), v.attrs);
      if (id == attention) {
        c.input("mask that does not broadcast", 3, filled({1, 1, 1, key.size(2) + 2}, x.dtype()))
            .input("5-d mask", 3, filled({1, 1, 1, 1, 1}, x.dtype()))
            .dtype("mask of another dtype", 3, other_float(x.dtype()));
        for (double p : {-0.1, 1.5})
          c.attrs("p outside [0, 1]", with<DropoutParams>(v.attrs, [&](auto& a) { a.p = p; }));
      } else {
        c.input("dout of another shape", 0, grown(v.inputs[0], 1))
            .input("weights of another shape", 5, lifted(v.inputs[5]));
        c.input("dweights of another shape", 1, grown(v.inputs[5], 3));
      }
      return c.take();
    }
  }
  return std::nullopt;  // an op this suite does not know yet
}

}  // namespace mf::props
