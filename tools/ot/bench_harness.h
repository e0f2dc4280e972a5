// Shared pieces of every `ot bench <op>`: interleaved timing with medians, this machine's measured
// peaks, and the one output form (table row or JSON line) all benchmarks use.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"

namespace ot::cli {

// Medians of interleaved runs: fast, ref, fast, ref, ... after one warm-up each.
struct Timing { double fast_ms = 0, ref_ms = 0; };
Timing time_interleaved(const std::function<void()>& fast, const std::function<void()>& ref, int repeats, int ref_repeats);
double time_median_ms(const std::function<void()>& fn, int repeats);
// The kernel an operator reports (trace::OpScope::kernel) for one call of fn: its outermost scope.
std::string kernel_of_call(const std::function<void()>& fn);

// This machine's measured peaks (from `ot peak`, cached; measured briefly when no cache exists).
struct MachinePeak {
  double amx_bf16_gflops_1t = 0, amx_bf16_gflops_all = 0;      // 0 when the CPU has no AMX
  double avx512_bf16_gflops_1t = 0, avx512_bf16_gflops_all = 0;  // vdpbf16ps
  double fma_f32_gflops_1t = 0, fma_f32_gflops_all = 0;
  double mem_gbps_1t = 0, mem_gbps_all = 0;
};
const MachinePeak& machine_peak();
// Peak GFLOP/s of the best matrix path for `dtype` ("bf16", "fp16", "fp32") at `threads`.
double matrix_peak_gflops(const std::string& dtype, int threads);
double memory_peak_gbps(int threads);

struct BenchResult {
  std::string name, shape, dtype;
  int threads = 1;
  double ms = 0, ref_ms = 0;
  double gflops = 0;  // set one of gflops / gbps
  double gbps = 0;
  double peak_fraction = 0;
  std::string kernel;
  nlohmann::json extra = nlohmann::json::object();  // op-specific keys (bytes_sent, ...)
};
// Prints a table row (with a header before the first row) or a JSON line.
void report(const BenchOptions& opt, const BenchResult& r);

}  // namespace ot::cli
