// Where a program's time goes, op by op (PyTorch's torch.profiler): while a Profiler records, every op
// call, every backward step of autograd and every region a program names (record_function) is timed,
// on whichever thread runs it. key_averages() and table() sum the events by name (and by input shapes,
// with record_shapes); export_chrome_trace() writes each event for chrome://tracing or Perfetto.
//
//   mf::profiler::Profiler profiler({.record_shapes = true});
//   for (int step = 0; step < 5; ++step) {
//     auto region = mf::profiler::record_function("step");
//     ...
//   }
//   profiler.stop();
//   fmt::print("{}", profiler.table({.row_limit = 15}));
//   profiler.export_chrome_trace("trace.json");
//
// An op's total time holds the ops it calls itself (a backward step's, the ops its rule runs); its
// self time does not. Times are wall time on the calling thread: an op whose kernel splits its work
// over the intra-op threads counts once, as long as its call lasts; on a GPU, an op's time is its
// launch's. Off (no Profiler recording), an op pays one atomic load. One Profiler records at a time,
// and it keeps every event (a training step of bench_transformer's small config makes about 1,400):
// profile a few steps, not a whole run.
#pragma once

#include "core/tensor.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mf::profiler {

struct ProfilerOptions {
  /// Keep each op's input shapes and sum events by (name, shapes) as well (PyTorch's
  /// record_shapes with key_averages(group_by_input_shape=True)).
  bool record_shapes = false;
};

/// What made an event: an op call, a backward step of autograd ("<op> backward"), a region a
/// program named, or a collective of a process group: its run on the backend's thread ("all_reduce
/// (mpi)") and a wait for it ("wait for all_reduce").
enum class EventKind { Op, Backward, Region, Collective };

/// One timed call, in microseconds since the profiler started.
struct Event {
  std::string name;
  EventKind kind = EventKind::Op;
  std::string input_shapes;  // "[2, 3], [3]" with record_shapes (an op's or collective's inputs), else empty
  int thread = 0;            // 0 for the first thread seen, 1 for the next, ...
  double start_us = 0, duration_us = 0;
  double self_us = 0;  // duration less the events this one contains on its thread
};

/// The events of one name (and input shapes, when recorded), summed.
struct EventStats {
  std::string name;
  EventKind kind = EventKind::Op;
  std::string input_shapes;
  int64_t calls = 0;
  double total_us = 0, self_us = 0;
};

enum class SortBy { SelfTime, TotalTime, Calls };

struct TableOptions {
  SortBy sort_by = SortBy::SelfTime;
  /// Rows shown (the rest are summed in a last line); 0 shows every row.
  int64_t row_limit = 20;
};

class Profiler {
 public:
  /// Starts recording. Throws mf::Error if another Profiler is recording.
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Stops recording (the destructor does too); events still open then are left out.
  void stop();
  bool recording() const { return recording_; }

  /// Every event recorded so far, in the order they ended.
  std::vector<Event> events() const;
  /// The events summed by name (and input shapes), sorted by self time.
  std::vector<EventStats> key_averages() const;
  /// key_averages() as a text table: self and total time, each as a share of all events' self time
  /// (totals of nested events overlap, so their shares can sum past 100%), calls, self time per call.
  std::string table(TableOptions options = {}) const;
  /// Writes the events as a Chrome trace (JSON, one "X" event each, a track per thread), atomically.
  void export_chrome_trace(const std::string& path) const;

 private:
  bool recording_ = true;
  double wall_us_ = 0;         // from start to stop
  std::vector<Event> events_;  // once stopped
};

namespace detail {

/// The recording Profiler's number, 0 while none records.
extern std::atomic<uint64_t> active_generation;

/// Whether a Profiler records now: the dispatcher asks at every op, so this and the checks in
/// Scope below stay inline (a relaxed load and a branch).
inline bool recording() { return active_generation.load(std::memory_order_relaxed) != 0; }

/// An event from construction to destruction, when a Profiler records at construction: named `name`
/// followed by `suffix`, with the shapes of `inputs` where shapes are recorded. The dispatcher opens
/// one for each op call, the autograd engine one for each backward step.
class Scope {
 public:
  Scope(EventKind kind, std::string_view name, const std::vector<Tensor>* inputs = nullptr,
        std::string_view suffix = {}) {
    if (recording()) open(kind, name, inputs, suffix);
  }
  ~Scope() {
    if (open_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(EventKind kind, std::string_view name, const std::vector<Tensor>* inputs, std::string_view suffix);
  void close();

  bool open_ = false;
};

}  // namespace detail

/// Times a named region while a Profiler records (PyTorch's record_function); does nothing otherwise.
class RecordFunction {
 public:
  explicit RecordFunction(std::string_view name) : scope_(EventKind::Region, name) {}

 private:
  detail::Scope scope_;
};

/// `auto region = record_function("forward");` times the rest of the enclosing block as "forward".
[[nodiscard]] inline RecordFunction record_function(std::string_view name) { return RecordFunction(name); }

}  // namespace mf::profiler
