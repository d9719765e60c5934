#include "core/tensor.h"

#include "core/graph.h"

#include <atomic>
#include <limits>

namespace mf {

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage(std::move(storage)), shape(std::move(shape)), strides(std::move(strides)), offset(offset), dtype(dtype) {}

TensorImpl::~TensorImpl() = default;

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  // Checked: a product that wrapped around would allocate too little for the shape.
  int64_t numel = checked_numel(shape, static_cast<int64_t>(dtype_size(dtype)));
  Shape strides = contiguous_strides(shape);  // cannot overflow: checked_numel bounds zeros-as-ones too
  size_t nbytes = static_cast<size_t>(numel) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, std::move(strides), 0, dtype));
}

TensorImpl& Tensor::impl() const {
  MF_CHECK(impl_ != nullptr, "tensor is undefined (default-constructed or moved from)");
  return *impl_;
}

int64_t Tensor::size(int64_t dim) const { return shape()[normalize_dim(dim, this->dim())]; }
int64_t Tensor::stride(int64_t dim) const { return strides()[normalize_dim(dim, this->dim())]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;  // a size-1 dim's stride never matters
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(storage()->data()) + offset() * static_cast<int64_t>(element_size());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<T> out;
  out.reserve(static_cast<size_t>(host.numel()));
  visit_any_dtype(host.dtype(), [&]<typename S>() {
    const S* base = static_cast<const S*>(host.raw_data());
    Shape index(host.shape().size(), 0);
    for (int64_t n = 0; n < host.numel(); ++n) {
      int64_t position = 0;
      for (size_t d = 0; d < index.size(); ++d) position += index[d] * host.strides()[d];
      out.push_back(convert<T>(base[position]));
      for (size_t d = index.size(); d-- > 0;) {
        if (++index[d] < host.shape()[d]) break;
        index[d] = 0;
      }
    }
  });
  return out;
}

template <typename T>
T Tensor::item() const {
  MF_CHECK(numel() == 1, "item: tensor of shape {} has {} elements, expected 1", shape_str(shape()), numel());
  return to_vector<T>()[0];
}

template <typename T>
T Tensor::at(const Shape& index) const {
  MF_CHECK(index.size() == shape().size(), "at: index has {} entries for a tensor of shape {}", index.size(),
           shape_str(shape()));
  int64_t position = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    MF_CHECK(index[d] >= 0 && index[d] < shape()[d], "at: index {} is out of bounds for shape {}",
             shape_str(index), shape_str(shape()));
    position += index[d] * strides()[d];
  }
  Tensor element(std::make_shared<TensorImpl>(storage(), Shape{}, Shape{}, offset() + position, dtype()));
  return element.item<T>();
}

#define MF_INSTANTIATE_ACCESS(T)                        \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;                   \
  template T Tensor::at<T>(const Shape&) const;
MF_INSTANTIATE_ACCESS(float)
MF_INSTANTIATE_ACCESS(double)
MF_INSTANTIATE_ACCESS(int64_t)
MF_INSTANTIATE_ACCESS(bool)
MF_INSTANTIATE_ACCESS(bfloat16)
MF_INSTANTIATE_ACCESS(int8_t)
MF_INSTANTIATE_ACCESS(int)
#undef MF_INSTANTIATE_ACCESS

// ---- autograd slot ----------------------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  auto& slot = impl().autograd;
  if (!slot) slot = std::make_unique<AutogradMeta>();
  return *slot;
}

bool Tensor::requires_grad() const { return impl().autograd && impl().autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  MF_CHECK(!requires_grad || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got {}",
           dtype_name(dtype()));
  MF_CHECK(is_leaf(), "set_requires_grad: only leaves can change requires_grad; use detach() for a non-leaf");
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const { return impl().autograd ? impl().autograd->grad : Tensor(); }

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined())
    MF_CHECK(grad.shape() == shape() && grad.dtype() == dtype(),
             "set_grad: gradient {} {} does not match tensor {} {}", shape_str(grad.shape()), dtype_name(grad.dtype()),
             shape_str(shape()), dtype_name(dtype()));
  autograd_meta().grad = grad;
}

std::shared_ptr<Node> Tensor::grad_fn() const { return impl().autograd ? impl().autograd->grad_fn : nullptr; }

Tensor Tensor::detach() const {
  const TensorImpl& self = impl();
  return Tensor(std::make_shared<TensorImpl>(self.storage, self.shape, self.strides, self.offset, self.dtype));
}

void Tensor::set_data(const Tensor& source) {
  MF_CHECK(is_leaf(), "set_data: only leaves can change their data (shape {})", shape_str(shape()));
  MF_CHECK(!requires_grad() || is_floating(source.dtype()), "set_data: a tensor that requires grad cannot take {} data",
           dtype_name(source.dtype()));
  TensorImpl& self = impl();
  const TensorImpl& from = source.impl();
  self.storage = from.storage;
  self.shape = from.shape;
  self.strides = from.strides;
  self.offset = from.offset;
  self.dtype = from.dtype;
  if (self.autograd && self.autograd->grad.defined() &&
      (self.autograd->grad.dtype() != self.dtype || self.autograd->grad.device() != self.storage->device()))
    self.autograd->grad = Tensor();  // a gradient of another dtype or device no longer fits
}

uint64_t next_sequence_nr() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

namespace {
thread_local bool grad_mode = true;
}
bool grad_mode_enabled() { return grad_mode; }
void set_grad_mode(bool enabled) { grad_mode = enabled; }

namespace autograd {
namespace {
std::atomic<bool> anomaly_mode{false};
thread_local int backward_depth = 0;
}  // namespace
bool is_anomaly_enabled() { return anomaly_mode.load(std::memory_order_relaxed); }
void set_detect_anomaly(bool enabled) { anomaly_mode.store(enabled, std::memory_order_relaxed); }
BackwardScope::BackwardScope() { ++backward_depth; }
BackwardScope::~BackwardScope() { --backward_depth; }
bool BackwardScope::active() { return backward_depth > 0; }
}  // namespace autograd

}  // namespace mf
