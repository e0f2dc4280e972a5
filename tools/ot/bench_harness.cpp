#include "bench_harness.h"

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/knobs.h"

namespace ot::cli {

namespace bench_harness_local {
AbSpec g_ab;
AbTiming g_last_ab;  // the last time_interleaved's A/B, taken by report()

double quantile(std::vector<double> v, double q) {  // linear interpolation between order statistics
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double x = q * double(v.size() - 1);
  const size_t i = size_t(x);
  return i + 1 < v.size() ? v[i] + (x - double(i)) * (v[i + 1] - v[i]) : v[i];
}

// Restores a knob's value when the timing ends (or throws).
struct KnobRestore {
  std::string name;
  int64_t value = 0;
  ~KnobRestore() {
    if (!name.empty()) knobs::set(name, value);
  }
};
}  // namespace bench_harness_local

namespace bench_harness_local {
// s, the whole of it, as an integer into *v.
bool parse_int(const std::string& s, int64_t* v) {
  try {
    size_t used = 0;
    *v = std::stoll(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}
// The knob `name` (an unknown name: an ot::Error listing the known ones), checked to take each of vs.
const knobs::Knob& checked_knob(const char* who, const char* flag, const std::string& name, std::initializer_list<int64_t> vs) {
  const knobs::Knob& k = knobs::find(name);
  for (int64_t v : vs) OT_CHECK(v >= k.min() && v <= k.max(), who, flag, detail::cat(name, " values in [", k.min(), ", ", k.max(), "]"), v);
  return k;
}
}  // namespace bench_harness_local

AbSpec parse_ab(const std::string& spec) {
  using namespace bench_harness_local;
  const auto eq = spec.find('='), comma = spec.find(',', eq == std::string::npos ? 0 : eq);
  AbSpec ab;
  bool ok = eq != std::string::npos && eq > 0 && comma != std::string::npos;
  if (ok) {
    ab.knob = spec.substr(0, eq);
    ok = parse_int(spec.substr(eq + 1, comma - eq - 1), &ab.a) && parse_int(spec.substr(comma + 1), &ab.b);
  }
  OT_CHECK(ok, "ot bench", "--ab", "<knob>=<a>,<b> with integer a and b", "'", spec, "'");
  checked_knob("ot bench", "--ab", ab.knob, {ab.a, ab.b});
  return ab;
}

void set_knob(const char* who, const std::string& spec) {
  using namespace bench_harness_local;
  const auto eq = spec.find('=');
  std::string name;
  int64_t v = 0;
  bool ok = eq != std::string::npos && eq > 0;
  if (ok) name = spec.substr(0, eq), ok = parse_int(spec.substr(eq + 1), &v);
  OT_CHECK(ok, who, "--knob", "NAME=VALUE with an integer value", "'", spec, "'");
  knobs::set(checked_knob(who, "--knob", name, {v}).name(), v);
}

void set_ab(const AbSpec& spec) { bench_harness_local::g_ab = spec; }

static double ms_of(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double time_median_ms(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < std::max(1, repeats); ++i) t.push_back(ms_of(fn));
  return median(t);
}

Timing time_interleaved(const std::function<void()>& fast, const std::function<void()>& ref, int repeats, int ref_repeats,
                        bool window_peak) {
  using namespace bench_harness_local;
  Timing out;
  std::vector<double> tf, tb, tr;  // tb: side b of an A/B (tf is then side a)
  std::vector<double> bursts;      // every burst of the window's read tests
  const bool ab = !g_ab.knob.empty();
  const KnobRestore restore{ab ? g_ab.knob : "", ab ? knobs::get(g_ab.knob) : 0};
  auto side = [&](bool b) {
    if (ab) knobs::set(g_ab.knob, b ? g_ab.b : g_ab.a);
  };
  auto read_test = [&](bool rewarm) {
    out.window_tests.push_back(read_bandwidth_gbps(num_threads(), kWindowTestSeconds, &bursts));
    if (rewarm) fast();  // the test evicted the caches: one untimed call warms them again
  };
  side(true);
  if (ab) fast();  // side b's warm-up
  side(false);
  fast();
  if (ref && ref_repeats > 0) ref();
  const int fast_reps = std::max(1, repeats), rounds = std::max(fast_reps, ref ? ref_repeats : 0);
  for (int i = 0; i < rounds; ++i) {
    if (window_peak && (i == 0 || i == fast_reps / 2)) read_test(true);
    if (i < fast_reps && !ab) tf.push_back(ms_of(fast));
    if (i < fast_reps && ab)
      for (int s = 0; s < 2; ++s) {  // ABBA: a,b at even i, b,a at odd i
        const bool b = (s == 1) != (i % 2 == 1);
        side(b);
        (b ? tb : tf).push_back(ms_of(fast));
      }
    side(false);
    if (ref && i < ref_repeats) tr.push_back(ms_of(ref));
  }
  if (window_peak) read_test(false);
  out.fast_ms = median(tf);
  out.ref_ms = median(tr);
  if (ab) {
    std::vector<double> ratio;
    for (size_t i = 0; i < tf.size(); ++i) ratio.push_back(tb[i] / std::max(tf[i], 1e-9));
    out.ab = {g_ab, int(ratio.size()), median(tf), median(tb), quantile(ratio, 0.5), quantile(ratio, 0.25), quantile(ratio, 0.75)};
    g_last_ab = out.ab;
  }
  // The best of the three (the window's peak, as `ot peak` takes the best of its bursts): this VM
  // sometimes stalls a read test far below the case's own rate (1.7 and 11 GB/s beside a case
  // streaming 50 GB/s in one report on the AMD Zen 5 VM, 2026-12-01), and a median of three cannot
  // drop two such tests.
  if (window_peak) out.window_gbps = *std::max_element(out.window_tests.begin(), out.window_tests.end());
  // Beside it, the median of every burst: the case's rate is a median over calls, so this divides
  // like by like (AMD Zen 5 VM, 2026-12-01: over 4000 bursts the read test's median was 59-61 GB/s,
  // its best 76-92).
  if (window_peak) out.window_median_gbps = median(bursts);
  return out;
}

void set_bandwidth(BenchResult& r, double gbps, const Timing& t) {
  r.gbps = gbps;
  const double peak = memory_peak_gbps(r.threads);
  r.peak_fraction = peak > 0 ? gbps / peak : 0;
  r.window_peak_gbps = t.window_gbps;
  r.window_median_gbps = t.window_median_gbps;
  r.window_tests = t.window_tests;
}

BenchResult bandwidth_result(const std::string& name, const std::string& shape, const std::string& dtype, int threads, double bytes,
                             const Timing& t, const std::function<void()>& fast) {
  BenchResult r;
  r.name = name;
  r.shape = shape;
  r.dtype = dtype;
  r.threads = threads;
  r.ms = t.fast_ms;
  r.ref_ms = t.ref_ms;
  set_bandwidth(r, bytes / (t.fast_ms * 1e6), t);
  r.kernel = kernel_of_call(fast);
  return r;
}

Tensor uniform_tensor(std::mt19937& rng, DType dt, const std::vector<int64_t>& shape, float lo, float hi) {
  Tensor f = Tensor::empty(DType::f32, shape);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < f.numel(); ++i) f.ptr<float>()[i] = u(rng);
  if (dt == DType::f32) return f;
  Tensor t = Tensor::empty(dt, shape);
  convert_from_f32(f.ptr<float>(), t.ptr<void>(), dt, f.numel());
  return t;
}

BenchExtras::Value& BenchExtras::operator[](const std::string& key) {
  for (auto& [k, v] : items_)
    if (k == key) return v;
  return items_.emplace_back(key, Value{}).second;
}

void report(const BenchOptions& opt, const BenchResult& r) {
  using namespace bench_harness_local;
  double speedup = r.ref_ms > 0 && r.ms > 0 ? r.ref_ms / r.ms : 0;
  const AbTiming ab = g_last_ab;
  g_last_ab = {};
  OT_CHECK(g_ab.knob.empty() || ab.pairs > 0, "ot bench", "--ab", "a benchmark timed by the harness's interleaved timing",
           r.name, " did not alternate the knob");
  if (opt.json) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : r.extra.items()) std::visit([&j, &k](const auto& x) { j[k] = x; }, v);
    j["name"] = r.name;
    j["shape"] = r.shape;
    j["dtype"] = r.dtype;
    j["threads"] = r.threads;
    j["ms"] = r.ms;
    if (r.gbps > 0) j["gbps"] = r.gbps; else j["gflops"] = r.gflops;
    j["peak_fraction"] = r.peak_fraction;
    if (r.gbps > 0 && r.window_peak_gbps > 0) {
      j["window_peak_gbps"] = r.window_peak_gbps;
      j["window_peak_fraction"] = r.gbps / r.window_peak_gbps;
      j["window_tests_gbps"] = r.window_tests;
    }
    if (r.gbps > 0 && r.window_median_gbps > 0) {
      j["window_median_gbps"] = r.window_median_gbps;
      j["window_median_fraction"] = r.gbps / r.window_median_gbps;
    }
    j["speedup_vs_ref"] = speedup;
    j["ref_ms"] = r.ref_ms;
    j["kernel"] = r.kernel;
    if (ab.pairs > 0) {
      j["ab_knob"] = ab.spec.knob;
      j["ab_a"] = ab.spec.a;
      j["ab_b"] = ab.spec.b;
      j["ab_pairs"] = ab.pairs;
      j["ab_a_ms"] = ab.a_ms;
      j["ab_b_ms"] = ab.b_ms;
      j["ab_ratio_b_over_a_median"] = ab.ratio_median;
      j["ab_ratio_b_over_a_p25"] = ab.ratio_p25;
      j["ab_ratio_b_over_a_p75"] = ab.ratio_p75;
      if (r.gbps > 0 && ab.b_ms > 0) j["ab_b_gbps"] = r.gbps * ab.a_ms / ab.b_ms;  // the same bytes in side b's time
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    static bool header = false;
    if (!header) {
      std::printf("%-28s %-22s %-5s %3s %10s %10s %9s %7s %9s %6s %9s %6s %8s  %s\n", "case", "shape", "dtype", "thr", "ms", "ref_ms",
                  "rate", "peak%", "window", "win%", "wmed", "med%", "speedup", "kernel");
      header = true;
    }
    char rate[32];
    if (r.gbps > 0) std::snprintf(rate, sizeof rate, "%.1fGB/s", r.gbps);
    else std::snprintf(rate, sizeof rate, "%.1fGF/s", r.gflops);
    // window: the read bandwidth measured beside this case (GB/s results, best burst), win%: the rate's
    // share of it; wmed / med%: the same for the median burst.
    char window[32] = "-", win[16] = "-", wmed[32] = "-", med[16] = "-";
    if (r.gbps > 0 && r.window_peak_gbps > 0) {
      std::snprintf(window, sizeof window, "%.1fGB/s", r.window_peak_gbps);
      std::snprintf(win, sizeof win, "%.1f%%", 100 * r.gbps / r.window_peak_gbps);
    }
    if (r.gbps > 0 && r.window_median_gbps > 0) {
      std::snprintf(wmed, sizeof wmed, "%.1fGB/s", r.window_median_gbps);
      std::snprintf(med, sizeof med, "%.1f%%", 100 * r.gbps / r.window_median_gbps);
    }
    std::printf("%-28s %-22s %-5s %3d %10.3f %10.3f %9s %6.1f%% %9s %6s %9s %6s %7.2fx  %s\n", r.name.c_str(), r.shape.c_str(),
                r.dtype.c_str(), r.threads, r.ms, r.ref_ms, rate, 100 * r.peak_fraction, window, win, wmed, med, speedup, r.kernel.c_str());
    // The row is side a; b/a < 1: b is faster.
    if (ab.pairs > 0) {
      char brate[48] = "";
      if (r.gbps > 0 && ab.b_ms > 0) std::snprintf(brate, sizeof brate, " (%.1fGB/s)", r.gbps * ab.a_ms / ab.b_ms);
      std::printf("  %-26s ab %s: a=%lld %.3f ms, b=%lld %.3f ms%s, b/a median %.3f (25-75%% %.3f-%.3f, %d pairs)\n", "", ab.spec.knob.c_str(),
                  (long long)ab.spec.a, ab.a_ms, (long long)ab.spec.b, ab.b_ms, brate, ab.ratio_median, ab.ratio_p25, ab.ratio_p75, ab.pairs);
    }
  }
  std::fflush(stdout);
}

std::string kernel_of_call(const std::function<void()>& fn) {
  trace::set_timeline(true);
  fn();
  std::vector<trace::Event> ev = trace::take_events();
  trace::set_timeline(false);
  return ev.empty() ? "?" : ev.back().kernel;  // scopes end inner first: the last is the operator's
}

void run_ref_cases(const BenchOptions& opt, const std::vector<RefCase>& cases) {
  for (const RefCase& c : cases) {
    if (!opt.selected(c.name)) continue;
    auto ref = [&c] {
      cpu::ScopedForceRef on(true);
      c.fast();
    };
    Timing t = time_interleaved(c.fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref),
                                opt.repeats > 0 ? opt.repeats : 20, opt.no_ref ? 0 : 1, !c.flops);
    BenchResult r;
    if (c.flops) {
      r.name = c.name, r.shape = c.shape, r.dtype = c.dtype, r.threads = num_threads();
      r.ms = t.fast_ms, r.ref_ms = t.ref_ms;
      r.gflops = c.work / (t.fast_ms * 1e6);
      const double peak = matrix_peak_gflops("fp32", r.threads);
      r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
      r.kernel = kernel_of_call(c.fast);
    } else {
      r = bandwidth_result(c.name, c.shape, c.dtype, num_threads(), c.work, t, c.fast);
      r.extra["bytes"] = c.work;
    }
    report(opt, r);
  }
}

}  // namespace ot::cli
