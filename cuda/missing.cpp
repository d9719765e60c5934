// cuda::missing_ops, the same in builds with and without CUDA: it reads the registry's CUDA slots.
#include "cuda/cuda.h"
#include "ops/registry.h"

namespace mf::cuda {

std::vector<std::string> missing_ops() {
  std::vector<std::string> names;
  for (size_t i = 0; i < kOpCount; ++i) {
    const OpDef& def = registry()[static_cast<OpId>(i)];
    if (!def.runs_on(DeviceType::CUDA)) names.emplace_back(def.name);
  }
  return names;
}

}  // namespace mf::cuda
