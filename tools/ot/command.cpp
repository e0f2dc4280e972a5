#include "command.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "bench_harness.h"
#include "ot/parallel.h"

namespace ot::cli {

template <class T>
Options& Options::value(const std::string& name, T& v, const std::string& help) {
  last_ = app_->add_option(name, v, help);
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) last_->delimiter(',');
  return *this;
}
template Options& Options::value(const std::string&, int&, const std::string&);
template Options& Options::value(const std::string&, int64_t&, const std::string&);
template Options& Options::value(const std::string&, uint64_t&, const std::string&);
template Options& Options::value(const std::string&, float&, const std::string&);
template Options& Options::value(const std::string&, double&, const std::string&);
template Options& Options::value(const std::string&, std::string&, const std::string&);
template Options& Options::value(const std::string&, std::vector<std::string>&, const std::string&);
template Options& Options::value(const std::string&, std::vector<int64_t>&, const std::string&);

Options& Options::choice(const std::string& name, std::string& v, const std::vector<std::string>& choices, const std::string& help) {
  last_ = app_->add_option(name, v, help)->check(CLI::IsMember(choices));
  return *this;
}

Options& Options::flag(const std::string& name, bool& v, const std::string& help) {
  last_ = app_->add_flag(name, v, help);
  return *this;
}

Options& Options::show_default() {
  if (last_) last_->capture_default_str();
  return *this;
}

namespace command_local {
struct CommandEntry { std::string name, description; CommandSetup setup; };
struct BenchEntry { std::string op, description; BenchSetup setup; std::vector<std::string> aliases; };
std::vector<CommandEntry>& commands() {
  static std::vector<CommandEntry> v;
  return v;
}
std::vector<BenchEntry>& benches() {
  static std::vector<BenchEntry> v;
  return v;
}
}  // namespace command_local

RegisterCommand::RegisterCommand(const char* name, const char* description, CommandSetup setup) {
  command_local::commands().push_back({name, description, std::move(setup)});
}
RegisterBench::RegisterBench(const char* op, const char* description, BenchSetup setup, std::vector<std::string> aliases) {
  command_local::benches().push_back({op, description, std::move(setup), std::move(aliases)});
}

void build_app(CLI::App& app, int* exit_code) {
  using namespace command_local;
  for (auto& c : commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    Options options(sub);
    auto run = std::make_shared<Run>(c.setup(options));
    sub->callback([run, exit_code] { *exit_code = (*run)(); });
  }
  if (benches().empty()) return;
  CLI::App* bench = app.add_subcommand("bench", "Benchmark an operator against its reference (GFLOP/s or GB/s, peak fraction, speed-up)");
  bench->require_subcommand(1);
  static std::vector<std::unique_ptr<BenchOptions>> opts;
  for (auto& e : benches()) {
    CLI::App* sub = bench->add_subcommand(e.op, e.description);
    for (const auto& a : e.aliases) sub->alias(a);
    opts.push_back(std::make_unique<BenchOptions>());
    BenchOptions* o = opts.back().get();
    sub->add_option("--case", o->case_filter, "Run only cases whose name contains this");
    sub->add_option("--threads", o->threads, "Threads (0 = all)");
    sub->add_flag("--json", o->json, "One JSON object per line");
    sub->add_option("--repeats", o->repeats, "Timed repetitions (median reported)");
    sub->add_flag("--no-ref", o->no_ref, "Skip the reference path");
    sub->add_option("--ab", o->ab,
                    "KNOB=A,B: time each repetition with an internal tuning knob at A and at B (ABBA order), report both medians "
                    "and the paired ratios B/A (docs/gemm.md, \"In-process A/B\")");
    Options options(sub);
    auto run = std::make_shared<Run>(e.setup(options, *o));
    sub->callback([o, run, exit_code] {
      if (o->threads > 0) ot::set_num_threads(o->threads);
      set_ab(o->ab.empty() ? AbSpec{} : parse_ab(o->ab));
      *exit_code = (*run)();
    });
  }
}

}  // namespace ot::cli
