// mf::profiler: what it counts is checked against the calls the test makes (counted by hand), its
// self times against the events' own intervals, its trace against the JSON it promises.
#include <doctest/doctest.h>

#include "miniflow.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>

using namespace mf;
using profiler::Event;
using profiler::EventKind;
using profiler::EventStats;

namespace {

/// The first summed row of `name`; calls = 0 when there is none.
EventStats row(const profiler::Profiler& p, const std::string& name) {
  for (const EventStats& s : p.key_averages())
    if (s.name == name) return s;
  return {};
}

int64_t calls_of(const profiler::Profiler& p, const std::string& name) {
  int64_t calls = 0;
  for (const EventStats& s : p.key_averages())
    if (s.name == name) calls += s.calls;
  return calls;
}

bool contains(const Event& outer, const Event& inner) {
  return outer.thread == inner.thread && inner.start_us >= outer.start_us &&
         inner.start_us + inner.duration_us <= outer.start_us + outer.duration_us;
}

}  // namespace

TEST_CASE("the profiler counts each op call by name and input shapes, and nothing while off") {
  Tensor a = randn({3, 4}), b = randn({4, 5});
  NoGradGuard no_grad;
  add(a, a);  // before any profiler: not counted
  profiler::Profiler p({.record_shapes = true});
  add(a, a);
  mul(a, a);
  mul(a, a);
  for (int i = 0; i < 3; ++i) matmul(a, b);
  p.stop();
  add(a, a);  // after stop: not counted
  CHECK(calls_of(p, "add") == 1);
  CHECK(calls_of(p, "mul") == 2);
  CHECK(calls_of(p, "matmul") == 3);
  CHECK(row(p, "matmul").input_shapes == "[3, 4], [4, 5]");
  CHECK(row(p, "add").kind == EventKind::Op);
  for (const Event& e : p.events()) CHECK(e.duration_us >= e.self_us);
}

TEST_CASE("the profiler times backward steps as events named after their op, holding the ops their rules run") {
  Tensor x = randn({8, 8}).set_requires_grad();
  profiler::Profiler p;
  Tensor loss = sum(exp(x));
  loss.backward();
  p.stop();
  CHECK(calls_of(p, "exp") >= 1);
  CHECK(calls_of(p, "exp backward") == 1);
  CHECK(calls_of(p, "sum backward") == 1);
  CHECK(row(p, "exp backward").kind == EventKind::Backward);
  // exp's rule multiplies the incoming gradient by exp(x): its ops run inside its event.
  std::vector<Event> events = p.events();
  const Event* exp_step = nullptr;
  for (const Event& e : events)
    if (e.name == "exp backward") exp_step = &e;
  REQUIRE(exp_step != nullptr);
  int inside = 0;
  for (const Event& e : events)
    if (&e != exp_step && e.kind == EventKind::Op && contains(*exp_step, e)) ++inside;
  CHECK(inside >= 1);
}

TEST_CASE("the profiler gives a region its time less that of the events directly inside it as self time") {
  Tensor a = randn({64, 64});
  NoGradGuard no_grad;
  profiler::Profiler p;
  {
    auto outer = profiler::record_function("outer");
    matmul(a, a);
    {
      auto inner = profiler::record_function("inner");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    add(a, a);
  }
  p.stop();
  std::vector<Event> events = p.events();
  const Event *outer = nullptr, *inner = nullptr;
  for (const Event& e : events) {
    if (e.name == "outer") outer = &e;
    if (e.name == "inner") inner = &e;
  }
  REQUIRE(outer != nullptr);
  REQUIRE(inner != nullptr);
  CHECK(outer->kind == EventKind::Region);
  CHECK(inner->duration_us >= 20000);  // sleep_for waits at least that long
  CHECK(contains(*outer, *inner));
  // Direct children: events inside outer that no other event inside outer holds.
  double children = 0;
  int direct = 0;
  for (const Event& e : events) {
    if (&e == outer || !contains(*outer, e)) continue;
    bool nested = false;
    for (const Event& f : events)
      if (&f != outer && &f != &e && contains(*outer, f) && contains(f, e)) nested = true;
    if (!nested) {
      children += e.duration_us;
      ++direct;
    }
  }
  CHECK(direct == 3);  // matmul, inner, add
  CHECK(outer->self_us == doctest::Approx(outer->duration_us - children).epsilon(1e-9));
  CHECK(inner->self_us == doctest::Approx(inner->duration_us));
}

TEST_CASE("one profiler records at a time, from every thread") {
  Tensor a = randn({4, 4});
  NoGradGuard no_grad;
  profiler::Profiler first;
  CHECK_THROWS_WITH_AS(profiler::Profiler(), doctest::Contains("another Profiler is recording"), Error);
  std::thread other([&] {
    NoGradGuard other_no_grad;
    mul(a, a);
  });
  other.join();
  add(a, a);
  first.stop();
  std::map<std::string, int> thread_of;
  for (const Event& e : first.events()) thread_of[e.name] = e.thread;
  REQUIRE(thread_of.count("mul") == 1);
  REQUIRE(thread_of.count("add") == 1);
  CHECK(thread_of["mul"] != thread_of["add"]);
  profiler::Profiler second;  // the first has stopped
  CHECK(second.recording());
}

TEST_CASE("the profiler's table and Chrome trace show what was recorded") {
  Tensor a = randn({4, 4});
  NoGradGuard no_grad;
  profiler::Profiler p({.record_shapes = true});
  for (int i = 0; i < 3; ++i) add(a, a);
  mul(a, a);
  neg(a);
  p.stop();
  const std::string table = p.table({.sort_by = profiler::SortBy::Calls, .row_limit = 1});
  CHECK(table.find("add") != std::string::npos);  // most calls: the one row shown
  CHECK(table.find("(2 more)") != std::string::npos);
  CHECK(table.find("[4, 4], [4, 4]") != std::string::npos);

  const auto path = std::filesystem::temp_directory_path() / ("mf_trace_" + std::to_string(getpid()) + ".json");
  p.export_chrome_trace(path.string());
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  const std::vector<Event> events = p.events();
  REQUIRE(trace["traceEvents"].size() == events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = trace["traceEvents"][i];
    CHECK(e["ph"] == "X");
    CHECK(e["name"] == events[i].name);
    CHECK(e["ts"].get<double>() == events[i].start_us);
    CHECK(e["dur"].get<double>() == events[i].duration_us);
    CHECK(e["args"]["input shapes"] == events[i].input_shapes);
  }
}
