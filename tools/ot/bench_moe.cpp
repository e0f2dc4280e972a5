// `ot bench moe_ffn`: the fused MoE layer at real shapes, bf16 weights, routing drawn at random per
// call (each call takes the next of 8 random token batches, so the router picks new experts).
//   prefill (T >= 128): GFLOP/s (router + 3 expert GEMMs per routed pair) against the matrix peak;
//   decode (T <= 16): GB/s of the weight bytes the call touches (router + every expert chosen at
//   least once) against the memory peak.
// The reference (ref::moe_ffn: per token and expert loops on the unpacked weights) costs exactly
// linear in tokens, so it is timed on a slice of at most 16 tokens and scaled to T (ref_ms).
// Default run: qwen3-30b-a3b at T <= 512 (< 1 min); --case selects the others (e64-h2048-i1408,
// mixtral, T2048, demo-h1024-i256: ot demo's experts at T6 and T763), e.g. `ot bench moe_ffn --case mixtral-T512`; --tokens 1,16,512 picks token counts.
// --weights bf16,int8,int4 adds one row per weight format and case in the same process (experts
// quantised from the bf16 ones: QuantMoeExperts): weight_bytes are then the packed codes and scales
// of the touched experts, vs_bf16 the time ratio to the bf16 layer timed in the same rounds (median
// of each), quant_error the relative Frobenius error of expert 0's dequantised weights against the
// fp32 values of the bf16 ones. Quantised rows time no reference (it would dequantise every expert
// per call); their check is tests/moe/test_ffn_quant.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "bench_quant_formats.h"
#include "ot/moe.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace bench_moe_local {

// Is: the shared expert's intermediate size (0: none).
struct Model { std::string name; int64_t H, I, E, K, Is; std::vector<int64_t> tokens; };
// demo-h1024-i256: `ot demo`'s MoE layer (shared expert included) at its decode (6 sequences) and
// prefill (763 tokens) batches.
const Model kModels[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8, 0, {1, 16, 128, 512, 2048}},
                         {"e64-h2048-i1408", 2048, 1408, 64, 8, 0, {1, 16, 128, 512, 2048}},
                         {"mixtral", 4096, 14336, 8, 2, 0, {1, 16, 128, 512, 2048}},
                         {"demo-h1024-i256", 1024, 256, 32, 4, 256, {6, 763}}};

// Uniform(-a, a) bf16 from a counter hash: gigabytes of weights in well under a second per GB.
Tensor fill(const std::vector<int64_t>& shape, float a, uint64_t seed) {
  Tensor t = Tensor::empty(DType::bf16, shape);
  uint16_t* p = t.ptr<uint16_t>();
  parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t z = (uint64_t(i) + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
      z ^= z >> 31;
      float u = float(z >> 40) / float(1 << 24);
      p[i] = f32_to_bf16((2 * u - 1) * a);
    }
  });
  return t;
}

struct Weights {
  Tensor router, gate, up, down, sgate, sup, sdown;
  gemm::PackedB router_packed;
  moe::MoeExperts experts, shared;  // shared: empty unless the model has one
};
Weights make_weights(const Model& m) {
  Weights w;
  w.router = fill({m.E, m.H}, 0.05f, 1);
  w.gate = fill({m.E, m.H, m.I}, 0.02f, 2);
  w.up = fill({m.E, m.H, m.I}, 0.02f, 3);
  w.down = fill({m.E, m.I, m.H}, 0.02f, 4);
  w.router_packed = gemm::prepack(w.router, gemm::BLayout::NK);
  w.experts = moe::MoeExperts::from_stacked(w.gate, w.up, w.down, moe::WeightLayout::EHI);
  if (m.Is > 0) {
    w.sgate = fill({1, m.H, m.Is}, 0.02f, 5), w.sup = fill({1, m.H, m.Is}, 0.02f, 6), w.sdown = fill({1, m.Is, m.H}, 0.02f, 7);
    w.shared = moe::MoeExperts::from_stacked(w.sgate, w.sup, w.sdown, moe::WeightLayout::EHI);
  }
  return w;
}

bool default_case(const Model& m, int64_t T) { return m.name == "qwen3-30b-a3b" && T <= 512; }

