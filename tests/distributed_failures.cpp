// A job whose rank 1 fails in the way argv[1] names, for distributed_failures.sh: the other ranks must
// end, non-zero, within the timeout (argv[2] seconds) with an error naming the collective, and leave
// no process behind.
//   stall: rank 1 sleeps instead of joining the second all_reduce (a deadlock, a rank stuck elsewhere)
//   kill:  rank 1 kills itself with SIGKILL before it
//   error: rank 1 meets an error the others cannot see, and ends the job (ProcessGroup::abort_job)
#include "distributed/process_group.h"
#include "ops/functional.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

using namespace mf;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: distributed_failures stall|kill|error TIMEOUT_SECONDS\n");
    return 2;
  }
  const std::string scenario = argv[1];
  auto group = distributed::init_process_group(distributed::Backend::Mpi,
                                               {.timeout = std::chrono::milliseconds(std::stoi(argv[2]) * 1000)});
  Tensor t = ones({4});
  group->all_reduce(t);  // #1: every rank is there
  std::printf("rank %d: first all_reduce done\n", group->rank());
  std::fflush(stdout);
  if (group->rank() == 1) {
    if (scenario == "stall") std::this_thread::sleep_for(std::chrono::seconds(600));
    if (scenario == "kill") std::raise(SIGKILL);
    if (scenario == "error") {
      std::fprintf(stderr, "[rank 1] distributed_failures: a made-up error\n");
      group->abort_job(3);
    }
  }
  group->all_reduce(t);  // #2: rank 1 never comes
  std::printf("rank %d: second all_reduce done (should not happen)\n", group->rank());
  return 0;
}
