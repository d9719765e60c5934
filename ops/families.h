// One registration function per op family; dispatch.cpp calls each once to build the registry, then
// register_cross_device_copy (ops/kernel_api.h).
#pragma once

#include "ops/registry.h"

namespace mf {

void register_elementwise_ops(Registry& registry);  // ops/elementwise.cpp
void register_fill_ops(Registry& registry);         // ops/fill.cpp
void register_reduction_ops(Registry& registry);    // ops/reduce.cpp
void register_view_ops(Registry& registry);         // ops/views.cpp
void register_index_ops(Registry& registry);        // ops/index.cpp
void register_linalg_ops(Registry& registry);       // ops/matmul.cpp
void register_softmax_ops(Registry& registry);      // ops/softmax.cpp
void register_nn_ops(Registry& registry);           // ops/nn_ops.cpp
void register_loss_ops(Registry& registry);         // ops/cross_entropy.cpp
void register_attention_ops(Registry& registry);    // ops/attention.cpp
void register_quantized_ops(Registry& registry);    // ops/quantized.cpp

}  // namespace mf
