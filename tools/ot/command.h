// Sub-command registry of the `ot` tool: each file registers its own commands, so adding one never
// touches main.cpp. Benchmarks register under `ot bench <op>` with the common options attached.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ot::cli {

// Adds a top-level sub-command to `app` (and its callback).
using CommandSetup = std::function<void(CLI::App& app)>;
struct RegisterCommand {
  RegisterCommand(const char* name, CommandSetup setup);
};

// Options every `ot bench <op>` accepts.
struct BenchOptions {
  std::string case_filter;  // --case SUBSTRING: run only cases whose name contains it
  int threads = 0;          // --threads T (0: all)
  bool json = false;        // --json: one JSON object per line
  int repeats = 0;          // --repeats R (0: the benchmark's default)
  bool no_ref = false;      // --no-ref: skip the reference path (speed-up then reported as 0)
  std::string ab;           // --ab KNOB=A,B: alternate an internal tuning knob call by call (bench_harness.h)
  bool selected(const std::string& name) const { return case_filter.empty() || name.find(case_filter) != std::string::npos; }
};

// setup adds op-specific options to `sub` and returns the function to run once parsed.
using BenchSetup = std::function<std::function<int()>(CLI::App* sub, const BenchOptions& common)>;
// op is the operator's own name (one spelling across C++, torch, CLI); aliases are older names kept
// so existing scripts still run.
struct RegisterBench {
  RegisterBench(const char* op, const char* description, BenchSetup setup, std::vector<std::string> aliases = {});
};

// Used by main.cpp.
void build_app(CLI::App& app, int* exit_code);

}  // namespace ot::cli
