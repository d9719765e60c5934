// The backends' factories, for init_process_group (not installed). Each is defined only in a build
// that has its backend (meson's -Ddistributed option); process_group.cpp checks that before calling.
#pragma once

#include "distributed/process_group.h"

#include <memory>

namespace mf::distributed::detail {

/// MPI_COMM_WORLD, initialising MPI when nothing has yet.
std::shared_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);

/// An NCCL communicator over the ranks of MPI_COMM_WORLD, on the current CUDA device.
std::shared_ptr<ProcessGroup> make_nccl_process_group(const ProcessGroupOptions& options);

}  // namespace mf::distributed::detail
