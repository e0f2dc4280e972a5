// Per-phase operator tables of `ot demo`, built from the timeline (ot::trace events): calls, total
// time, share of the phase, GFLOP/s or GB/s and the fraction of this machine's peak for the bound
// that applies (compute when the operator's FLOPs per byte exceed the machine balance, else memory).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "demo_model.h"
#include "ot/trace.h"

namespace ot::demo {

struct OpRow {
  std::string name;  // nested calls (an operator called inside another) as "parent/child"
  int depth = 0;
  int64_t calls = 0;
  double ms = 0, flops = 0, bytes = 0;
  std::string kernel;
};

struct PhaseStats {
  std::string phase;
  double wall_ms = 0;
  int64_t tokens = 0, steps = 1;
  std::vector<OpRow> rows;  // in order of first call; children follow their parent
};

// Fills FLOPs/bytes of events that lack them from `work` (same name, call order).
void attach_work(std::vector<trace::Event>& events, const std::vector<Work>& work);
PhaseStats summarize(const std::string& phase, const std::vector<trace::Event>& events, double wall_ms, int64_t tokens, int64_t steps);
// What a phase is judged against: prefill's counted FLOPs against the matrix peak, decode's counted
// bytes (weights touched, states, caches, activations) against the read bandwidth.
enum class Roofline { compute, memory };
// dtype: "bf16"/"fp16"/"fp32" for the matrix peak; threads for both peaks. Ends with the phase's
// roofline line: its operators' counted work over the phase's wall time, as a fraction of the bound.
void print_phase(const PhaseStats& s, const std::string& dtype, int threads, Roofline bound);
// Per top-level operator of a phase: its time per call in the pipeline against the same operator
// repeated in isolation on the same inputs (Isolation), and the pipeline's rate as a fraction of the
// isolated one (isolated ms / pipeline ms); operators below 0.85 are marked.
void print_isolated(const PhaseStats& s, const Isolation& iso);
// Returns false when an operator's error exceeds tol.
bool print_verification(const Verifier& v, double tol);

}  // namespace ot::demo
