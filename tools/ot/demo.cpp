// `ot demo`: the library's main job in one run. A Qwen3-Next / Qwen3.5-like stack of decoder blocks
// (Gated DeltaNet mixer + MoE FFN) with random weights: a batched variable-length prefill, then decode
// steps on the GDN state cache; per-phase operator tables, a reference-path verification of a subset,
// an optional Chrome trace (--trace) and, under mpirun with --ep, expert-parallel MoE layers.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "command.h"
#include "demo.h"
#include "demo_config.h"
#include "demo_model.h"
#include "demo_stats.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "progress.h"

namespace ot::demo {

namespace demo_local {

struct Options {
  std::string config_file, trace_file, weights;
  std::vector<std::string> knobs;  // NAME=VALUE internal tuning knobs (A/B of the whole model across runs)
  bool print_config = false, no_verify = false, ep = false, compare_isolated = false;
  int64_t decode_steps = -1;
  int threads = 0;
};

// Prompt tokens: a deterministic sequence of ids per run seed.
std::vector<int32_t> prompt_tokens(const Batch& b, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (int64_t i = 0; i < b.tokens(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(int32_t((s >> 33) % uint64_t(vocab)));
  }
  return t;
}

// Sequence n lives in cache slot 2n + 1 of 2N slots: the slot indirection is exercised.
Batch make_batch(const std::vector<int64_t>& lengths) {
  Batch b;
  b.lengths = lengths;
  for (size_t n = 0; n < lengths.size(); ++n) b.slots.push_back(int32_t(2 * n + 1));
  return b;
}
Batch decode_batch(const Batch& prefill) {
  Batch b = prefill;
  for (auto& l : b.lengths) l = 1;
  return b;
}

double ms_since(int64_t t0) { return (trace::now_ns() - t0) / 1e6; }

void print_header(const DemoConfig& c, const RunContext& ctx) {
  const auto& m = c.model;
  const double routed = double(m.moe.experts) * 3 * m.hidden * m.moe.intermediate, shared = 3.0 * m.hidden * m.moe.shared_intermediate;
  const double gdn = double(m.hidden) * (2 * m.gdn.key_heads * m.gdn.key_head_dim + 3 * m.gdn.value_heads * m.gdn.value_head_dim +
                                         2 * m.gdn.value_heads);
  const double params = m.layers * (routed + shared + gdn + double(m.moe.experts) * m.hidden) + 2.0 * m.vocab * m.hidden;
  const double active = m.layers * (double(m.moe.top_k) * 3 * m.hidden * m.moe.intermediate + shared + gdn) + 2.0 * m.vocab * m.hidden;
  std::printf("ot demo: %lld decoder blocks (Gated DeltaNet + MoE FFN), hidden %lld, %s, %.0fM parameters (%.0fM active per token)\n",
              (long long)m.layers, (long long)m.hidden, dtype_key(m.dtype), params / 1e6, active / 1e6);
  std::printf("  GDN: HK %lld, HV %lld, DK %lld, DV %lld | MoE: E %lld, top-%lld, I %lld, shared I %lld, experts %s | vocab %lld\n",
              (long long)m.gdn.key_heads, (long long)m.gdn.value_heads, (long long)m.gdn.key_head_dim, (long long)m.gdn.value_head_dim,
              (long long)m.moe.experts, (long long)m.moe.top_k, (long long)m.moe.intermediate, (long long)m.moe.shared_intermediate,
              m.moe.quantised() ? m.moe.expert_weights.c_str() : dtype_key(m.dtype), (long long)m.vocab);
  std::printf("  machine: %s, %d threads%s\n", cpu::isa_name(cpu::active_isa()), num_threads(),
              ctx.world > 1 ? (", rank " + std::to_string(ctx.rank) + " of " + std::to_string(ctx.world) + " (expert parallel)").c_str() : "");
}

}  // namespace demo_local

int run_demo(const DemoConfig& cfg, const std::string& trace_file, RunContext& ctx) {
  using namespace demo_local;
  const bool root = ctx.rank == 0;
  if (root) print_header(cfg, ctx);
  const int64_t steps = cfg.run.decode_steps;
  cli::Progress bar("building weights", (cfg.verify.enabled ? 1 + cfg.verify.decode_steps : 0) + 1 + steps);
  int64_t t0 = trace::now_ns();
  Model model(cfg, cfg.verify.enabled ? cfg.verify.layers : 0, ctx.ep);
  if (ctx.attach) ctx.attach(model);
  if (root) std::printf("  weights built and packed in %.0f ms\n", ms_since(t0));

  // Verification first (it also warms up allocators and caches for the timed run).
  Verifier verifier;
  if (cfg.verify.enabled) {
    bar.set_label("verifying against the reference");
    Batch b = make_batch(cfg.verify.prefill_lengths);
    model.reset_cache(2 * int64_t(b.lengths.size()));
    std::vector<int32_t> next = model.step(prompt_tokens(b, cfg.model.vocab, cfg.run.seed + 1 + 7919 * uint64_t(ctx.rank)), b, true, &verifier, cfg.verify.layers);
    bar.tick();
    Batch d = decode_batch(b);
    for (int64_t s = 0; s < cfg.verify.decode_steps; ++s, bar.tick()) next = model.step(next, d, false, &verifier, cfg.verify.layers);
    model.take_work();
  }

  // Timed run with the timeline on.
  std::vector<trace::Event> all;
  trace::take_events();
  trace::set_timeline(true);
  const std::string dt = dtype_key(cfg.model.dtype);
  const int threads = num_threads();
  Batch b = make_batch(cfg.run.prefill_lengths);
  model.reset_cache(2 * int64_t(b.lengths.size()));
  // Each rank prefills its own prompts (rank 0's are the single-process run's).
  std::vector<int32_t> prompt = prompt_tokens(b, cfg.model.vocab, cfg.run.seed + 7919 * uint64_t(ctx.rank));
  bar.set_label("prefill");
  int64_t p0 = trace::now_ns();
  std::vector<int32_t> next = model.step(prompt, b, true);
  const double prefill_ms = ms_since(p0);
  trace::record({"prefill", "phase", "", "", 0, 0, p0, trace::now_ns() - p0, 0});
  bar.tick();
  std::vector<trace::Event> ev = trace::take_events();
  attach_work(ev, model.take_work());
  PhaseStats prefill = summarize("prefill", ev, prefill_ms, b.tokens() * ctx.world, 1);
  all.insert(all.end(), ev.begin(), ev.end());

  bar.set_label("decode");
  Batch d = decode_batch(b);
  std::vector<std::vector<int32_t>> generated(b.lengths.size());
  int64_t d0 = trace::now_ns();
  for (int64_t s = 0; s < steps; ++s) {
    for (size_t n = 0; n < next.size(); ++n) generated[n].push_back(next[n]);
    int64_t s0 = trace::now_ns();
    next = model.step(next, d, false);
    trace::record({"decode step " + std::to_string(s), "phase", "", "", 0, 0, s0, trace::now_ns() - s0, 0});
    bar.tick();
  }
  const double decode_ms = ms_since(d0);
  trace::set_timeline(false);
  ev = trace::take_events();
  attach_work(ev, model.take_work());
  PhaseStats decode = summarize("decode", ev, decode_ms, steps * int64_t(b.lengths.size()) * ctx.world, steps);
  all.insert(all.end(), ev.begin(), ev.end());
  bar.finish();

  // Each operator again in isolation at the same shapes: one prefill and one decode step with
  // every call repeated back to back (ctx.compare_isolated; untimed, its outputs unused).
  Isolation iso_prefill, iso_decode;
  if (ctx.compare_isolated) {
    model.reset_cache(2 * int64_t(b.lengths.size()));
    model.set_isolation(&iso_prefill);
    std::vector<int32_t> n2 = model.step(prompt, b, true);
    if (steps > 0) {
      model.set_isolation(&iso_decode);
      model.step(n2, d, false);
    }
    model.set_isolation(nullptr);
    trace::take_events();
    model.take_work();
  }

  if (root) {
    std::printf("\n== prefill: %zu sequences (lengths", b.lengths.size());
    for (auto l : b.lengths) std::printf(" %lld", (long long)l);
    std::printf("), %lld tokens, varlen cu_seqlens, one batched call per operator and layer\n", (long long)b.tokens());
    print_phase(prefill, dt, threads, Roofline::compute);
    if (ctx.compare_isolated) {
      std::printf("\n  prefill operators in the pipeline vs in isolation (same shapes and inputs):\n");
      print_isolated(prefill, iso_prefill);
    }
    if (steps > 0) {
      std::printf("\n== decode: %lld steps x %zu sequences, one token each, GDN state cache (slot per sequence)\n", (long long)steps,
                  b.lengths.size());
      print_phase(decode, dt, threads, Roofline::memory);
      if (ctx.compare_isolated) {
        std::printf("\n  decode operators in the pipeline vs in isolation (one step, same shapes and inputs):\n");
        print_isolated(decode, iso_decode);
      }
      std::printf("\n  greedy tokens of sequence 0:");
      for (size_t i = 0; i < generated[0].size() && i < 16; ++i) std::printf(" %d", generated[0][i]);
      std::printf("%s\n", generated[0].size() > 16 ? " ..." : "");
    }
  }
  if (ctx.after_run) ctx.after_run(all);
  if (!trace_file.empty()) {
    if (ctx.write_trace) ctx.write_trace(trace_file, all);
    else trace::write_chrome_trace(trace_file, all, 0);
    if (root) std::printf("\n  timeline: %zu events written to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", all.size(),
                          trace_file.c_str());
  }
  bool ok = true;
  if (cfg.verify.enabled) {
    if (root) {
      std::printf("\n== verification: %zu sequences (lengths", cfg.verify.prefill_lengths.size());
      for (auto l : cfg.verify.prefill_lengths) std::printf(" %lld", (long long)l);
      std::printf(") + %lld decode steps through the first %lld block(s) and the head; each call rerun on the reference path with the same inputs\n",
                  (long long)cfg.verify.decode_steps, (long long)cfg.verify.layers);
    }
    ok = ctx.verify_ok ? ctx.verify_ok(verifier, cfg.tolerance()) : print_verification(verifier, cfg.tolerance());
    if (root) std::printf("%s\n", ok ? "verification passed" : "verification FAILED: an operator differs from its reference beyond tolerance");
  }
  return ok ? 0 : 1;
}

namespace demo_local {

const cli::RegisterCommand reg("demo", "Run a Qwen3-Next-like GDN + MoE decoder stack: prefill, decode, per-operator tables, verification",
                              [](cli::Options& sub) -> cli::Run {
  auto opt = std::make_shared<Options>();
  sub.value("--config", opt->config_file, "JSON config (keys as printed by --print-config; missing keys keep the default)");
  sub.flag("--print-config", opt->print_config, "Print the configuration as JSON and exit");
  sub.value("--trace", opt->trace_file, "Write the timeline of every operator call as a Chrome trace (JSON)");
  sub.flag("--no-verify", opt->no_verify, "Skip the reference-path verification");
  sub.value("--decode-steps", opt->decode_steps, "Override run.decode_steps");
  sub.value("--threads", opt->threads, "Threads (0 = all; overrides run.threads)");
  sub.flag("--compare-isolated", opt->compare_isolated,
           "After the timed run, repeat every operator call of one prefill and one decode step in isolation and print pipeline vs isolated time");
  sub.value("--weights", opt->weights, "Routed experts: float (model.dtype), int8, w8a8, int4, int4-g32, int4-g64, int4-g128 (overrides model.moe.expert_weights)");
  sub.flag("--ep", opt->ep, "Under mpirun: run the MoE layers expert-parallel across the ranks");
  sub.value("--knob", opt->knobs, "NAME=VALUE: set an internal tuning knob for this run (repeatable; the names: `ot bench gemm --ab x=0,1` lists them)");
  return [opt] {
    for (const std::string& spec : opt->knobs) cli::set_knob("ot demo", spec);
    DemoConfig cfg = opt->config_file.empty() ? DemoConfig{} : load_config(opt->config_file);
    if (opt->decode_steps >= 0) cfg.run.decode_steps = opt->decode_steps;
    if (opt->threads > 0) cfg.run.threads = opt->threads;
    if (opt->no_verify) cfg.verify.enabled = false;
    if (!opt->weights.empty()) cfg.model.moe.expert_weights = opt->weights;
    validate(cfg);
    if (opt->print_config) {
      std::printf("%s\n", config_to_json(cfg).dump(2).c_str());
      return 0;
    }
    if (cfg.run.threads > 0) set_num_threads(cfg.run.threads);
    int rc = opt->ep ? run_demo_ep(cfg, opt->trace_file) : [&] {
      RunContext ctx;
      ctx.compare_isolated = opt->compare_isolated;
      return run_demo(cfg, opt->trace_file, ctx);
    }();
    return rc;
  };
});

}  // namespace demo_local
}  // namespace ot::demo

#ifndef OT_HAVE_EP
namespace ot::demo {
int run_demo_ep(const DemoConfig&, const std::string&) {
  throw Error("ot demo", "--ep", "a build with MPI expert parallelism (OT_BUILD_MPI=ON with OpenMPI and src/ep)", "this build has none");
}
}  // namespace ot::demo
#endif
