// The backends' factories, for init_process_group (not installed). Each is defined only in a build
// that has its backend (meson's -Ddistributed option); process_group.cpp checks that before calling.
#pragma once

#include "distributed/process_group.h"

#include <cstdint>
#include <memory>
#include <string>

namespace mf::distributed::detail {

/// The MPI group, with what an NCCL group it started needs of it. A rank whose NCCL collective timed
/// out cannot ask NCCL which ranks are missing, so each rank's MPI thread, idle while NCCL works, also
/// answers how far this rank's NCCL collectives have got.
class MpiProcessGroupBase : public ProcessGroup {
 public:
  /// This rank has launched collective `sequence` of its NCCL group (called in launch order).
  virtual void note_nccl_launch(uint64_t sequence) = 0;
  /// Asks the other ranks how far they have launched their NCCL collectives and says, for a timeout's
  /// error, which of them have not reached collective `sequence` ("rank 1 has not reached it ...").
  virtual std::string nccl_ranks_missing(uint64_t sequence) = 0;

 protected:
  using ProcessGroup::ProcessGroup;
};

/// MPI_COMM_WORLD, initialising MPI when nothing has yet.
std::shared_ptr<MpiProcessGroupBase> make_mpi_process_group(const ProcessGroupOptions& options);

/// Makes an NCCL communicator over the ranks of MPI_COMM_WORLD, one GPU per rank. The NCCL group lives
/// in the CUDA backend (libminiflow_cuda.so, which links the CUDA runtime it needs) and sets this when
/// the backend is loaded; null until then, and in builds without NCCL.
extern std::shared_ptr<ProcessGroup> (*make_nccl_process_group)(const ProcessGroupOptions& options);

}  // namespace mf::distributed::detail
