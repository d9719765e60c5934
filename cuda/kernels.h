// One registration function per CUDA op family (one .cu file each); the backend's register_kernels
// (runtime.cpp) calls them all when cuda/loader.cpp loads it. Each sets the CUDA slot of the ops it
// implements.
#pragma once

#include "ops/registry.h"

namespace mf::cuda {

void register_elementwise(Registry& registry);  // cuda/elementwise.cu
void register_fill(Registry& registry);         // cuda/fill.cu
void register_reduce(Registry& registry);       // cuda/reduce.cu
void register_matmul(Registry& registry);       // cuda/matmul.cu
void register_softmax(Registry& registry);      // cuda/softmax.cu
void register_nn(Registry& registry);           // cuda/nn.cu
void register_loss(Registry& registry);         // cuda/cross_entropy.cu
void register_index(Registry& registry);        // cuda/index.cu

}  // namespace mf::cuda
