// Shared pieces of every `ot bench <op>`: interleaved timing with medians, this machine's measured
// peaks, and the one output form (table row or JSON line) all benchmarks use.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "command.h"
#include "ot/tensor.h"

namespace ot::cli {

// A tensor of dtype dt whose values are uniform on [lo, hi) (drawn in fp32, then converted).
Tensor uniform_tensor(std::mt19937& rng, DType dt, const std::vector<int64_t>& shape, float lo, float hi);

// Medians of interleaved runs: fast, ref, fast, ref, ... after one warm-up each. With window_peak,
// `ot peak`'s read test also runs before, halfway through and after the timed runs (on the same
// threads; one untimed fast() after each, so a case that lives in cache starts warm again):
// window_gbps is the best of the three, the peak bandwidth of this window of the machine's state;
// window_median_gbps the median of every burst of the three tests pooled, the same statistic as the
// case's own median over calls.
// In-process A/B (`ot bench <op> --ab <knob>=<a>,<b>`): every timed repetition of fast runs once
// with the knob at a and once at b, in ABBA order (pair i is a,b for even i, b,a for odd i, so a
// drift within the run cancels); each pair gives a ratio b/a.
struct AbSpec {
  std::string knob;  // empty: no A/B
  int64_t a = 0, b = 0;
};
// Parses "<knob>=<a>,<b>" (ot::Error for another form, an unknown knob or a value out of its range).
AbSpec parse_ab(const std::string& spec);
// --knob NAME=VALUE (`who`: the command, for its errors): sets the knob after checking its range.
void set_knob(const char* who, const std::string& spec);
void set_ab(const AbSpec& spec);  // the A/B of this process's benchmarks
struct AbTiming {
  AbSpec spec;
  int pairs = 0;
  double a_ms = 0, b_ms = 0;                        // each side's median
  double ratio_median = 0, ratio_p25 = 0, ratio_p75 = 0;  // of the paired ratios b/a
};
struct Timing {
  double fast_ms = 0, ref_ms = 0;    // with an A/B, fast_ms is side a's median
  double window_gbps = 0;            // 0 unless window_peak
  double window_median_gbps = 0;     // 0 unless window_peak
  std::vector<double> window_tests;  // the read tests, in order
  AbTiming ab;                       // pairs > 0 when an A/B ran
};
Timing time_interleaved(const std::function<void()>& fast, const std::function<void()>& ref, int repeats, int ref_repeats,
                        bool window_peak = false);
double time_median_ms(const std::function<void()>& fn, int repeats);
// The kernel an operator reports (trace::OpScope::kernel) for one call of fn: its outermost scope.
std::string kernel_of_call(const std::function<void()>& fn);

// This machine's measured peaks (from `ot peak`, cached; measured briefly when no cache exists).
struct MachinePeak {
  double amx_bf16_gflops_1t = 0, amx_bf16_gflops_all = 0;      // 0 when the CPU has no AMX
  double avx512_bf16_gflops_1t = 0, avx512_bf16_gflops_all = 0;  // vdpbf16ps
  double fma_f32_gflops_1t = 0, fma_f32_gflops_all = 0;
  double vnni_int8_gops_1t = 0, vnni_int8_gops_all = 0;  // vpdpbusd (0 without AVX512_VNNI)
  double mem_gbps_1t = 0, mem_gbps_all = 0;
};
const MachinePeak& machine_peak();
// Peak GFLOP/s of the best matrix path for `dtype` ("bf16", "fp16", "fp32"; "int8": the vpdpbusd
// rate in GOP/s, falling back to bf16's where there is none) at `threads`.
double matrix_peak_gflops(const std::string& dtype, int threads);
double memory_peak_gbps(int threads);
// Streaming read bandwidth now, GB/s: `ot peak`'s read test (the best of bursts of 8 MiB of
// sequential reads per thread from a 512 MiB buffer, for `seconds`) on `threads` threads. `bursts`,
// when given, gets every burst's rate appended.
double read_bandwidth_gbps(int threads, double seconds, std::vector<double>* bursts = nullptr);
// Seconds of one read test beside a case (time_interleaved's window_peak).
constexpr double kWindowTestSeconds = 0.05;

// A result's op-specific keys (bytes_sent, ...) for its JSON line, in the order they were set.
// Kept free of nlohmann/json so the benchmarks do not each compile it.
class BenchExtras {
 public:
  using Value = std::variant<int64_t, double, std::string>;
  Value& operator[](const std::string& key);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

struct BenchResult {
  std::string name, shape, dtype;
  int threads = 1;
  double ms = 0, ref_ms = 0;
  double gflops = 0;  // set one of gflops / gbps
  double gbps = 0;
  double peak_fraction = 0;        // of the cached peak (`ot peak`'s best ever)
  double window_peak_gbps = 0;     // GB/s results: Timing::window_gbps (0: not measured)
  double window_median_gbps = 0;   // GB/s results: Timing::window_median_gbps (0: not measured)
  std::vector<double> window_tests;
  std::string kernel;
  BenchExtras extra;
};
// A GB/s result (r.threads set): its rate, the fraction of the cached memory peak at r.threads, and
// the window bandwidth time_interleaved measured beside it (t: run with window_peak).
void set_bandwidth(BenchResult& r, double gbps, const Timing& t);
// The GB/s result of a case that moves `bytes` a call, timed by t, on `threads` threads: the times,
// set_bandwidth, and the kernel that one call of fast reports.
BenchResult bandwidth_result(const std::string& name, const std::string& shape, const std::string& dtype, int threads, double bytes,
                             const Timing& t, const std::function<void()>& fast);
// A case timed against the operator's fp64 path (OT_FORCE_REF, once a round): GFLOP/s of `work`
// FLOPs against the fp32 matrix peak when `flops`, else GB/s of `work` bytes (the read window
// measured beside it). run_ref_cases times and reports the selected ones (20 repetitions unless
// --repeats says otherwise).
struct RefCase {
  std::string name, shape, dtype;
  double work = 0;
  bool flops = false;
  std::function<void()> fast;
};
void run_ref_cases(const BenchOptions& opt, const std::vector<RefCase>& cases);
// Prints a table row (with a header before the first row) or a JSON line. With an A/B, the case's
// last time_interleaved's AbTiming goes with it (JSON ab_* fields; a line under the text row); a
// case that did not time through time_interleaved is then an error.
void report(const BenchOptions& opt, const BenchResult& r);

}  // namespace ot::cli
