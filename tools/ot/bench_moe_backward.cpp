// `ot bench moe_ffn_backward`: the whole MoE layer's backward (moe_ffn_backward) at the forward
// benchmark's real layer shapes and case names, timed beside the inference forward (moe_ffn on
// packed weights) and the training forward (moe_ffn_forward_train); reports backward / forward
// (target <= 2.5x; the FLOP ratio is 2x) and the reference path in the same run where it is cheap
// enough (the fp64 reference runs at well under a GFLOP/s: --ref-max-gflop). The expert weight
// gradients go to buffers allocated once (MoeFfnBackwardOptions::d_*_out), as in training, in fp32
// and in bf16 (--grad-dtype; one row each: the row's dtype column says which).
#include <cstdio>
#include <random>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/moe/ffn_bwd_common.h"

namespace ot::cli {

namespace bench_moe_backward_local {

struct Shape { const char* name; int64_t H, I, E, K; };
constexpr Shape kShapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8}, {"e64-h2048-i1408", 2048, 1408, 64, 8}, {"mixtral", 4096, 14336, 8, 2}};
constexpr int64_t kTokens[] = {1, 16, 128, 512, 2048};
// Default run (< 1 minute): a decode and a prefill shape of Qwen3-30B-A3B.
bool default_case(const std::string& n) { return n == "qwen3-30b-a3b-T16" || n == "qwen3-30b-a3b-T512"; }

// Uniform values of standard deviation `scale` (xorshift: the layer weights are gigabytes).
Tensor random_bf16(const std::vector<int64_t>& shape, std::mt19937_64& rng, float scale) {
  Tensor b = Tensor::empty(DType::bf16, shape);
  uint64_t st = rng() | 1;
  const float a = scale * 1.7320508f / float(1u << 31);
  uint16_t* p = b.ptr<uint16_t>();
  for (int64_t i = 0; i < b.numel(); ++i) {
    st ^= st << 13; st ^= st >> 7; st ^= st << 17;
    p[i] = f32_to_bf16(float(int32_t(uint32_t(st >> 32))) * a);
  }
  return b;
}

