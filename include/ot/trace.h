// Operator call records: OT_LOG=1 prints each call (shapes, dtypes, kernel, time) to stderr, and
// an enabled timeline collects them as events for a Chrome trace (Perfetto / chrome://tracing).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ot::trace {

struct Event {
  std::string name;      // operator, e.g. "moe_ffn"
  std::string category;  // "op", "comm", "phase", ...
  std::string kernel;    // chosen path, e.g. "amx", "avx512_bf16", "ref"
  std::string args;      // shapes and dtypes, free text
  double flops = 0;      // work done, for GFLOP/s tables (0 when unknown)
  double bytes = 0;      // memory traffic, for GB/s tables
  int64_t start_ns = 0, dur_ns = 0;
  int tid = 0;           // lane in the timeline (MPI rank for expert parallel runs)
};

bool log_enabled();                     // OT_LOG=1
void set_timeline(bool on);             // start/stop collecting events
bool timeline_enabled();
std::vector<Event> take_events();       // returns and clears the collected events
void record(Event e);                   // add one finished event (thread-safe)
int64_t now_ns();
// Writes events as Chrome trace JSON ({"traceEvents":[...]}).
void write_chrome_trace(const std::string& path, const std::vector<Event>& events, int pid = 0);

// Scope of one operator call: measures time; on exit prints (OT_LOG) and records (timeline).
// Cheap when neither is on.
class OpScope {
 public:
  OpScope(const char* name, const char* category = "op");
  ~OpScope();
  bool active() const { return active_; }
  OpScope& kernel(const std::string& k) { if (active_) ev_.kernel = k; return *this; }
  OpScope& args(const std::string& a) { if (active_) ev_.args = a; return *this; }
  OpScope& flops(double f) { ev_.flops = f; return *this; }
  OpScope& bytes(double b) { ev_.bytes = b; return *this; }

 private:
  bool active_;
  Event ev_;
};

}  // namespace ot::trace
