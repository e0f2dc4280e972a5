// `ot bench grouped_matmul`: the grouped matmul on bf16 and on quantised (int8 per channel, int4
// group-wise; W8A8: int8 weights with int8 per-token activations) experts at Qwen3-30B-A3B's expert shapes, one row per weight format and case in one
// process. Decode cases (1..8 rows for each of 8 active experts, a fresh set of experts each call
// out of a store larger than the caches) report GB/s of the weight bytes read (packed codes and
// scales), the fraction of `ot peak`'s read bandwidth and of the read window measured beside them;
// prefill cases GFLOP/s. Each quantised row gives its time ratio to the bf16 row of the same case
// (`vs_bf16`, < 1: faster) and its quantisation error (relative Frobenius of the dequantised
// weights against the fp32 ones). The reference (dequantise, then fp64 loops) is timed on one row
// of one expert and scaled by the rows; the JSON says so (ref_rows).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "bench_quant_formats.h"
#include "ot/error.h"
#include "ot/gemm_quant.h"
#include "ot/moe.h"
#include "ot/parallel.h"
#include "ot/quant_weights.h"

namespace ot::cli {

namespace bench_grouped_quant_local {

struct Case {
  std::string name;
  int64_t K, N;
  bool swiglu;
  int64_t rows;    // per active expert
  bool decode;
};

using Format = WeightsFormat;

constexpr int64_t kActive = 8;

double rel_err(const Tensor& a, const Tensor& b) {
  double d = 0, n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = a.ptr<float>()[i], y = b.ptr<float>()[i];
    d += (x - y) * (x - y);
    n += y * y;
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

void run_case(const BenchOptions& opt, const Case& cs, const std::vector<Format>& fmts) {
  ot::set_num_threads(opt.threads);
  const int threads = ot::num_threads();
  // Decode: a store of E experts (> the caches in every format), 8 active per call, rotating.
  const int64_t E = cs.decode ? 32 : kActive, sets = E / kActive;
  Tensor w = gemmbench::random(DType::f32, {E, cs.K, cs.N}, 11);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] *= 0.05f;
  Tensor wb = Tensor::empty(DType::bf16, {E, cs.K, cs.N});
  copy_into(w, wb);
  const int64_t M = kActive * cs.rows;
  Tensor x = gemmbench::random(DType::bf16, {M, cs.K}, 12);
  std::vector<Tensor> lists;
  for (int64_t s = 0; s < sets; ++s) {
    Tensor gl = Tensor::zeros(DType::i64, {E});
    for (int64_t e = 0; e < kActive; ++e) gl.ptr<int64_t>()[s * kActive + e] = cs.rows;
    lists.push_back(gl);
  }
  const gemm::Act act = cs.swiglu ? gemm::Act::swiglu : gemm::Act::none;
  const double flops = 2.0 * double(M) * double(cs.K) * double(cs.N);
  double bf16_ms = 0;
  for (const Format& fm : fmts) {
    const bool bf16 = fm.name == "bf16";
    std::vector<gemm::PackedB> pb;
    std::vector<const gemm::PackedB*> pbp;
    gemm::PackedQuantB pq;
    QuantizedWeights q;
    double weight_bytes = 0, qerr = 0;
    if (bf16) {
      for (int64_t e = 0; e < E; ++e) pb.push_back(gemm::prepack(wb.view().select(0, e), gemm::BLayout::KN));
      for (auto& p : pb) pbp.push_back(&p);
      weight_bytes = double(pb[0].bytes()) * kActive;
    } else {
      q = quantize_weights(w, fm.f, fm.gs, true);
      pq = gemm::prepack_quantized(q.view(), fm.aq);
      weight_bytes = double(pq.expert_bytes()) * kActive;
      qerr = rel_err(dequantize_weights(q.view()), w);
    }
    int next = 0;
    Tensor y;
    auto fast = [&] {
      const Tensor& gl = lists[size_t(next)];
      y = bf16 ? moe::grouped_matmul(x, pbp, gl, moe::GroupListType::count, {}, act) : moe::grouped_matmul(x, pq, gl, moe::GroupListType::count, {}, act);
      next = int((next + 1) % sets);
    };
    // The reference on one row of expert 0 (its own weights: bf16, or the quantised view).
    Tensor x1 = Tensor::copy_of(x.view().narrow(0, 0, 1)), gl1 = Tensor::zeros(DType::i64, {1});
    gl1.ptr<int64_t>()[0] = 1;
    QuantWeightView q1;
    if (!bf16) {
      q1 = q.view();
      q1.data = q1.data.narrow(0, 0, 1);
      q1.scale = q1.scale.narrow(0, 0, 1);
    }
    Tensor wb1 = Tensor::copy_of(wb.view().narrow(0, 0, 1));
    auto ref = [&] {
      if (bf16) moe::ref::grouped_matmul(x1, wb1, gl1, moe::GroupListType::count, {}, act);
      else moe::ref::grouped_matmul(x1, q1, gl1, moe::GroupListType::count, {}, act, fm.aq);
    };
    const int reps = opt.repeats > 0 ? opt.repeats : cs.decode ? 50 : 9;
    Timing t = time_interleaved(fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref), reps, opt.no_ref ? 0 : 1, cs.decode);
    if (bf16) bf16_ms = t.fast_ms;
    BenchResult r;
    r.name = cs.name + "_" + fm.name;
    r.shape = "8x" + std::to_string(cs.rows) + " K" + std::to_string(cs.K) + " N" + std::to_string(cs.N);
    r.dtype = "bf16";
    r.threads = threads;
    r.ms = t.fast_ms;
    r.ref_ms = t.ref_ms * double(M);
    r.kernel = bf16 ? gemm::kernel_name(DType::bf16, DType::bf16, cs.rows) : gemm::quant_kernel_name(fm.f, fm.aq);
    const double gbps = weight_bytes / (t.fast_ms * 1e-3) / 1e9, gflops = flops / (t.fast_ms * 1e-3) / 1e9;
    if (cs.decode) {
      set_bandwidth(r, gbps, t);
      r.extra["gflops"] = gflops;
    } else {
      r.gflops = gflops;
      // W8A8 against the vpdpbusd rate; bf16 and weight-only against the bf16 matrix peak.
      r.peak_fraction = gflops / matrix_peak_gflops(fm.aq == gemm::ActivationQuant::int8_per_token ? "int8" : "bf16", threads);
      r.extra["gbps"] = gbps;
    }
    r.extra["weights"] = fm.name;
    r.extra["weight_bytes"] = weight_bytes;
    r.extra["vs_bf16"] = bf16_ms > 0 ? t.fast_ms / bf16_ms : 0;
    r.extra["quant_error"] = qerr;
    r.extra["ref_rows"] = 1;
    report(opt, r);
    if (!opt.json)
      std::printf("  %-26s %.1f GFLOP/s, %.1f GB/s of %.2f MB weights (%.0f%% of read peak), %.2fx the bf16 row's time, quant error %.2e\n", "",
                  gflops, gbps, weight_bytes / 1e6, 100 * gbps / memory_peak_gbps(threads), bf16_ms > 0 ? t.fast_ms / bf16_ms : 0.0, qerr);
  }
}

}  // namespace bench_grouped_quant_local

