// Linked in builds without CUDA: no GPU, no kernels, and ops asked to run on CUDA say so by name.
#include "cuda/cuda.h"
#include "ops/kernel_api.h"

namespace mf {

void register_cuda_kernels(Registry&) {}

namespace cuda {
bool is_available() { return false; }
int device_count() { return 0; }
bool is_built() { return false; }
void synchronize(int) {}
}  // namespace cuda

}  // namespace mf
