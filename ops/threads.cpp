#include "core/parallel.h"
#include "ops/functional.h"

namespace mf {

// OpenBLAS itself stays single-threaded (ops/matmul.cpp): the pool splits GEMMs across threads.
void set_num_threads(int n) { set_intra_op_threads(n); }

int get_num_threads() { return intra_op_threads(); }

}  // namespace mf
