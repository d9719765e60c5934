#include "ops/layout.h"

namespace mf {

Shape byte_strides_for(const Tensor& t, const Shape& shape) {
  Shape strides = broadcast_strides(t.shape(), t.strides(), shape);
  for (int64_t& stride : strides) stride *= static_cast<int64_t>(t.element_size());
  return strides;
}

}  // namespace mf
