// The MPI backend. One thread per process makes every MPI call after initialisation (so MPI needs only
// MPI_THREAD_SERIALIZED), taking collectives in the order they were issued: the training thread goes
// on with backward while a gradient bucket is being reduced. The thread starts each collective
// non-blocking and polls it, sleeping between polls so that it leaves the core to the computation,
// and ends the job when one passes the timeout.
//
// To name the ranks that did not arrive, a rank whose collective timed out asks every other rank,
// on a communicator of its own, where it is; a rank's MPI thread answers while it waits in a
// collective and while it is idle, so the ranks that do not answer are the ones that are gone
// (or whose MPI thread is stuck). The same questions name the ranks missing from a timed-out
// collective of an NCCL group started over this one: the MPI thread answers with the last NCCL
// collective this rank launched.
#include "distributed/backends.h"

#include "core/error.h"
#include "core/parallel.h"
#include "core/profiler.h"
#include "ops/functional.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace mf::distributed::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAskTag = 1;      // where are you in this group's collectives? (payload: the asker's sequence number)
constexpr int kReplyTag = 2;    // payload: Status
constexpr int kAskNcclTag = 3;  // how far are your NCCL collectives? (same payload and reply)

/// Where a rank is, as it answers a peer whose collective timed out.
struct Status {
  int64_t in_collective = 0;   // 1 while it waits in one
  int64_t sequence = 0;        // that collective's number, else the last it finished
  int64_t kind = 0;            // Collective::Kind of that collective
};

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::Bool: return MPI_C_BOOL;
    case DType::BFloat16: return MPI_UINT16_T;  // the bits; reductions take the ops below
    case DType::Int8: break;  // check_tensor refuses it first
  }
  fail("mpi: unsupported dtype {}", dtype_name(dtype));
}

/// MPI has no bfloat16: its reductions are user-defined ops on the 16-bit patterns, each pair of
/// elements widened to float (exact), combined, and rounded back to nearest, ties to even.
template <typename Combine>
void reduce_bfloat16(void* in, void* inout, int* count, MPI_Datatype*) {
  const auto* from = static_cast<const bfloat16*>(in);
  auto* into = static_cast<bfloat16*>(inout);
  for (int i = 0; i < *count; ++i)
    into[i] = bfloat16(Combine{}(static_cast<float>(from[i]), static_cast<float>(into[i])));
}
struct Max {
  float operator()(float a, float b) const { return a > b ? a : b; }
};

std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  MPI_Error_string(code, text.data(), &length);
  return std::string(text.data(), static_cast<size_t>(length));
}

/// A collective handed to the MPI thread, with the host tensors it works on and its completion; or,
/// with `task` set, other work that must make MPI calls.
struct Job {
  Collective collective;
  std::function<void()> task;
  Tensor host_input, host_output;  // the collective's tensors, or host copies of CUDA ones
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::string error;

  /// Called by the MPI thread when the job is over; `failure` is empty on success.
  void finish(std::string failure) {
    std::lock_guard lock(mutex);
    error = std::move(failure);
    done = true;
    done_signal.notify_all();
  }
  /// Blocks until finish().
  void wait_until_done() {
    std::unique_lock lock(mutex);
    done_signal.wait(lock, [&] { return done; });
  }
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<Job> job, std::atomic<int>& waiters) : job_(std::move(job)), waiters_(waiters) {}

  void wait() override {
    {
      std::optional<profiler::detail::Scope> profiled;  // a collective's wait, not an internal task's
      if (job_->task == nullptr)
        profiled.emplace(profiler::EventKind::Collective, "wait for ", nullptr, job_->collective.name());
      ++waiters_;  // the MPI thread polls without pausing while a thread waits
      job_->wait_until_done();
      --waiters_;
    }
    MF_CHECK(job_->error.empty(), "{}", job_->error);
    const Collective& c = job_->collective;
    // CUDA tensors: the result goes back to the device.
    if (c.output.defined() && !c.output.device().is_cpu() && !copied_back_) {
      Tensor device_output = c.output;
      device_output.copy_(job_->host_output);
      copied_back_ = true;
    }
  }

  bool completed() override {
    std::lock_guard lock(job_->mutex);
    return job_->done;
  }

 private:
  std::shared_ptr<Job> job_;
  std::atomic<int>& waiters_;
  bool copied_back_ = false;
};

