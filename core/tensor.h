// Tensor: a view (shape, strides, offset, dtype) of shared Storage, plus an optional autograd slot.
//
// Tensor is a cheap handle: copies share the same tensor, as torch::Tensor does. Methods that compute
// (add, sum, view, ...) are declared here for convenience and implemented by the ops layer, which
// records them for autograd. Every such method takes a defaulted std::source_location, so errors and
// autograd nodes name the line of the user's code that called it.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

#include <memory>
#include <optional>
#include <source_location>
#include <tuple>
#include <vector>

namespace mf {

using Site = std::source_location;

class Tensor;
struct IndexAt;
struct AutogradMeta;
struct Node;

/// What a Tensor handle points to. Views make new TensorImpls over the same Storage.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  std::unique_ptr<AutogradMeta> autograd;  // null for tensors autograd never touched

  TensorImpl(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);
  ~TensorImpl();
};

class Tensor {
 public:
  /// An undefined tensor (defined() is false), like a default torch::Tensor.
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());

  // ---- metadata -------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& sizes() const { return impl().shape; }
  /// Size of one dim (negative counts from the end).
  int64_t size(int64_t dim) const;
  const Shape& strides() const { return impl().strides; }
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t offset() const { return impl().offset; }
  size_t element_size() const { return dtype_size(impl().dtype); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  /// True when both handles view the same bytes of the same storage.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  /// Pointer to the first element; T must match dtype().
  template <typename T>
  T* data_ptr() const {
    MF_CHECK(dtype_v<T> == dtype(), "data_ptr: tensor has dtype {}, asked for {}", dtype_name(dtype()),
             dtype_name(dtype_v<T>));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // ---- element access (copies from the device when needed) ------------------------------------
  /// The single value of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  /// The element at a full index, converted to T.
  template <typename T>
  T at(const Shape& index) const;
  /// All elements in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- autograd -------------------------------------------------------------------------------
  bool requires_grad() const;
  /// Marks a leaf as needing .grad (float tensors only). Returns *this for chaining.
  Tensor& set_requires_grad(bool requires_grad = true);
  /// Accumulated gradient of a leaf (undefined until a backward reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  /// The node that produced this tensor, null for leaves.
  std::shared_ptr<Node> grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  /// Runs backpropagation from this tensor. A non-scalar needs an explicit `gradient` of its shape.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  /// Same data, cut from the graph.
  Tensor detach() const;
  /// Makes this tensor (every handle to it) view `source`'s data instead, keeping its autograd slot:
  /// how modules move parameters between devices and dtypes in place. Not recorded by autograd.
  void set_data(const Tensor& source);
  AutogradMeta& autograd_meta() const;  // creates the slot on first use

  // ---- views (share storage) ------------------------------------------------------------------
  Tensor view(const Shape& shape, Site site = Site::current()) const;
  /// view when strides allow it, otherwise a copy.
  Tensor reshape(const Shape& shape, Site site = Site::current()) const;
  Tensor transpose(int64_t dim0, int64_t dim1, Site site = Site::current()) const;
  /// Transpose of a 2-D tensor.
  Tensor t(Site site = Site::current()) const;
  Tensor permute(const Shape& dims, Site site = Site::current()) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length, Site site = Site::current()) const;
  /// Elements start, start+step, ... below end of one dim (negative start/end count from the end).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1, Site site = Site::current()) const;
  /// Removes `dim` by picking one index.
  Tensor select(int64_t dim, int64_t index, Site site = Site::current()) const;
  /// x[i]: select(0, i), a view, as PyTorch's indexing with one integer (negative counts from the
  /// end); x[i][j] picks along the first two dims.
  Tensor operator[](IndexAt index) const;
  Tensor expand(const Shape& shape, Site site = Site::current()) const;
  /// Removes every size-1 dim, or just `dim`.
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt, Site site = Site::current()) const;
  Tensor unsqueeze(int64_t dim, Site site = Site::current()) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1, Site site = Site::current()) const;
  /// This tensor if already contiguous, else a contiguous copy.
  Tensor contiguous(Site site = Site::current()) const;

  // ---- copies and conversions -----------------------------------------------------------------
  Tensor clone(Site site = Site::current()) const;
  Tensor to(DType dtype, Site site = Site::current()) const;
  Tensor to(Device device, Site site = Site::current()) const;

  // ---- arithmetic (broadcasting) --------------------------------------------------------------
  Tensor add(const Tensor& other, Site site = Site::current()) const;
  Tensor sub(const Tensor& other, Site site = Site::current()) const;
  Tensor mul(const Tensor& other, Site site = Site::current()) const;
  Tensor div(const Tensor& other, Site site = Site::current()) const;
  Tensor add(double other, Site site = Site::current()) const;
  Tensor sub(double other, Site site = Site::current()) const;
  Tensor mul(double other, Site site = Site::current()) const;
  Tensor div(double other, Site site = Site::current()) const;
  Tensor pow(double exponent, Site site = Site::current()) const;
  Tensor pow(const Tensor& exponent, Site site = Site::current()) const;
  Tensor neg(Site site = Site::current()) const;
  Tensor abs(Site site = Site::current()) const;
  Tensor exp(Site site = Site::current()) const;
  Tensor log(Site site = Site::current()) const;
  Tensor sqrt(Site site = Site::current()) const;
  Tensor rsqrt(Site site = Site::current()) const;
  Tensor relu(Site site = Site::current()) const;
  /// approximate: "none" (x Phi(x)) or "tanh", as torch.nn.functional.gelu.
  Tensor gelu(std::string_view approximate = "none", Site site = Site::current()) const;
  Tensor tanh(Site site = Site::current()) const;
  Tensor sigmoid(Site site = Site::current()) const;
  Tensor clamp(std::optional<double> min, std::optional<double> max, Site site = Site::current()) const;
  /// Copy with `value` where mask (bool, broadcast to this shape) is true.
  Tensor masked_fill(const Tensor& mask, double value, Site site = Site::current()) const;

  // ---- comparisons and logic (results are bool) -----------------------------------------------
  Tensor eq(const Tensor& other, Site site = Site::current()) const;
  Tensor ne(const Tensor& other, Site site = Site::current()) const;
  Tensor lt(const Tensor& other, Site site = Site::current()) const;
  Tensor le(const Tensor& other, Site site = Site::current()) const;
  Tensor gt(const Tensor& other, Site site = Site::current()) const;
  Tensor ge(const Tensor& other, Site site = Site::current()) const;
  Tensor eq(double other, Site site = Site::current()) const;
  Tensor ne(double other, Site site = Site::current()) const;
  Tensor lt(double other, Site site = Site::current()) const;
  Tensor le(double other, Site site = Site::current()) const;
  Tensor gt(double other, Site site = Site::current()) const;
  Tensor ge(double other, Site site = Site::current()) const;
  Tensor logical_not(Site site = Site::current()) const;
  Tensor logical_and(const Tensor& other, Site site = Site::current()) const;
  Tensor logical_or(const Tensor& other, Site site = Site::current()) const;

  // ---- reductions (dims empty = all dims) -----------------------------------------------------
  Tensor sum(const Shape& dims = {}, bool keepdim = false, Site site = Site::current()) const;
  Tensor mean(const Shape& dims = {}, bool keepdim = false, Site site = Site::current()) const;
  /// Variance with Bessel's correction by default (correction = 1), as torch.var.
  Tensor var(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false,
             Site site = Site::current()) const;
  /// Largest element overall.
  Tensor max(Site site = Site::current()) const;
  Tensor min(Site site = Site::current()) const;
  /// Largest values along `dim` and their indices (int64).
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false, Site site = Site::current()) const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false, Site site = Site::current()) const;
  Tensor argmax(int64_t dim, bool keepdim = false, Site site = Site::current()) const;
  /// Running sums along `dim` (mf::cumsum).
  Tensor cumsum(int64_t dim, Site site = Site::current()) const;
  /// Sorted along `dim`, stably, and the positions the values came from (mf::sort).
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false, Site site = Site::current()) const;
  Tensor argsort(int64_t dim = -1, bool descending = false, Site site = Site::current()) const;

  // ---- linear algebra and fused ops -----------------------------------------------------------
  Tensor matmul(const Tensor& other, Site site = Site::current()) const;
  Tensor softmax(int64_t dim, Site site = Site::current()) const;
  Tensor log_softmax(int64_t dim, Site site = Site::current()) const;

  // ---- in place (bump the storage version; not recorded by autograd) --------------------------
  Tensor& add_(const Tensor& other, Site site = Site::current());
  Tensor& add_(double other, Site site = Site::current());
  Tensor& sub_(const Tensor& other, Site site = Site::current());
  Tensor& sub_(double other, Site site = Site::current());
  Tensor& mul_(const Tensor& other, Site site = Site::current());
  Tensor& mul_(double other, Site site = Site::current());
  Tensor& div_(const Tensor& other, Site site = Site::current());
  Tensor& div_(double other, Site site = Site::current());
  Tensor& zero_(Site site = Site::current());
  Tensor& fill_(double value, Site site = Site::current());
  /// Copies `src` (broadcast to this shape, any dtype/device) into this tensor.
  Tensor& copy_(const Tensor& src, Site site = Site::current());
  Tensor& masked_fill_(const Tensor& mask, double value, Site site = Site::current());

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Carries a tensor together with the call site of the expression it appears in, so that operators
/// (which cannot take a defaulted location) still report the user's line.
struct At {
  const Tensor& tensor;
  Site site;
  At(const Tensor& tensor, Site site = Site::current()) : tensor(tensor), site(site) {}  // NOLINT: implicit on purpose
};

