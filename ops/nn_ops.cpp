// (being written)
#include "ops/families.h"

namespace mf {

void register_nn_ops(Registry&) {}

}  // namespace mf