class MpiProcessGroup : public MpiProcessGroupBase {
 public:
  MpiProcessGroup(int rank, int world_size, MPI_Comm comm, MPI_Comm notices, bool owns_mpi,
                  const ProcessGroupOptions& options)
      : MpiProcessGroupBase(rank, world_size, options), comm_(comm), notices_(notices), owns_mpi_(owns_mpi) {
    MPI_Op_create(&reduce_bfloat16<std::plus<float>>, /*commute=*/1, &bfloat16_sum_);
    MPI_Op_create(&reduce_bfloat16<Max>, /*commute=*/1, &bfloat16_max_);
    worker_ = std::thread([this] { serve(); });
  }

  ~MpiProcessGroup() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    worker_.join();
    MPI_Op_free(&bfloat16_sum_);
    MPI_Op_free(&bfloat16_max_);
    MPI_Comm_free(&notices_);
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

  void note_nccl_launch(uint64_t sequence) override { nccl_launched_.store(sequence); }

  std::string nccl_ranks_missing(uint64_t sequence) override {
    auto job = std::make_shared<Job>();
    std::string missing;
    job->task = [&] { missing = ranks_missing_from_nccl(static_cast<int64_t>(sequence)); };
    enqueue(job);
    job->wait_until_done();
    return missing;
  }

 protected:
  void end_job(int status) override {
    abort_status_.store(status);
    wake_.notify_one();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the MPI thread ends the job
  }