Tensor operator+(At a, const Tensor& b);
Tensor operator-(At a, const Tensor& b);
Tensor operator*(At a, const Tensor& b);
Tensor operator/(At a, const Tensor& b);
Tensor operator+(At a, double b);
Tensor operator-(At a, double b);
Tensor operator*(At a, double b);
Tensor operator/(At a, double b);
Tensor operator+(double a, At b);
Tensor operator-(double a, At b);
Tensor operator*(double a, At b);
Tensor operator/(double a, At b);
Tensor operator-(At a);

// Comparisons give bool tensors, as in PyTorch (== and != are eq / ne: Tensor keeps its identity
// comparisons out of the way of containers).
Tensor operator<(At a, const Tensor& b);
Tensor operator<=(At a, const Tensor& b);
Tensor operator>(At a, const Tensor& b);
Tensor operator>=(At a, const Tensor& b);
Tensor operator<(At a, double b);
Tensor operator<=(At a, double b);
Tensor operator>(At a, double b);
Tensor operator>=(At a, double b);

/// The tensor an in-place operator writes, with the call site of the expression: a named tensor or a
/// temporary view of one (x[0] += 1), which lives to the end of the expression.
struct InPlaceAt {
  Tensor& tensor;
  Site site;
  InPlaceAt(Tensor& tensor, Site site = Site::current()) : tensor(tensor), site(site) {}  // NOLINT: implicit on purpose
  InPlaceAt(Tensor&& tensor, Site site = Site::current()) : tensor(tensor), site(site) {}  // NOLINT: implicit on purpose
};

/// x += y and the like write into x's storage (add_, sub_, mul_, div_): every view of it sees the
/// change, and a tensor that requires grad refuses them outside NoGradGuard, as PyTorch's leaves do.
Tensor& operator+=(InPlaceAt a, const Tensor& b);
Tensor& operator-=(InPlaceAt a, const Tensor& b);
Tensor& operator*=(InPlaceAt a, const Tensor& b);
Tensor& operator/=(InPlaceAt a, const Tensor& b);
Tensor& operator+=(InPlaceAt a, double b);
Tensor& operator-=(InPlaceAt a, double b);
Tensor& operator*=(InPlaceAt a, double b);
Tensor& operator/=(InPlaceAt a, double b);

/// An index with the call site of the expression it appears in (for Tensor::operator[]).
struct IndexAt {
  int64_t index;
  Site site;
  IndexAt(int64_t index, Site site = Site::current()) : index(index), site(site) {}  // NOLINT: implicit on purpose
};

}  // namespace mf
