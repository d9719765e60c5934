#include "core/profiler.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/shape.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

namespace mf::profiler {

namespace {

using Clock = std::chrono::steady_clock;

double microseconds(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

/// What every thread's scopes report to: the recording profiler's events (its number is
/// detail::active_generation).
struct Recorder {
  std::atomic<bool> record_shapes{false};
  std::atomic<int> threads_seen{0};
  std::mutex mutex;  // guards the rest
  uint64_t last_generation = 0;
  Clock::time_point start;
  std::vector<Event> events;
};

Recorder& recorder() {
  static auto* instance = new Recorder;  // never destroyed: threads may close scopes during exit
  return *instance;
}

/// A scope still open on this thread.
struct OpenScope {
  uint64_t generation;
  EventKind kind;
  std::string name, input_shapes;
  Clock::time_point start;
  double children_us = 0;  // the scopes opened and closed inside it, on this thread
};

thread_local std::vector<OpenScope> open_scopes;
thread_local int thread_number = -1;

std::string shapes_of(const std::vector<Tensor>& inputs) {
  std::string text;
  for (const Tensor& t : inputs) {
    if (!text.empty()) text += ", ";
    text += t.defined() ? shape_str(t.shape()) : "undefined";
  }
  return text;
}

std::string_view kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::Op: return "op";
    case EventKind::Backward: return "backward";
    case EventKind::Region: return "region";
    case EventKind::Collective: return "collective";
  }
  return "?";
}

/// 12.3 us, 4.56 ms, 7.89 s.
std::string duration_text(double us) {
  if (us < 1e3) return fmt::format("{:.1f} us", us);
  if (us < 1e6) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.2f} s", us / 1e6);
}

}  // namespace

namespace detail {

std::atomic<uint64_t> active_generation{0};

void Scope::open(EventKind kind, std::string_view name, const std::vector<Tensor>* inputs, std::string_view suffix) {
  Recorder& r = recorder();
  const uint64_t generation = active_generation.load(std::memory_order_acquire);
  if (generation == 0) return;  // stopped since recording() said yes
  open_ = true;
  OpenScope& scope = open_scopes.emplace_back();
  scope.generation = generation;
  scope.kind = kind;
  scope.name.reserve(name.size() + suffix.size());
  scope.name.append(name).append(suffix);
  if (inputs && r.record_shapes.load(std::memory_order_relaxed)) scope.input_shapes = shapes_of(*inputs);
  scope.start = Clock::now();  // last: the bookkeeping above is its parent's time, not its own
}

void Scope::close() {
  const Clock::time_point end = Clock::now();
  OpenScope scope = std::move(open_scopes.back());
  open_scopes.pop_back();
  const double duration = microseconds(end - scope.start);
  if (!open_scopes.empty()) open_scopes.back().children_us += duration;
  Recorder& r = recorder();
  if (thread_number < 0) thread_number = r.threads_seen++;
  std::lock_guard lock(r.mutex);
  if (active_generation.load(std::memory_order_relaxed) != scope.generation) return;  // stopped since it opened
  r.events.push_back({.name = std::move(scope.name),
                      .kind = scope.kind,
                      .input_shapes = std::move(scope.input_shapes),
                      .thread = thread_number,
                      .start_us = microseconds(scope.start - r.start),
                      .duration_us = duration,
                      .self_us = duration - scope.children_us});
}

}  // namespace detail

Profiler::Profiler(ProfilerOptions options) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  MF_CHECK(detail::active_generation.load() == 0,
           "profiler: another Profiler is recording (one records at a time: stop it first)");
  r.events.clear();
  r.record_shapes.store(options.record_shapes);
  r.start = Clock::now();
  detail::active_generation.store(++r.last_generation, std::memory_order_release);
}

Profiler::~Profiler() { stop(); }

void Profiler::stop() {
  if (!recording_) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  detail::active_generation.store(0);
  wall_us_ = microseconds(Clock::now() - r.start);
  events_ = std::move(r.events);
  r.events.clear();
  recording_ = false;
}

std::vector<Event> Profiler::events() const {
  if (!recording_) return events_;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.events;
}