  std::shared_ptr<Work> launch(Collective c) override {
    MF_CHECK(!c.input.defined() || c.input.numel() <= INT_MAX, "mpi: {} has more than 2^31 - 1 elements; split "
             "the tensor", c.describe());
    auto job = std::make_shared<Job>();
    auto host = [](const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); };
    job->host_input = c.input.defined() ? host(c.input) : Tensor();
    if (c.output.defined())
      job->host_output = c.output.is_same(c.input) ? job->host_input
                         : c.output.device().is_cpu() ? c.output
                                                      : Tensor::empty(c.output.shape(), c.output.dtype());
    job->collective = std::move(c);
    enqueue(job);
    return std::make_shared<MpiWork>(std::move(job), waiters_);
  }

 private:
  /// Hands `job` to the MPI thread, after the jobs queued before it.
  void enqueue(std::shared_ptr<Job> job) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

  /// The MPI thread: runs the queued collectives in order, answering peers' questions meanwhile.
  void serve() {
    SerialThreadGuard serial;  // its ops (an average's division) leave the intra-op pool to the model
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait_for(lock, std::chrono::milliseconds(2),
                       [&] { return stopping_ || !queue_.empty() || abort_status_.load() >= 0; });
        if (!queue_.empty()) {
          job = queue_.front();
          queue_.pop_front();
        } else if (stopping_) {
          return;
        }
      }
      if (abort_status_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_status_.load());
      answer_peers();
      if (job) run(*job);
    }
  }

  void run(Job& job) {
    if (job.task) {
      job.task();
      job.finish({});
      return;
    }
    const Collective& c = job.collective;
    std::optional<profiler::detail::Scope> profiled;  // the shapes' vector is built only while a profiler records
    std::vector<Tensor> shapes_of;
    if (profiler::detail::recording()) {
      if (c.input.defined()) shapes_of.push_back(c.input);
      profiled.emplace(profiler::EventKind::Collective, c.name(), &shapes_of, " (mpi)");
    }
    current_ = {.in_collective = 1, .sequence = static_cast<int64_t>(c.sequence), .kind = static_cast<int64_t>(c.kind)};
    const Clock::time_point deadline = Clock::now() + timeout();
    int code = MPI_SUCCESS;
    for (int64_t piece = 0; piece < pieces(job) && code == MPI_SUCCESS; ++piece) {
      MPI_Request request = MPI_REQUEST_NULL;
      code = start(job, piece, &request);
      if (code == MPI_SUCCESS) code = wait_for(job, &request, deadline);
    }
    if (code == MPI_SUCCESS && c.op == ReduceOp::Average && c.kind != Collective::Kind::Barrier &&
        c.kind != Collective::Kind::Broadcast && c.kind != Collective::Kind::AllGather)
      job.host_output.div_(scalar_tensor(world_size(), job.host_output.dtype()));
    current_ = {.in_collective = 0, .sequence = static_cast<int64_t>(c.sequence), .kind = 0};
    profiled.reset();  // the run's event recorded before its waiter wakes, and maybe stops the profiler
    job.finish(code == MPI_SUCCESS ? std::string() : fmt::format("mpi: {} failed: {}", c.describe(),
                                                                 mpi_error_text(code)));
  }

  /// An all-reduce goes in pieces of kPieceBytes, one after the other: MPI libraries reduce a few
  /// megabytes at a time much faster than one large message (OpenMPI 4.1's non-blocking all-reduce:
  /// over 5 GB/s at 4 MiB, about 2 GB/s at 16 MiB and more).
  static constexpr int64_t kPieceBytes = int64_t{4} << 20;
  static int64_t piece_elements(const Tensor& t) {
    return std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(t.element_size()));
  }
  static int64_t pieces(const Job& job) {
    if (job.collective.kind != Collective::Kind::AllReduce || job.host_input.numel() == 0) return 1;
    return (job.host_input.numel() + piece_elements(job.host_input) - 1) / piece_elements(job.host_input);
  }

  MPI_Op mpi_op(ReduceOp op, DType dtype) const {
    if (dtype == DType::BFloat16) return op == ReduceOp::Max ? bfloat16_max_ : bfloat16_sum_;
    return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;  // an average is summed, then divided
  }

  /// Starts piece `piece` of the collective.
  int start(Job& job, int64_t piece, MPI_Request* request) {
    const Collective& c = job.collective;
    const Tensor& in = job.host_input;
    const Tensor& out = job.host_output;
    switch (c.kind) {
      case Collective::Kind::Barrier: return MPI_Ibarrier(comm_, request);
      case Collective::Kind::Broadcast:
        return MPI_Ibcast(in.raw_data(), static_cast<int>(in.numel()), mpi_type(in.dtype()), c.root, comm_, request);
      case Collective::Kind::AllReduce: {
        const int64_t first = piece * piece_elements(in), count = std::min(piece_elements(in), in.numel() - first);
        return MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(in.raw_data()) + first * int64_t(in.element_size()),
                              static_cast<int>(count), mpi_type(in.dtype()), mpi_op(c.op, in.dtype()), comm_,
                              request);
      }
      case Collective::Kind::AllGather:
        return MPI_Iallgather(in.raw_data(), static_cast<int>(in.numel()), mpi_type(in.dtype()), out.raw_data(),
                              static_cast<int>(in.numel()), mpi_type(in.dtype()), comm_, request);
      case Collective::Kind::ReduceScatter:
        return MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), static_cast<int>(out.numel()),
                                         mpi_type(in.dtype()), mpi_op(c.op, in.dtype()), comm_, request);
    }
    return MPI_ERR_OP;
  }

  /// Polls `request` until it completes; past `deadline`, ends the job. While a thread waits for a
  /// collective it polls without pause (nothing else is computing); otherwise (a bucket reduced
  /// during backward) it sleeps between polls, 10 us doubling up to 0.2 ms, leaving the core to the
  /// computation: each poll that yields instead costs the computing thread a context switch.
  int wait_for(Job& job, MPI_Request* request, Clock::time_point deadline) {
    auto pause = std::chrono::microseconds(0);
    for (int polls = 0;; ++polls) {
      int finished = 0;
      int code = MPI_Test(request, &finished, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS || finished) return code;
      if (abort_status_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_status_.load());
      if (polls % 64 == 63) {
        answer_peers();
        if (Clock::now() > deadline) end_job_after_timeout(job.collective);
      }
      if (waiters_.load(std::memory_order_relaxed) > 0) {
        std::this_thread::yield();
        pause = std::chrono::microseconds(0);
      } else {
        pause = std::min<std::chrono::microseconds>(std::max(pause * 2, std::chrono::microseconds(10)),
                                                    std::chrono::microseconds(200));
        std::this_thread::sleep_for(pause);
      }
    }
  }

  /// Answers every peer that asked where this rank is: in this group's collectives, or (kAskNcclTag)
  /// how far its NCCL collectives have been launched.
  void answer_peers() {
    for (int tag : {kAskTag, kAskNcclTag}) {
      for (;;) {
        int asked = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, tag, notices_, &asked, &status);
        if (!asked) break;
        int64_t their_sequence = 0;
        MPI_Recv(&their_sequence, 1, MPI_INT64_T, status.MPI_SOURCE, tag, notices_, MPI_STATUS_IGNORE);
        const Status answer =
            tag == kAskTag ? current_ : Status{.sequence = static_cast<int64_t>(nccl_launched_.load())};
        sends_.push_back({answer, MPI_REQUEST_NULL});
        MPI_Isend(&sends_.back().payload, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, notices_,
                  &sends_.back().request);
      }
    }
    while (!sends_.empty()) {  // the buffers of finished sends can go
      int sent = 0;
      MPI_Test(&sends_.front().request, &sent, MPI_STATUS_IGNORE);
      if (!sent) break;
      sends_.pop_front();
    }
  }

  /// Asks every other rank the question `ask_tag` names and waits a moment for their answers
  /// (answering theirs meanwhile): one per rank, none for a rank that did not answer, this rank's own
  /// as the one asked about would be (`sequence`, in it).
  std::vector<std::optional<Status>> ask_peers(int ask_tag, int64_t sequence) {
    for (int peer = 0; peer < world_size(); ++peer) {
      if (peer == rank()) continue;
      sends_.push_back({Status{.sequence = sequence}, MPI_REQUEST_NULL});
      MPI_Isend(&sends_.back().payload.sequence, 1, MPI_INT64_T, peer, ask_tag, notices_, &sends_.back().request);
    }
    std::vector<std::optional<Status>> answers(static_cast<size_t>(world_size()));
    answers[static_cast<size_t>(rank())] = Status{.in_collective = 1, .sequence = sequence};
    const auto grace = std::clamp<std::chrono::milliseconds>(timeout() / 4, std::chrono::milliseconds(250),
                                                            std::chrono::milliseconds(2000));
    const Clock::time_point until = Clock::now() + grace;
    int missing = world_size() - 1;
    while (missing > 0 && Clock::now() < until) {
      answer_peers();
      int replied = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, notices_, &replied, &status);
      if (!replied) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      Status answer;
      MPI_Recv(&answer, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, notices_, MPI_STATUS_IGNORE);
      std::optional<Status>& slot = answers[static_cast<size_t>(status.MPI_SOURCE)];
      if (!slot) --missing;
      slot = answer;
    }
    return answers;
  }

  /// For a timed-out collective `sequence` of the NCCL group: the ranks that have not launched it,
  /// as the peers' MPI threads answer (see nccl_ranks_missing). Runs on the MPI thread.
  std::string ranks_missing_from_nccl(int64_t sequence) {
    std::vector<std::optional<Status>> answers = ask_peers(kAskNcclTag, sequence);
    std::vector<std::string> absent;
    for (int peer = 0; peer < world_size(); ++peer) {
      const std::optional<Status>& answer = answers[static_cast<size_t>(peer)];
      if (!answer)
        absent.push_back(fmt::format("rank {} did not answer (it is gone, or its MPI thread is stuck)", peer));
      else if (answer->sequence < sequence)
        absent.push_back(fmt::format("rank {} has not reached it (the last NCCL collective it launched is #{})",
                                     peer, answer->sequence));
    }
    if (absent.empty()) return "every rank has launched it, yet it did not complete (a GPU or the link between them "
                               "stalled)";
    return fmt::format("{}", fmt::join(absent, "; "));
  }

  /// Asks the other ranks where they are, names the collective and the ranks that did not arrive on
  /// stderr, and ends the job.
  [[noreturn]] void end_job_after_timeout(const Collective& c) {
    const int64_t sequence = static_cast<int64_t>(c.sequence);
    std::vector<std::optional<Status>> answers = ask_peers(kAskTag, sequence);
    std::vector<std::string> absent;
    for (int peer = 0; peer < world_size(); ++peer) {
      const std::optional<Status>& answer = answers[static_cast<size_t>(peer)];
      if (!answer) {
        absent.push_back(fmt::format("rank {} did not answer (it is gone, or its MPI thread is stuck)", peer));
      } else if (!(answer->in_collective && answer->sequence == sequence)) {
        absent.push_back(answer->in_collective
                             ? fmt::format("rank {} is waiting in collective #{} instead", peer, answer->sequence)
                             : fmt::format("rank {} has not reached it (the last collective it finished is #{})",
                                           peer, answer->sequence));
      }
    }
    std::string who = absent.empty() ? "every rank has reached it, yet it did not complete" : fmt::format(
                                                                                      "{}", fmt::join(absent, "; "));
    std::fprintf(stderr, "[rank %d] miniflow: %s did not complete within %.3g s: %s; ending the job\n", rank(),
                 c.describe().c_str(), std::chrono::duration<double>(timeout()).count(), who.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; if it did, this process must still end
  }

  /// A question or an answer on its way to a peer: MPI reads `payload` until `request` completes.
  struct Send {
    Status payload;
    MPI_Request request;
  };

  MPI_Comm comm_, notices_;
  MPI_Op bfloat16_sum_ = MPI_OP_NULL, bfloat16_max_ = MPI_OP_NULL;
  bool owns_mpi_;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::atomic<int> abort_status_{-1};
  std::atomic<int> waiters_{0};  // threads in MpiWork::wait()
  std::atomic<uint64_t> nccl_launched_{0};  // the last collective this rank's NCCL group launched
  // The MPI thread's own.
  Status current_;
  std::deque<Send> sends_;
};

