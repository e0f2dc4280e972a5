#include "demo_stats.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "bench_harness.h"

namespace ot::demo {

void attach_work(std::vector<trace::Event>& events, const std::vector<Work>& work) {
  std::map<std::string, std::vector<const Work*>> queue;
  for (const Work& w : work) queue[w.op].push_back(&w);
  std::map<std::string, size_t> next;
  for (trace::Event& e : events) {
    auto it = queue.find(e.name);
    if (it == queue.end()) continue;
    size_t& i = next[e.name];
    if (i >= it->second.size()) continue;
    const Work& w = *it->second[i++];
    if (e.flops <= 0) e.flops = w.flops;
    if (e.bytes <= 0) e.bytes = w.bytes;
  }
}

PhaseStats summarize(const std::string& phase, const std::vector<trace::Event>& events, double wall_ms, int64_t tokens, int64_t steps) {
  PhaseStats s{phase, wall_ms, tokens, steps, {}};
  std::vector<const trace::Event*> ev;
  for (const auto& e : events)
    if (e.category == "op" || e.category == "comm") ev.push_back(&e);  // comm: expert-parallel exchanges
  std::stable_sort(ev.begin(), ev.end(), [](auto* a, auto* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->dur_ns > b->dur_ns;
  });
  std::map<std::string, size_t> index;
  std::vector<const trace::Event*> stack;  // enclosing calls on the same lane
  for (const trace::Event* e : ev) {
    while (!stack.empty() && (stack.back()->tid != e->tid || stack.back()->start_ns + stack.back()->dur_ns < e->start_ns + e->dur_ns))
      stack.pop_back();
    std::string key = stack.empty() ? e->name : stack.front()->name + "/" + e->name;
    auto [it, fresh] = index.emplace(key, s.rows.size());
    if (fresh) {
      OpRow r;
      r.name = key;
      r.depth = stack.empty() ? 0 : 1;
      r.kernel = e->kernel;
      s.rows.push_back(r);
    }
    OpRow& r = s.rows[it->second];
    ++r.calls;
    r.ms += e->dur_ns / 1e6;
    r.flops += e->flops;
    r.bytes += e->bytes;
    if (r.kernel != e->kernel && !e->kernel.empty() && r.kernel.find(e->kernel) == std::string::npos) r.kernel += "," + e->kernel;
    stack.push_back(e);
  }
  // Children right after their parent.
  std::vector<OpRow> ordered;
  for (const OpRow& r : s.rows) {
    if (r.depth) continue;
    ordered.push_back(r);
    for (const OpRow& c : s.rows)
      if (c.depth && c.name.rfind(r.name + "/", 0) == 0) ordered.push_back(c);
  }
  s.rows = ordered;
  return s;
}

void print_phase(const PhaseStats& s, const std::string& dtype, int threads, Roofline bound) {
  const double peak_f = cli::matrix_peak_gflops(dtype, threads), peak_b = cli::memory_peak_gbps(threads);
  double op_ms = 0;
  for (const auto& r : s.rows)
    if (r.depth == 0) op_ms += r.ms;
  std::printf("%-36s %6s %10s %7s %9s %8s %8s  %s\n", "operator", "calls", "total ms", "share", "GFLOP/s", "GB/s", "% peak", "kernel");
  for (const auto& r : s.rows) {
    const double sec = r.ms / 1e3;
    char gf[32] = "-", gb[32] = "-", pk[32] = "-";
    const double gflops = sec > 0 && r.flops > 0 ? r.flops / sec / 1e9 : 0, gbps = sec > 0 && r.bytes > 0 ? r.bytes / sec / 1e9 : 0;
    if (gflops > 0) std::snprintf(gf, sizeof gf, "%.1f", gflops);
    if (gbps > 0) std::snprintf(gb, sizeof gb, "%.1f", gbps);
    // Compute-bound when the operator's intensity exceeds the machine balance.
    const bool compute = r.flops > 0 && (r.bytes <= 0 || (peak_b > 0 && peak_f > 0 && r.flops / r.bytes > peak_f / peak_b));
    if (compute && peak_f > 0) std::snprintf(pk, sizeof pk, "%.0f%% F", 100 * gflops / peak_f);
    else if (!compute && gbps > 0 && peak_b > 0) std::snprintf(pk, sizeof pk, "%.0f%% M", 100 * gbps / peak_b);
    std::string name = r.depth ? "  > " + r.name.substr(r.name.find('/') + 1) : r.name;
    std::printf("%-36s %6lld %10.2f %6.1f%% %9s %8s %8s  %s\n", name.c_str(), (long long)r.calls, r.ms, 100 * r.ms / s.wall_ms, gf, gb, pk,
                r.kernel.c_str());
  }
  std::printf("%-36s %6s %10.2f %6.1f%%\n", "(between operators)", "", s.wall_ms - op_ms, 100 * (s.wall_ms - op_ms) / s.wall_ms);
  std::printf("%-36s %6s %10.2f %6.1f%%   %.1f tokens/s", "whole phase", "", s.wall_ms, 100.0, s.tokens / (s.wall_ms / 1e3));
  if (s.steps > 1) std::printf(", %.2f ms per step", s.wall_ms / double(s.steps));
  std::printf("\n  (%% peak: F = of the %s matrix peak %.0f GFLOP/s, M = of memory bandwidth %.1f GB/s, %d threads)\n", dtype.c_str(), peak_f,
              peak_b, threads);
  // The operators' own counts (top-level rows: a child's work is inside its parent's).
  double flops = 0, bytes = 0;
  for (const auto& r : s.rows)
    if (r.depth == 0) flops += r.flops, bytes += r.bytes;
  const double sec = s.wall_ms / 1e3, per_step = 1.0 / double(std::max<int64_t>(1, s.steps));
  if (bound == Roofline::compute) {
    const double rate = sec > 0 ? flops / sec / 1e9 : 0;
    std::printf("  roofline: %.2f GFLOP counted in %.2f ms = %.1f GFLOP/s, %.0f%% of the %s matrix peak (%.0f GFLOP/s)\n", flops / 1e9, s.wall_ms, rate,
                peak_f > 0 ? 100 * rate / peak_f : 0.0, dtype.c_str(), peak_f);
  } else {
    const double rate = sec > 0 ? bytes / sec / 1e9 : 0;
    std::printf("  roofline: %.1f MB counted per step in %.2f ms = %.1f GB/s, %.0f%% of the read bandwidth (%.1f GB/s)\n", bytes * per_step / 1e6,
                s.wall_ms * per_step, rate, peak_b > 0 ? 100 * rate / peak_b : 0.0, peak_b);
  }
}

void print_isolated(const PhaseStats& s, const Isolation& iso) {
  std::printf("%-36s %6s %13s %13s %9s\n", "operator", "calls", "pipeline ms", "isolated ms", "ratio");
  for (const OpRow& r : s.rows) {
    if (r.depth != 0 || r.calls == 0) continue;
    auto it = iso.ops.find(r.name);
    if (it == iso.ops.end() || it->second.calls == 0) continue;
    const double pipe = r.ms / double(r.calls), alone = it->second.ms / double(it->second.calls), ratio = pipe > 0 ? alone / pipe : 0;
    std::printf("%-36s %6lld %13.4f %13.4f %9.2f%s\n", r.name.c_str(), (long long)r.calls, pipe, alone, ratio, ratio < 0.85 ? "  <" : "");
  }
  std::printf("  (ms per call; isolated: median of %d back-to-back repeats of each call on its inputs; ratio = pipeline rate / isolated rate)\n",
              iso.repeats);
}

bool print_verification(const Verifier& v, double tol) {
  bool ok = true;
  std::printf("%-44s %6s %12s %10s  %s\n", "operator (output)", "calls", "max err", "tolerance", "");
  for (const auto& [name, e] : v.ops) {
    bool pass = e.max_err <= tol;
    ok &= pass;
    std::printf("%-44s %6lld %12.3e %10.1e  %s\n", name.c_str(), (long long)e.calls, e.max_err, tol, pass ? "ok" : "FAIL");
  }
  return ok;
}

}  // namespace ot::demo
