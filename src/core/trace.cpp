#include "ot/trace.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "ot/parallel.h"

namespace ot::trace {

static std::mutex g_mu;
static std::vector<Event> g_events;
static bool g_timeline = false;

bool log_enabled() {
  static const bool on = [] {
    const char* s = std::getenv("OT_LOG");
    return s && *s && s[0] != '0';
  }();
  return on;
}

void set_timeline(bool on) { std::lock_guard<std::mutex> l(g_mu); g_timeline = on; }
bool timeline_enabled() { return g_timeline; }

std::vector<Event> take_events() {
  std::lock_guard<std::mutex> l(g_mu);
  std::vector<Event> r;
  r.swap(g_events);
  return r;
}

void record(Event e) {
  std::lock_guard<std::mutex> l(g_mu);
  g_events.push_back(std::move(e));
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') { r += '\\'; r += c; }
    else if (static_cast<unsigned char>(c) < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); r += b; }
    else r += c;
  }
  return r;
}

void write_chrome_trace(const std::string& path, const std::vector<Event>& events, int pid) {
  std::ofstream f(path);
  f << "{\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    char buf[128];
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", e.start_ns / 1e3, e.dur_ns / 1e3, pid, e.tid);
    f << "{\"name\":\"" << json_escape(e.name) << "\",\"cat\":\"" << json_escape(e.category) << "\",\"ph\":\"X\"," << buf
      << ",\"args\":{\"kernel\":\"" << json_escape(e.kernel) << "\",\"shapes\":\"" << json_escape(e.args) << "\",\"flops\":" << e.flops
      << ",\"bytes\":" << e.bytes << "}}" << (i + 1 < events.size() ? ",\n" : "\n");
  }
  f << "],\"displayTimeUnit\":\"ms\"}\n";
}

// Calls made inside a parallel region (the expert-major MoE backward runs ~500 nested engine calls
// per layer) belong to the enclosing operator's scope: logging each would flood OT_LOG and the
// timeline with per-expert lines of one thread.
OpScope::OpScope(const char* name, const char* category) : active_((log_enabled() || g_timeline) && !in_parallel_region()) {
  if (!active_) return;
  ev_.name = name;
  ev_.category = category;
  ev_.tid = 0;
  ev_.start_ns = now_ns();
}

OpScope::~OpScope() {
  if (!active_) return;
  ev_.dur_ns = now_ns() - ev_.start_ns;
  if (log_enabled()) {
    std::fprintf(stderr, "[ot] %s kernel=%s %s %.3f ms\n", ev_.name.c_str(), ev_.kernel.empty() ? "-" : ev_.kernel.c_str(),
                 ev_.args.c_str(), ev_.dur_ns / 1e6);
  }
  if (g_timeline) record(std::move(ev_));
}

}  // namespace ot::trace