namespace bench_grouped_quant_local {
const RegisterBench reg("grouped_matmul", "Grouped matmul on bf16 vs int8 / int4 quantised experts (Qwen3-30B-A3B expert shapes)",
                         [](Options& sub, const BenchOptions& o) {
                           auto weights = std::make_shared<std::string>("bf16,int8,int4-g64");
                           sub.value("--weights", *weights, "Comma list: bf16, int8, w8a8, int4-g32, int4-g64, int4-g128 (bf16 first: the ratios)");
                           const BenchOptions* opt = &o;
                           return [weights, opt]() -> int {
                             std::vector<Format> fmts = parse_weight_formats("ot bench grouped_matmul", *weights);
                             std::vector<Case> cases;
                             for (int64_t m : {1, 4, 8}) {
                               cases.push_back({"decode_gate_up_m" + std::to_string(m), 2048, 1536, true, m, true});
                               cases.push_back({"decode_down_m" + std::to_string(m), 768, 2048, false, m, true});
                             }
                             cases.push_back({"prefill_gate_up_m64", 2048, 1536, true, 64, false});
                             cases.push_back({"prefill_down_m64", 768, 2048, false, 64, false});
                             for (const Case& c : cases)
                               if (opt->selected(c.name)) run_case(*opt, c, fmts);
                             ot::set_num_threads(opt->threads);
                             return 0;
                           };
                         });

}  // namespace bench_grouped_quant_local
}  // namespace ot::cli
