// `ot demo` entry points shared by the single-process run (demo.cpp) and the expert-parallel run
// (demo_ep.cpp, compiled only with MPI).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "demo_config.h"
#include "demo_model.h"
#include "ot/trace.h"

namespace ot::demo {

// Hooks the expert-parallel run sets; all empty in a single process.
struct RunContext {
  int rank = 0, world = 1;
  const ExpertParallel* ep = nullptr;                                         // expert-parallel MoE layers
  std::function<void(Model&)> attach;                                         // after the weights are built
  std::function<void(std::vector<trace::Event>&)> after_run;                  // e.g. adds communication events
  std::function<void(const std::string&, const std::vector<trace::Event>&)> write_trace;  // one file for all ranks
  std::function<bool(const Verifier&, double)> verify_ok;                     // agreed over the ranks
  bool compare_isolated = false;                                              // ot demo --compare-isolated
};

// Returns the exit code (0, or 1 when verification fails).
int run_demo(const DemoConfig& cfg, const std::string& trace_file, RunContext& ctx);
// Under mpirun: MPI set-up, expert-parallel MoE layers, then run_demo (demo_ep.cpp).
int run_demo_ep(const DemoConfig& cfg, const std::string& trace_file);

}  // namespace ot::demo