std::vector<EventStats> Profiler::key_averages() const {
  std::map<std::tuple<std::string, EventKind, std::string>, EventStats> by_key;
  for (const Event& e : events()) {
    EventStats& stats = by_key[{e.name, e.kind, e.input_shapes}];
    stats.name = e.name;
    stats.kind = e.kind;
    stats.input_shapes = e.input_shapes;
    ++stats.calls;
    stats.total_us += e.duration_us;
    stats.self_us += e.self_us;
  }
  std::vector<EventStats> rows;
  for (auto& [key, stats] : by_key) rows.push_back(std::move(stats));
  std::stable_sort(rows.begin(), rows.end(),
                   [](const EventStats& a, const EventStats& b) { return a.self_us > b.self_us; });
  return rows;
}

std::string Profiler::table(TableOptions options) const {
  std::vector<EventStats> rows = key_averages();
  auto key = [&](const EventStats& s) {
    switch (options.sort_by) {
      case SortBy::SelfTime: return s.self_us;
      case SortBy::TotalTime: return s.total_us;
      case SortBy::Calls: return static_cast<double>(s.calls);
    }
    return s.self_us;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const EventStats& a, const EventStats& b) { return key(a) > key(b); });
  double self_total = 0;
  for (const EventStats& s : rows) self_total += s.self_us;
  const bool shapes =
      std::any_of(rows.begin(), rows.end(), [](const EventStats& s) { return !s.input_shapes.empty(); });
  const size_t shown =
      options.row_limit > 0 ? std::min(rows.size(), static_cast<size_t>(options.row_limit)) : rows.size();
  size_t name_width = 4;
  for (size_t i = 0; i < shown; ++i) name_width = std::max(name_width, rows[i].name.size());
  auto share = [&](double us) { return self_total > 0 ? fmt::format("{:.1f}%", 100 * us / self_total) : "-"; };
  std::string out = fmt::format("{:<{}}  {:>10}  {:>6}  {:>10}  {:>6}  {:>9}  {:>10}{}\n", "name", name_width, "self",
                                "self %", "total", "total %", "calls", "self/call", shapes ? "  input shapes" : "");
  auto line = [&](std::string_view name, double self, double total, int64_t calls, std::string_view input_shapes) {
    out += fmt::format("{:<{}}  {:>10}  {:>6}  {:>10}  {:>6}  {:>9}  {:>10}{}{}\n", name, name_width,
                       duration_text(self), share(self), duration_text(total), share(total), calls,
                       duration_text(calls > 0 ? self / static_cast<double>(calls) : 0), shapes ? "  " : "",
                       input_shapes);
  };
  for (size_t i = 0; i < shown; ++i)
    line(rows[i].name, rows[i].self_us, rows[i].total_us, rows[i].calls, rows[i].input_shapes);
  if (shown < rows.size()) {
    double self = 0, total = 0;
    int64_t calls = 0;
    for (size_t i = shown; i < rows.size(); ++i) {
      self += rows[i].self_us;
      total += rows[i].total_us;
      calls += rows[i].calls;
    }
    line(fmt::format("({} more)", rows.size() - shown), self, total, calls, "");
  }
  double wall = wall_us_;
  if (recording_) {
    std::lock_guard lock(recorder().mutex);
    wall = microseconds(Clock::now() - recorder().start);
  }
  out += fmt::format("self time of every event: {}; profiled for {} of wall time\n", duration_text(self_total),
                     duration_text(wall));
  return out;
}

void Profiler::export_chrome_trace(const std::string& path) const {
  nlohmann::json trace_events = nlohmann::json::array();
  for (const Event& e : events()) {
    nlohmann::json event = {{"name", e.name}, {"cat", kind_name(e.kind)}, {"ph", "X"}, {"pid", 0},
                            {"tid", e.thread}, {"ts", e.start_us}, {"dur", e.duration_us}};
    if (!e.input_shapes.empty()) event["args"] = {{"input shapes", e.input_shapes}};
    trace_events.push_back(std::move(event));
  }
  AtomicFile file(path, "Chrome trace");
  file.write(nlohmann::json{{"traceEvents", trace_events}, {"displayTimeUnit", "ms"}}.dump());
  file.commit();
}

}  // namespace mf::profiler
