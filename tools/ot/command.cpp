#include "command.h"

#include <map>
#include <memory>
#include <vector>

#include "bench_harness.h"
#include "ot/parallel.h"

namespace ot::cli {

namespace {
struct BenchEntry { std::string op, description; BenchSetup setup; std::vector<std::string> aliases; };
std::vector<std::pair<std::string, CommandSetup>>& commands() {
  static std::vector<std::pair<std::string, CommandSetup>> v;
  return v;
}
std::vector<BenchEntry>& benches() {
  static std::vector<BenchEntry> v;
  return v;
}
}  // namespace

RegisterCommand::RegisterCommand(const char* name, CommandSetup setup) { commands().emplace_back(name, std::move(setup)); }
RegisterBench::RegisterBench(const char* op, const char* description, BenchSetup setup, std::vector<std::string> aliases) {
  benches().push_back({op, description, std::move(setup), std::move(aliases)});
}

void build_app(CLI::App& app, int* exit_code) {
  for (auto& [name, setup] : commands()) setup(app);
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
    auto run = std::make_shared<std::function<int()>>(e.setup(sub, *o));
    sub->callback([o, run, exit_code] {
      if (o->threads > 0) ot::set_num_threads(o->threads);
      set_ab(o->ab.empty() ? AbSpec{} : parse_ab(o->ab));
      *exit_code = (*run)();
    });
  }
}

}  // namespace ot::cli