// Relative Frobenius error of quantising expert 0 ([gate | up] and down, as the store does).
double quant_error(const Weights& w, const Model& m, const WeightsFormat& fm) {
  double d = 0, n = 0;
  auto add = [&](const TensorView& v) {
    Tensor f = Tensor::empty(DType::f32, v.shape());
    copy_into(v, f);
    QuantizedWeights q = quantize_weights(f, fm.f, fm.gs, true);
    Tensor dq = dequantize_weights(q.view());
    for (int64_t i = 0; i < f.numel(); ++i) {
      const double a = dq.ptr<float>()[i], b = f.ptr<float>()[i];
      d += (a - b) * (a - b);
      n += b * b;
    }
  };
  Tensor gu = Tensor::empty(DType::bf16, {m.H, 2 * m.I});
  copy_into(w.gate.view().select(0, 0), gu.view().narrow(1, 0, m.I));
  copy_into(w.up.view().select(0, 0), gu.view().narrow(1, m.I, m.I));
  add(gu);
  add(w.down.view().select(0, 0));
  return std::sqrt(d / std::max(n, 1e-30));
}

int run(const BenchOptions& opt, const std::vector<int64_t>& only_tokens, const std::vector<WeightsFormat>& fmts) {
  for (const Model& m : kModels) {
    std::vector<int64_t> Ts;
    for (int64_t T : m.tokens) {
      std::string name = m.name + "-T" + std::to_string(T);
      bool tok_ok = only_tokens.empty() || std::find(only_tokens.begin(), only_tokens.end(), T) != only_tokens.end();
      bool pick = opt.case_filter.empty() && only_tokens.empty() ? default_case(m, T) : opt.selected(name);
      if (pick && tok_ok) Ts.push_back(T);
    }
    if (Ts.empty()) continue;
    Weights w = make_weights(m);
    for (const WeightsFormat& fm : fmts) {
      const bool bf16 = fm.bf16();
      moe::QuantMoeExperts qex;
      double qerr = 0;
      if (!bf16) {
        qex = moe::QuantMoeExperts::quantize(w.gate, w.up, w.down, moe::WeightLayout::EHI, fm.f, fm.gs, true, fm.aq);
        qerr = quant_error(w, m, fm);
      }
      const double expert_bytes = bf16 ? 3.0 * double(m.H * m.I) * 2.0 : double(qex.expert_bytes());
      auto call_ffn = [&](const Tensor& x, const moe::MoeFfnOptions& o) {
        return bf16 ? moe::moe_ffn(x, w.router_packed, w.experts, o) : moe::moe_ffn(x, w.router_packed, qex, o);
      };
      for (int64_t T : Ts) {
        std::string name = m.name + "-T" + std::to_string(T) + (fmts.size() > 1 || !bf16 ? "_" + fm.name : "");
        std::vector<Tensor> xs;
        for (int i = 0; i < 8; ++i) xs.push_back(fill({T, m.H}, 1.f, 100 + uint64_t(i) * 7 + uint64_t(T)));
        moe::MoeFfnOptions o;
        o.k = m.K;
        o.norm_topk_prob = true;
        if (m.Is > 0) o.shared = &w.shared;
        // Weight bytes touched: router + shared expert + distinct experts over the 8 batches (averaged).
        double touched = 0;
        for (const Tensor& x : xs) {
          moe::MoeFfnResult r = call_ffn(x, o);
          int64_t used = 0;
          for (int64_t e = 0; e < m.E; ++e) used += r.expert_counts.ptr<int64_t>()[e] > 0;
          touched += double(used) * expert_bytes + double(m.E * m.H) * 2.0 + 3.0 * double(m.H * m.Is) * 2.0;
        }
        touched /= double(xs.size());
        int64_t slice = std::min<int64_t>(T, 16);
        std::vector<Tensor> xslice;
        for (const Tensor& x : xs) xslice.push_back(Tensor::copy_of(x.view().narrow(0, 0, slice)));
        size_t call = 0, rcall = 0;
        auto fast = [&] { call_ffn(xs[call++ % xs.size()], o); };
        auto ref = [&] {
          if (m.Is > 0) moe::ref::moe_ffn(xslice[rcall++ % xslice.size()], w.router, w.gate, w.up, w.down, o, w.sgate, w.sup, w.sdown);
          else moe::ref::moe_ffn(xslice[rcall++ % xslice.size()], w.router, w.gate, w.up, w.down, o);
        };
        // A quantised row times the bf16 layer in the same rounds (its "reference" slot), so vs_bf16
        // pairs calls a few milliseconds apart: this VM's memory speed moves 10-20% between rows.
        size_t bcall = 0;
        auto bf16_call = [&] { moe::moe_ffn(xs[bcall++ % xs.size()], w.router_packed, w.experts, o); };
        const bool with_ref = !opt.no_ref && bf16;
        int reps = opt.repeats > 0 ? opt.repeats : (T <= 16 ? 20 : (T <= 768 ? 5 : 3));
        Timing tm = bf16 ? time_interleaved(fast, with_ref ? std::function<void()>(ref) : std::function<void()>(), reps, with_ref ? 1 : 0, T <= 16)
                         : time_interleaved(fast, bf16_call, reps, reps, T <= 16);
        const double paired_bf16_ms = bf16 ? tm.fast_ms : tm.ref_ms;
        if (!bf16) tm.ref_ms = 0;
        BenchResult r;
        r.name = name;
        r.shape = "H" + std::to_string(m.H) + " I" + std::to_string(m.I) + " E" + std::to_string(m.E) + " K" + std::to_string(m.K) + (m.Is ? " S" + std::to_string(m.Is) : "");
        r.dtype = "bf16";
        r.threads = num_threads();
        r.ms = tm.fast_ms;
        r.ref_ms = tm.ref_ms * double(T) / double(slice);
        double flops = 2.0 * double(T) * double(m.H) * (double(m.E) + 3.0 * (double(m.K) * double(m.I) + double(m.Is)));
        // The path moe_ffn reports for a call (decode kernel for experts of 1-3 rows, the 8x48 one above).
        r.kernel = kernel_of_call(fast);
        const double gflops = flops / (r.ms * 1e6), gbps = touched / (r.ms * 1e6);
        if (T <= 16) {
          set_bandwidth(r, gbps, tm);
          r.extra["gflops"] = gflops;
        } else {
          r.gflops = gflops;
          double peak = matrix_peak_gflops(fm.aq == gemm::ActivationQuant::int8_per_token ? "int8" : "bf16", r.threads);
          r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
          r.extra["gbps"] = gbps;
        }
        const double ratio = tm.fast_ms / paired_bf16_ms;
        r.extra["weights"] = fm.name;
        r.extra["weight_bytes"] = touched;
        r.extra["vs_bf16"] = ratio;
        r.extra["quant_error"] = qerr;
        r.extra["tokens"] = T;
        r.extra["gflop"] = flops / 1e9;
        r.extra["touched_weight_gb"] = touched / 1e9;
        r.extra["ref_slice_tokens"] = with_ref ? slice : 0;
        // Idle-machine estimate from process CPU time (the machine is shared; see cpu_ms_per_call).
        const double cpu_ms = gemmbench::cpu_ms_per_call(fast, 2), est_ms = cpu_ms / r.threads;
        r.extra["cpu_ms"] = cpu_ms;
        r.extra["idle_estimate_ms"] = est_ms;
        const double est_rate = T <= 16 ? touched / (est_ms * 1e6) : flops / (est_ms * 1e6);
        r.extra[T <= 16 ? "cpu_gbps" : "cpu_gflops"] = est_rate;
        report(opt, r);
        if (!opt.json) {
          std::printf("  %-26s cpu %.3f ms/call -> idle estimate %.3f ms: %.1f %s (%.1f%% of peak)\n", "", cpu_ms, est_ms, est_rate,
                      T <= 16 ? "GB/s" : "GFLOP/s",
                      100 * est_rate / (T <= 16 ? memory_peak_gbps(r.threads) : matrix_peak_gflops(fm.aq == gemm::ActivationQuant::int8_per_token ? "int8" : "bf16", r.threads)));
          if (fmts.size() > 1 || !bf16)
            std::printf("  %-26s %s: %.2f MB weights, %.1f GB/s, %.1f GFLOP/s, %.2fx the bf16 row's time, quant error %.2e\n", "", fm.name.c_str(),
                        touched / 1e6, gbps, gflops, ratio, qerr);
        }
      }
    }
  }
  return 0;
}

RegisterBench reg("moe_ffn", "Fused MoE layer (router, grouped SwiGLU FFN, weighted combine) at Qwen3-30B-A3B / E64 / Mixtral shapes",
                  [](Options& sub, const BenchOptions& common) {
                    // --tokens 1,16,512: only these T (with --case as a substring filter on the
                    // model, e.g. `--case mixtral --tokens 1,16,512`; "-T1" alone also matches T16, T128).
                    static std::vector<int64_t> tokens;
                    static std::string weights = "bf16";
                    sub.value("--tokens", tokens, "Only these token counts (of 1, 16, 128, 512, 2048; the demo model: 6, 763)");
                    sub.value("--weights", weights, "Comma list: bf16, int8, w8a8, int4 (group 64), int4-g32, int4-g128 (each quantised row is timed beside the bf16 layer: vs_bf16)");
                    return [&common] { return run(common, tokens, parse_weight_formats("ot bench moe_ffn", weights)); };
                  });

}  // namespace bench_moe_local
}  // namespace ot::cli
