// (being written)
#include "ops/families.h"

namespace mf {

void register_index_ops(Registry&) {}

}  // namespace mf
