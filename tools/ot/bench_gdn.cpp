// `ot bench gdn_chunk_fwd` and `ot bench gdn_decode` at Qwen3.5 shapes (HK 16, HV 32, DK = DV = 128).
//
// gdn_chunk_fwd: GFLOP/s by the spec's section 11 forward formula; the reference is the fp64 token
// recurrence, timed on a slice (HK 1, HV 2, at most 256 tokens per sequence) and scaled linearly
// to the full shape (its cost is exactly linear in tokens and heads) - printed as ref_ms.
// gdn_decode: one token per sequence from an fp32 state cache; GB/s of state traffic (read + write
// of every touched state) against the machine's memory peak; the reference is the fp64 path.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "ot/cpu.h"
#include "ot/gdn.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"

namespace ot::cli {
namespace bench_gdn_local {

constexpr int64_t HK = 16, HV = 32, DK = 128, DV = 128;

struct Problem {
  Tensor q, k, v, g, beta, cu;
};
// BTHD [B,T,H,D] (or head-major [B,H,T,D]) with Qwen-like inputs: bf16 activations, fp32 gates.
Problem make(int64_t B, int64_t T, int64_t hk, int64_t hv, gdn::Layout l, uint32_t seed) {
  std::mt19937 rng(seed);
  auto vs = [&](int64_t H, int64_t D) { return l == gdn::Layout::BTHD ? std::vector<int64_t>{B, T, H, D} : std::vector<int64_t>{B, H, T, D}; };
  auto ss = [&](int64_t H) { return l == gdn::Layout::BTHD ? std::vector<int64_t>{B, T, H} : std::vector<int64_t>{B, H, T}; };
  Problem p;
  p.q = uniform_tensor(rng, DType::bf16, vs(hk, DK), -1, 1);
  p.k = uniform_tensor(rng, DType::bf16, vs(hk, DK), -1, 1);
  p.v = uniform_tensor(rng, DType::bf16, vs(hv, DV), -1, 1);
  p.g = uniform_tensor(rng, DType::f32, ss(hv), -0.5f, 0.f);
  p.beta = uniform_tensor(rng, DType::f32, ss(hv), 0.1f, 0.9f);
  return p;
}

// Process CPU time of one call (median of `reps`): on a shared, oversubscribed machine wall time
// mostly measures the other tenants; cpu_ms / threads estimates the idle-machine wall time.
double cpu_ms_median(const std::function<void()>& fn, int reps) {
  std::vector<double> v;
  for (int i = 0; i < std::max(1, reps); ++i) {
    timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    fn();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    v.push_back(1e3 * double(b.tv_sec - a.tv_sec) + 1e-6 * double(b.tv_nsec - a.tv_nsec));
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_cpu(const BenchOptions& opt, BenchResult& r, double cpu_ms, double work, const char* unit) {
  double est = cpu_ms / r.threads;
  r.extra["cpu_ms"] = cpu_ms;
  r.extra["idle_estimate_ms"] = est;
  if (!opt.json)
    std::printf("  %-26s cpu %.3f ms/call -> idle-machine estimate %.3f ms at %d threads (%.1f %s)\n", "", cpu_ms, est, r.threads,
                work / (est * 1e6), unit);
}

double fwd_flops(double tokens) {
  const double C = double(gdn::kChunk);
  return tokens * HV * (6 * C * DK + 4 * C * DV + 6.0 * DK * DV + C * C / 3);
}

int run_chunk(const BenchOptions& opt) {
  struct Case {
    std::string name;
    int64_t B, T;
    std::vector<int64_t> lens;  // varlen when not empty
    gdn::Layout layout;
  };
  std::vector<Case> cases = {{"qwen35-B1-T1024", 1, 1024, {}, gdn::Layout::BTHD},
                             {"qwen35-B1-T1024-bnsd", 1, 1024, {}, gdn::Layout::BHTD},
                             {"qwen35-B1-T4096", 1, 4096, {}, gdn::Layout::BTHD},
                             {"qwen35-B4-T1024", 4, 1024, {}, gdn::Layout::BTHD},
                             {"qwen35-B4-T4096", 4, 4096, {}, gdn::Layout::BTHD},
                             {"qwen35-varlen", 1, 0, {1000, 37, 1, 2048, 500, 510}, gdn::Layout::BTHD}};
  int threads = num_threads();
  for (const Case& c : cases) {
    if (!opt.selected(c.name)) continue;
    int64_t T = c.T;
    std::vector<int64_t> cu = {0};
    for (int64_t L : c.lens) cu.push_back(cu.back() + L);
    if (!c.lens.empty()) T = cu.back();
    Problem p = make(c.B, T, HK, HV, c.layout, 1);
    gdn::ChunkOptions o;
    o.layout = c.layout;
    o.use_qk_l2norm_in_kernel = true;
    o.output_final_state = true;
    Tensor cut;
    gdn::SeqInfo info;
    if (!c.lens.empty()) {
      cut = Tensor::empty(DType::i64, {int64_t(cu.size())});
      std::copy(cu.begin(), cu.end(), cut.ptr<int64_t>());
      info = gdn::make_seq_info(1, T, cut);
      o.seq = &info;  // metadata derived once, reused by every call
    }
    auto fast = [&] { gdn::chunk_gated_delta_rule_fwd(p.q, p.k, p.v, p.g, p.beta, o); };
    // Reference slice: HK 1, HV 2, <= 256 tokens per sequence, scaled by the token-head ratio.
    int64_t Ts = std::min<int64_t>(T, 256);
    Problem ps = make(1, Ts, 1, 2, gdn::Layout::BTHD, 2);
    gdn::ChunkOptions os;
    os.use_qk_l2norm_in_kernel = true;
    double ref_scale = double(c.B * T * HV) / double(Ts * 2);
    auto ref = [&] { gdn::ref::recurrence(ps.q, ps.k, ps.v, ps.g, ps.beta, os); };
    int reps = opt.repeats > 0 ? opt.repeats : (c.B * T >= 8192 ? 2 : 5);
    Timing t = time_interleaved(fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref), reps, opt.no_ref ? 0 : 1);
    BenchResult r;
    r.name = c.name;
    r.shape = c.lens.empty() ? "B" + std::to_string(c.B) + " T" + std::to_string(T) + " " + gdn::layout_name(c.layout)
                             : "varlen N" + std::to_string(c.lens.size()) + " T" + std::to_string(T);
    r.dtype = "bf16";
    r.threads = threads;
    r.ms = t.fast_ms;
    r.ref_ms = t.ref_ms * ref_scale;
    r.gflops = fwd_flops(double(c.B * T)) / (t.fast_ms * 1e6);
    // The kernel the call took (from its trace record) and the peak of that arithmetic.
    trace::set_timeline(true);
    trace::take_events();
    fast();
    std::vector<trace::Event> ev = trace::take_events();
    trace::set_timeline(false);
    r.kernel = ev.empty() ? "?" : ev.back().kernel;
    bool bf16 = r.kernel.find("bf16") != std::string::npos;
    double peak = matrix_peak_gflops(bf16 ? "bf16" : "fp32", threads);
    r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
    r.extra["ref_slice"] = "HK1 HV2 T" + std::to_string(Ts) + " x" + std::to_string(ref_scale);
    double cpu = cpu_ms_median(fast, reps);
    report(opt, r);
    print_cpu(opt, r, cpu, fwd_flops(double(c.B * T)), "GFLOP/s");
  }
  return 0;
}

// The yardstick for decode: an in-place read+write stream (x = a x + b) over a buffer as large as
// the states one decode step touches, on the same threads (same cache situation as the decode).
double stream_cpu_ms(size_t floats, int reps) {
  std::vector<float> buf(floats, 0.5f);
  auto run = [&] {
    parallel_for(int64_t(floats / 16384), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        float* p = buf.data() + c * 16384;
        for (int i = 0; i < 16384; ++i) p[i] = 0.999f * p[i] + 1e-4f;
      }
    });
  };
  run();
  return cpu_ms_median(run, reps);
}

int run_decode(const BenchOptions& opt) {
  int threads = num_threads();
  for (int64_t B : {1, 8, 32})
    for (DType sdt : {DType::f32, DType::bf16}) {
      std::string name = "qwen35-decode-B" + std::to_string(B) + (sdt == DType::bf16 ? "-bf16state" : "");
      if (!opt.selected(name)) continue;
      Problem p = make(B, 1, HK, HV, gdn::Layout::BTHD, 3);
      std::mt19937 rng(4);
      // Twice as many slots as sequences, sequences in every other slot (a realistic scattered cache).
      Tensor cache = uniform_tensor(rng, sdt, {2 * B, HV, DK, DV}, -0.1f, 0.1f);
      Tensor slots = Tensor::empty(DType::i32, {B});
      for (int64_t i = 0; i < B; ++i) slots.ptr<int32_t>()[i] = int32_t(2 * i + 1);
      gdn::RecurrentOptions o;
      o.use_qk_l2norm_in_kernel = true;
      o.state_cache = cache;
      o.state_indices = slots;
      auto fast = [&] { gdn::recurrent_gated_delta_rule(p.q, p.k, p.v, p.g, p.beta, o); };
      auto ref = [&] {
        cpu::ScopedForceRef f(true);
        gdn::recurrent_gated_delta_rule(p.q, p.k, p.v, p.g, p.beta, o);
      };
      int reps = opt.repeats > 0 ? opt.repeats : 50;
      Timing t = time_interleaved(fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref), reps, opt.no_ref ? 0 : 2, true);
      double bytes = 2.0 * double(B * HV * DK * DV) * double(dtype_size(sdt));
      BenchResult r = bandwidth_result(name, "B" + std::to_string(B) + " HV32 128x128", sdt == DType::f32 ? "f32" : "bf16", threads, bytes, t, fast);
      r.extra["state_bytes"] = bytes;
      double cpu = cpu_ms_median(fast, reps);
      double stream = stream_cpu_ms(size_t(B * HV * DK * DV) * dtype_size(sdt) / 4, reps);
      r.extra["stream_cpu_ms"] = stream;
      r.extra["fraction_of_stream"] = stream / cpu;
      report(opt, r);
      print_cpu(opt, r, cpu, bytes, "GB/s");
      if (!opt.json)
        std::printf("  %-26s in-place stream over the same bytes: cpu %.3f ms -> decode at %.0f %% of streaming bandwidth\n", "", stream,
                    100 * stream / cpu);
    }
  return 0;
}

RegisterBench chunk_bench("chunk_gated_delta_rule_fwd", "Chunked Gated DeltaNet forward (Qwen3.5 shapes), GFLOP/s by the spec's forward formula",
                          [](Options&, const BenchOptions& o) { return [&o] { return run_chunk(o); }; }, {"gdn_chunk_fwd"});
RegisterBench decode_bench("recurrent_gated_delta_rule", "Recurrent Gated DeltaNet decode from a state cache, GB/s of state traffic",
                           [](Options&, const BenchOptions& o) { return [&o] { return run_decode(o); }; }, {"gdn_decode"});

}  // namespace bench_gdn_local
}  // namespace ot::cli