/// Open MPI's non-blocking all-reduce (libnbc) reduces an in-place buffer, or one over fewer than four
/// ranks, up a binomial tree: one rank receives and sums every whole buffer, then sends the sum back
/// down. Rabenseifner's reduce-scatter then all-gather splits the sums among the ranks and moves half
/// the bytes: over 2 ranks, 2.4-3.2x the bandwidth for 16 and 64 MiB, 1.2-4x for 4 MiB
/// (BENCHMARKS.md). Chosen through MPI's tool interface, unless the job chose an algorithm itself
/// (mpirun --mca or OMPI_MCA_ variables); other MPI libraries have no such variable and keep their own
/// choice. Every rank runs this alike, so all take the same algorithm.
void prefer_reduce_scatter_allgather() {
  int tool_level = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &tool_level) != MPI_SUCCESS) return;
  int index = 0;
  MPI_T_cvar_handle handle;
  int count = 0;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS &&
      MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
    constexpr int kLibnbcChooses = 0, kRabenseifner = 3;  // the values `ompi_info` lists for the variable
    int algorithm = -1;
    if (count == 1 && MPI_T_cvar_read(handle, &algorithm) == MPI_SUCCESS && algorithm == kLibnbcChooses)
      MPI_T_cvar_write(handle, &kRabenseifner);
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
}

}  // namespace

std::shared_ptr<MpiProcessGroupBase> make_mpi_process_group(const ProcessGroupOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns_mpi = false;
  if (!initialized) {
    int provided = 0;
    MF_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS,
             "init_process_group: MPI_Init_thread failed");
    owns_mpi = true;
    MF_CHECK(provided >= MPI_THREAD_SERIALIZED, "init_process_group: the MPI library gives thread level {}, miniflow "
             "needs MPI_THREAD_SERIALIZED ({})", provided, static_cast<int>(MPI_THREAD_SERIALIZED));
  } else {
    int provided = 0;
    MPI_Query_thread(&provided);
    MF_CHECK(provided >= MPI_THREAD_SERIALIZED, "init_process_group: MPI was initialised with thread level {}; "
             "miniflow's MPI thread needs MPI_THREAD_SERIALIZED (call MPI_Init_thread)", provided);
  }
  prefer_reduce_scatter_allgather();
  // Errors come back as codes that the collective's error names, instead of ending the job unexplained.
  MPI_Comm comm = MPI_COMM_NULL, notices = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_dup(MPI_COMM_WORLD, &notices);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::make_shared<MpiProcessGroup>(rank, size, comm, notices, owns_mpi, options);
}

}  // namespace mf::distributed::detail
