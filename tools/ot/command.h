// Sub-command registry of the `ot` tool: each file registers its own commands, so adding one never
// touches main.cpp. Benchmarks register under `ot bench <op>` with the common options attached.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace ot::cli {

// The options of one command: a narrow front to CLI11, so that only command.cpp and main.cpp
// include it (Debian's CLI11 2.1 is header-only, ~6 s of compile in every file that includes it).
class Options {
 public:
  explicit Options(CLI::App* app) : app_(app) {}
  // --name VALUE into v; T is int, int64_t, uint64_t, float, double, std::string or a
  // std::vector of std::string (repeated values) or int64_t (comma-separated).
  template <class T>
  Options& value(const std::string& name, T& v, const std::string& help);
  // --name VALUE into v, one of `choices`.
  Options& choice(const std::string& name, std::string& v, const std::vector<std::string>& choices, const std::string& help);
  Options& flag(const std::string& name, bool& v, const std::string& help);
  // --help shows the last option's initial value.
  Options& show_default();

 private:
  CLI::App* app_;
  CLI::Option* last_ = nullptr;
};

// What a command runs once its options are parsed: the process's exit code.
using Run = std::function<int()>;

// A top-level sub-command: setup adds its options and returns what it runs.
using CommandSetup = std::function<Run(Options& options)>;
struct RegisterCommand {
  RegisterCommand(const char* name, const char* description, CommandSetup setup);
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

// setup adds op-specific options and returns the function to run once parsed.
using BenchSetup = std::function<Run(Options& options, const BenchOptions& common)>;
// op is the operator's own name (one spelling across C++, torch, CLI); aliases are older names kept
// so existing scripts still run.
struct RegisterBench {
  RegisterBench(const char* op, const char* description, BenchSetup setup, std::vector<std::string> aliases = {});
};

// Used by main.cpp.
void build_app(CLI::App& app, int* exit_code);

}  // namespace ot::cli
