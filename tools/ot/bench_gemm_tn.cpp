// `ot bench gemm_tn`: the TN form alone (grouped_gemm_tn) on the MoE backward's weight-gradient
// jobs: per expert dWd = (w a)^T dy [I, H], dWg = x^T dz_gate and dWu = x^T dz_up [H, I], with K =
// the expert's rows (T * k / E under uniform routing), bf16 operands, fp32 or bf16 C. Reports
// GFLOP/s and the rate at which the gradients are written (the call is bound by both).
#include <cstdio>
#include <random>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {

namespace bench_gemm_tn_local {

struct Case { const char* name; int64_t H, I, E, rows; };  // rows per expert
// e4: four experts of the same layer, small enough for the fp64 reference.
constexpr Case kCases[] = {{"qwen3-30b-a3b-T512", 2048, 768, 128, 32}, {"qwen3-30b-a3b-T2048", 2048, 768, 128, 128},
                           {"qwen3-30b-a3b-T16", 2048, 768, 128, 1}, {"qwen3-30b-a3b-T512-e4", 2048, 768, 4, 32}};

Tensor random_bf16(int64_t n, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(DType::bf16, {n});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  uint16_t* p = t.ptr<uint16_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(u(rng));
  return t;
}

int run(const BenchOptions& opt, const std::string& grads) {
  for (const Case& cs : kCases) {
    if (!opt.selected(cs.name)) continue;
    const int64_t H = cs.H, I = cs.I, E = cs.E, R = cs.rows, A = E * R;
    std::mt19937_64 rng(uint64_t(E * 7 + R));
    Tensor xs = random_bf16(A * H, rng), dys = random_bf16(A * H, rng), aw = random_bf16(A * I, rng), dz = random_bf16(A * 2 * I, rng);
    for (const char* gname : {"fp32", "bf16"}) {
      if (grads != "both" && grads != gname) continue;
      const DType gdt = std::string(gname) == "bf16" ? DType::bf16 : DType::f32;
      const int64_t gsz = H * I;
      Tensor dg = Tensor::empty(gdt, {E, gsz}), du = Tensor::empty(gdt, {E, gsz}), dd = Tensor::empty(gdt, {E, gsz});
      auto at = [](const Tensor& t, int64_t off) { return static_cast<char*>(t.view().data) + off * int64_t(dtype_size(t.dtype())); };
      std::vector<gemm::TnJob> jobs;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r = e * R;
        const DType b = DType::bf16;
        jobs.push_back({R, I, H, at(aw, r * I), at(dys, r * H), b, b, I, H, at(dd, e * gsz), H, false, gdt});
        jobs.push_back({R, H, I, at(xs, r * H), at(dz, r * 2 * I), b, b, H, 2 * I, at(dg, e * gsz), I, false, gdt});
        jobs.push_back({R, H, I, at(xs, r * H), at(dz, r * 2 * I + I), b, b, H, 2 * I, at(du, e * gsz), I, false, gdt});
      }
      const double flops = 2.0 * double(A) * 3.0 * double(H) * double(I);
      const double bytes = 3.0 * double(E) * double(gsz) * double(dtype_size(gdt));
      const bool with_ref = !opt.no_ref && flops <= 2e9;
      const int reps = opt.repeats > 0 ? opt.repeats : 5;
      Timing tm = time_interleaved([&] { gemm::grouped_gemm_tn(jobs.data(), int64_t(jobs.size())); },
                                   with_ref ? std::function<void()>([&] {
                                     cpu::ScopedForceRef f(true);
                                     gemm::grouped_gemm_tn(jobs.data(), int64_t(jobs.size()));
                                   })
                                            : nullptr,
                                   reps, with_ref ? 1 : 0);
      const double cpu_ms = gemmbench::cpu_ms_per_call([&] { gemm::grouped_gemm_tn(jobs.data(), int64_t(jobs.size())); }, 2);
      BenchResult r;
      r.name = cs.name;
      r.shape = "3x" + std::to_string(E) + " jobs K" + std::to_string(R) + " H" + std::to_string(H) + " I" + std::to_string(I);
      r.dtype = std::string("bf16, C ") + gname;
      r.threads = num_threads();
      r.ms = tm.fast_ms;
      r.ref_ms = tm.ref_ms;
      r.gflops = flops / (tm.fast_ms * 1e6);
      const double peak = matrix_peak_gflops("bf16", r.threads);
      r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
      r.kernel = gemm::kernel_name(DType::bf16, DType::bf16, 1);
      r.extra["c_gbps"] = bytes / (tm.fast_ms * 1e6);
      r.extra["cpu_ms"] = cpu_ms;
      report(opt, r);
      if (!opt.json)
        std::printf("  %-26s C written at %.1f GB/s (%.2f GB); cpu: %.1f ms per call -> idle estimate %.1f ms\n", "", bytes / (tm.fast_ms * 1e6),
                    bytes * 1e-9, cpu_ms, cpu_ms / double(num_threads()));
    }
  }
  return 0;
}

RegisterBench reg("gemm_tn", "The TN form (weight gradients) on the MoE backward's expert jobs", [](Options& sub, const BenchOptions& opt) {
  auto grads = std::make_shared<std::string>("both");
  sub.choice("--grad-dtype", *grads, {"fp32", "bf16", "both"}, "C in fp32, bf16 or both").show_default();
  return std::function<int()>([&opt, grads] { return run(opt, *grads); });
});

}  // namespace bench_gemm_tn_local

}  // namespace ot::cli