int run(const BenchOptions& opt, bool all, double ref_max_gflop, const std::string& grads) {
  std::vector<DType> grad_dtypes;
  if (grads != "bf16") grad_dtypes.push_back(DType::f32);
  if (grads != "fp32") grad_dtypes.push_back(DType::bf16);
  for (const Shape& s : kShapes)
    for (int64_t T : kTokens) {
      std::string name = std::string(s.name) + "-T" + std::to_string(T);
      if (!opt.case_filter.empty() ? !opt.selected(name) : !(all || default_case(name))) continue;
      std::mt19937_64 rng(uint64_t(T) * 31 + uint64_t(s.E));
      const float sh = 1.f / std::sqrt(float(s.H)), si = 1.f / std::sqrt(float(s.I));
      Tensor x = random_bf16({T, s.H}, rng, 1.f), router = random_bf16({s.E, s.H}, rng, sh);
      Tensor gate = random_bf16({s.E, s.H, s.I}, rng, sh), up = random_bf16({s.E, s.H, s.I}, rng, sh), down = random_bf16({s.E, s.I, s.H}, rng, si);
      Tensor dy = random_bf16({T, s.H}, rng, 1.f);
      moe::MoeFfnWeights w{router, gate, up, down, {}, {}, {}};
      moe::MoeFfnOptions o;
      o.k = s.K;
      o.norm_topk_prob = true;
      moe::MoeExperts ex = moe::MoeExperts::from_stacked(gate, up, down, moe::WeightLayout::EHI);
      gemm::PackedB rp = gemm::prepack(router, gemm::BLayout::NK);
      auto saved = moe::moe_ffn_forward_train(x, w, o).saved;
      const int reps = opt.repeats > 0 ? opt.repeats : (T >= 512 ? 3 : 5);
      double fwd_ms = time_median_ms([&] { moe::moe_ffn(x, rp, ex, o); }, reps);
      double fwd_train_ms = time_median_ms([&] { moe::moe_ffn_forward_train(x, w, o); }, reps);
      const double fwd_cpu = gemmbench::cpu_ms_per_call([&] { moe::moe_ffn(x, rp, ex, o); }, 2);
      const double pairs = double(saved.plan.token.size());
      const double fwd_flops = 2.0 * pairs * 3.0 * double(s.H) * double(s.I) + 2.0 * double(T) * double(s.H) * double(s.E);
      const double bwd_flops = 2.0 * fwd_flops;
      const double nt = double(num_threads());
      for (DType gdt : grad_dtypes) {
        // Gradient buffers kept across calls, as a training loop does (see MoeFfnBackwardOptions).
        moe::MoeFfnBackwardOptions bo;
        bo.weight_grad_dtype = gdt;
        bo.d_gate_out = Tensor::empty(gdt, {s.E, s.H, s.I});
        bo.d_up_out = Tensor::empty(gdt, {s.E, s.H, s.I});
        bo.d_down_out = Tensor::empty(gdt, {s.E, s.I, s.H});
        const bool with_ref = !opt.no_ref && gdt == grad_dtypes[0] && bwd_flops * 1e-9 <= ref_max_gflop;
        Timing tm = time_interleaved([&] { moe::moe_ffn_backward(dy, x, w, saved, o, bo); },
                                     with_ref ? std::function<void()>([&] { moe::ref::moe_ffn_backward(dy, x, w, o); }) : nullptr, reps, with_ref ? 1 : 0);
        // Idle-machine estimates from process CPU time (the machine is shared; see cpu_ms_per_call).
        const double bwd_cpu = gemmbench::cpu_ms_per_call([&] { moe::moe_ffn_backward(dy, x, w, saved, o, bo); }, 2);
        BenchResult r;
        r.name = name;
        r.shape = "H" + std::to_string(s.H) + " I" + std::to_string(s.I) + " E" + std::to_string(s.E) + " k" + std::to_string(s.K);
        r.dtype = std::string("bf16, dW ") + (gdt == DType::bf16 ? "bf16" : "fp32");
        r.threads = num_threads();
        r.ms = tm.fast_ms;
        r.ref_ms = tm.ref_ms;
        r.gflops = bwd_flops / (tm.fast_ms * 1e6);
        double peak = matrix_peak_gflops("bf16", r.threads);
        r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
        r.kernel = gemm::kernel_name(DType::bf16, DType::bf16, T);
        r.extra["weight_grad_dtype"] = dtype_name(gdt);
        r.extra["fwd_ms"] = fwd_ms;
        r.extra["fwd_train_ms"] = fwd_train_ms;
        r.extra["bwd_over_fwd"] = tm.fast_ms / fwd_ms;
        r.extra["bwd_over_fwd_train"] = tm.fast_ms / fwd_train_ms;
        r.extra["ref_skipped"] = !with_ref;
        r.extra["fwd_cpu_ms"] = fwd_cpu;
        r.extra["bwd_cpu_ms"] = bwd_cpu;
        r.extra["cpu_bwd_over_fwd"] = bwd_cpu / fwd_cpu;
        r.extra["cpu_gflops"] = bwd_flops / (bwd_cpu / nt * 1e6);
        report(opt, r);
        if (opt.json) continue;
        std::printf("  %-26s dW %s: forward moe_ffn %.3f ms, training forward %.3f ms: backward / forward = %.2fx (target <= 2.5x)%s\n", "",
                    dtype_name(gdt), fwd_ms, fwd_train_ms, tm.fast_ms / fwd_ms, with_ref ? "" : "; reference skipped");
        std::printf("  %-26s cpu: forward %.1f ms, backward %.1f ms per call -> idle estimates %.1f / %.1f ms (%.0f GFLOP/s): "
                    "backward / forward = %.2fx\n",
                    "", fwd_cpu, bwd_cpu, fwd_cpu / nt, bwd_cpu / nt, bwd_flops / (bwd_cpu / nt * 1e6), bwd_cpu / fwd_cpu);
      }
    }
  return 0;
}

RegisterBench reg("moe_ffn_backward", "Backward of the whole MoE layer vs its forward (moe_ffn) and the reference", [](Options& sub, const BenchOptions& opt) {
  auto all = std::make_shared<bool>(false);
  auto ref_max = std::make_shared<double>(2.0);
  auto grads = std::make_shared<std::string>("both");
  auto sched = std::make_shared<std::string>("auto");
  sub.flag("--all", *all, "Every case (3 layer shapes x T in 1, 16, 128, 512, 2048); default: qwen3-30b-a3b-T16 and -T512");
  sub.value("--ref-max-gflop", *ref_max, "Run the fp64 reference only for cases up to this many GFLOP").show_default();
  sub.choice("--grad-dtype", *grads, {"fp32", "bf16", "both"}, "Expert weight gradients in fp32, bf16 or both (one row each)").show_default();
  sub.choice("--schedule", *sched, {"auto", "call", "expert"}, "Backward schedule: auto (by shape), call (each projection one call over all experts) or expert "
                                         "(one thread per expert's whole chain)").show_default();
  return std::function<int()>([&opt, all, ref_max, grads, sched] {
    using moe::bwd::FfnSchedule;
    moe::bwd::set_ffn_schedule(*sched == "call" ? FfnSchedule::per_call : *sched == "expert" ? FfnSchedule::expert_major : FfnSchedule::automatic);
    return run(opt, *all, *ref_max, *grads);
  });
});

}  // namespace bench_moe_backward_local

}  // namespace ot::cli
