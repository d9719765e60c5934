#include "core/parallel.h"
#include "ops/ops.h"

#include <cblas.h>

namespace mf {

void set_num_threads(int n) {
  set_intra_op_threads(n);
  openblas_set_num_threads(n);
}

int get_num_threads() { return intra_op_threads(); }

}  // namespace mf
