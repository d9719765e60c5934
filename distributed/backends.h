// The backends' factories, for init_process_group (not installed). Each is defined only in a build
// that has its backend (meson's -Ddistributed option); process_group.cpp checks that before calling.
#pragma once

#include "distributed/process_group.h"

#include <memory>

namespace mf::distributed::detail {

/// MPI_COMM_WORLD, initialising MPI when nothing has yet.
std::shared_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);

/// Makes an NCCL communicator over the ranks of MPI_COMM_WORLD, one GPU per rank. The NCCL group lives
/// in the CUDA backend (libminiflow_cuda.so, which links the CUDA runtime it needs) and sets this when
/// the backend is loaded; null until then, and in builds without NCCL.
extern std::shared_ptr<ProcessGroup> (*make_nccl_process_group)(const ProcessGroupOptions& options);

}  // namespace mf::distributed::detail
