// `ot bench gemm`: the matrix engine on square, expert and decode shapes (or one --m/--n/--k shape),
// with GFLOP/s (weight GB/s for decode), fraction of this machine's measured peak, and speed-up over
// the plain reference. The reference is timed on a few rows and scaled by M (its cost is exactly
// linear in M); the JSON says how many rows (ref_rows).
#include <algorithm>
#include <cstdio>
#include <random>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "ot/gemm.h"
#include "ot/parallel.h"

namespace ot::cli {

using namespace gemmbench;

static void run_shape(const BenchOptions& opt, const Shape& s) {
  if (s.threads > 0) ot::set_num_threads(s.threads);
  else ot::set_num_threads(opt.threads);
  const int threads = ot::num_threads();
  const DType dt = parse_dtype(s.dtype);
  const DType ct = dt;  // output in the input dtype
  Tensor a = random(dt, {s.M, s.K}, 1);
  // Decode streams weights: rotate through copies that together exceed the caches.
  const double wbytes = double(s.N) * double(s.K) * double(dtype_size(dt));
  const int copies = s.decode ? int(std::clamp(512e6 / wbytes, 1.0, 16.0)) : 1;
  std::vector<Tensor> w;
  std::vector<gemm::PackedB> pw;
  for (int i = 0; i < copies; ++i) {
    w.push_back(random(dt, {s.N, s.K}, uint32_t(2 + i)));
    pw.push_back(gemm::prepack(w.back(), gemm::BLayout::NK));
  }
  Tensor c = Tensor::empty(ct, {s.M, s.N}), cr = Tensor::empty(ct, {s.M, s.N});
  int next = 0;
  auto fast = [&] {
    gemm::gemm(s.M, {a.view().data, dt, s.K}, pw[size_t(next)], {c.view().data, ct, s.N});
    next = (next + 1) % copies;
  };
  const int64_t ref_rows = std::min<int64_t>(s.M, 2);
  auto ref = [&] { gemm::ref::gemm(ref_rows, {a.view().data, dt, s.K}, w[0], gemm::BLayout::NK, {cr.view().data, ct, s.N}); };
  const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
  int reps = opt.repeats > 0 ? opt.repeats : int(std::clamp(2e10 / flops, 5.0, 200.0));
  Timing t = time_interleaved(fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref), reps, opt.no_ref ? 0 : 1, s.decode);
  BenchResult r;
  r.name = s.name;
  r.shape = shape_str(s);
  r.dtype = s.dtype;
  r.threads = threads;
  r.ms = t.fast_ms;
  r.ref_ms = t.ref_ms * double(s.M) / double(std::max<int64_t>(ref_rows, 1));
  r.kernel = gemm::kernel_name(dt, dt, s.M);
  r.extra["ref_rows"] = ref_rows;
  if (s.decode) {
    set_bandwidth(r, wbytes / (t.fast_ms * 1e-3) / 1e9, t);
    r.extra["gflops"] = flops / (t.fast_ms * 1e-3) / 1e9;
  } else {
    r.gflops = flops / (t.fast_ms * 1e-3) / 1e9;
    r.peak_fraction = r.gflops / matrix_peak_gflops(s.dtype, threads);
  }
  // Idle-machine estimate from CPU time (see cpu_ms_per_call).
  const double cpu_ms = cpu_ms_per_call(fast, 3), est_ms = cpu_ms / threads;
  r.extra["cpu_ms"] = cpu_ms;
  if (s.decode) {
    r.extra["cpu_gbps"] = wbytes / (est_ms * 1e-3) / 1e9;
    r.extra["cpu_peak_fraction"] = wbytes / (est_ms * 1e-3) / 1e9 / memory_peak_gbps(threads);
  } else {
    r.extra["cpu_gflops"] = flops / (est_ms * 1e-3) / 1e9;
    r.extra["cpu_peak_fraction"] = flops / (est_ms * 1e-3) / 1e9 / matrix_peak_gflops(s.dtype, threads);
  }
  report(opt, r);
  if (!opt.json)
    std::printf("  %-26s cpu %.3f ms/call -> idle estimate %.3f ms: %.1f %s (%.1f%% of peak)\n", "", cpu_ms, est_ms,
                s.decode ? std::get<double>(r.extra["cpu_gbps"]) : std::get<double>(r.extra["cpu_gflops"]), s.decode ? "GB/s" : "GFLOP/s",
                100 * std::get<double>(r.extra["cpu_peak_fraction"]));
}


// ---- NT form (grouped_gemm_nt, the MoE backward's activation gradients) ------------------------
// Qwen3-30B-A3B at T512: 512 tokens x top-8 over 128 experts (uniform random routing, ~32 rows each),
// H 2048, I 768. "g": g = dy Wd^T (N = I, K = H); "dx": dx = dz_gate Wg^T + dz_up Wu^T (N = H, two
// K segments of I). Weights are distinct per expert (1.2 GB in all: streamed from memory, as in a
// training step).
// --per-thread-jobs: one job per thread at a time (parallel_for_dynamic over the jobs, each a nested
// grouped_gemm_nt call that runs on its thread), as the layer backward's expert-major schedule runs
// them. --same-w: every job reads expert 0's weights (L3-resident: separates the kernel from the
// weight stream).
struct NtCaseSpec { std::string name; int64_t N, K0, K1; };
struct NtModes { bool per_thread_jobs = false, same_w = false; };

static void run_nt_case(const BenchOptions& opt, const NtCaseSpec& cs, const NtModes& md) {
  ot::set_num_threads(opt.threads);
  const int threads = ot::num_threads();
  const int64_t E = 128, T = 512, topk = 8, K = cs.K0 + cs.K1;
  std::vector<int64_t> rows(size_t(E), 0);
  std::mt19937 rng(7);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> ids(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) ids[size_t(e)] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t k = 0; k < topk; ++k) ++rows[size_t(ids[size_t(k)])];
  }
  const int64_t A = T * topk;
  Tensor a = random(DType::bf16, {A, K}, 1);
  Tensor w0 = random(DType::bf16, {E, cs.N, cs.K0}, 2), w1 = cs.K1 ? random(DType::bf16, {E, cs.N, cs.K1}, 3) : Tensor();
  Tensor c = Tensor::empty(DType::f32, {A, cs.N});
  std::vector<gemm::NtJob> jobs;
  double flops = 0;
  for (int64_t e = 0, off = 0; e < E; off += rows[size_t(e)], ++e) {
    gemm::NtJob j;
    j.M = rows[size_t(e)];
    j.N = cs.N;
    j.a = {a.ptr<uint16_t>() + off * K, DType::bf16, K};
    j.w_dtype = DType::bf16;
    const int64_t we = md.same_w ? 0 : e;
    j.w[0] = {w0.ptr<uint16_t>() + we * cs.N * cs.K0, cs.K0, cs.K0};
    if (cs.K1) j.w[1] = {w1.ptr<uint16_t>() + we * cs.N * cs.K1, cs.K1, cs.K1};
    j.c = c.ptr<float>() + off * cs.N;
    j.ldc = cs.N;
    jobs.push_back(j);
    flops += 2.0 * double(j.M) * double(cs.N) * double(K);
  }
  auto fast = [&] {
    if (md.per_thread_jobs)
      ot::parallel_for_dynamic(int64_t(jobs.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) gemm::grouped_gemm_nt(&jobs[size_t(i)], 1);
      });
    else gemm::grouped_gemm_nt(jobs.data(), int64_t(jobs.size()));
  };
  // The reference (fp64 loops) on the first job, scaled by the FLOPs.
  Tensor cr = Tensor::empty(DType::f32, {std::max<int64_t>(rows[0], 1), cs.N});
  auto ref = [&] {
    gemm::NtJob j = jobs[0];
    j.c = cr.ptr<float>();
    cpu::ScopedForceRef on(true);
    gemm::grouped_gemm_nt(&j, 1);
  };
  const double ref_flops = 2.0 * double(rows[0]) * double(cs.N) * double(K);
  Timing t = time_interleaved(fast, opt.no_ref ? std::function<void()>() : std::function<void()>(ref), opt.repeats > 0 ? opt.repeats : 15,
                              opt.no_ref ? 0 : 1);
  BenchResult r;
  r.name = cs.name + (md.per_thread_jobs ? "_per_thread" : "") + (md.same_w ? "_same_w" : "");
  r.shape = "E128 A" + std::to_string(A) + " N" + std::to_string(cs.N) + " K" + std::to_string(cs.K0) + (cs.K1 ? "+" + std::to_string(cs.K1) : "");
  r.dtype = "bf16";
  r.threads = threads;
  r.ms = t.fast_ms;
  r.ref_ms = ref_flops > 0 ? t.ref_ms * flops / ref_flops : 0;
  r.kernel = gemm::kernel_name(DType::bf16, DType::bf16, 1);
  r.gflops = flops / (t.fast_ms * 1e-3) / 1e9;
  r.peak_fraction = r.gflops / matrix_peak_gflops("bf16", threads);
  const double cpu_ms = cpu_ms_per_call(fast, 3), est_ms = cpu_ms / threads;
  r.extra["cpu_ms"] = cpu_ms;
  r.extra["cpu_gflops"] = flops / (est_ms * 1e-3) / 1e9;
  report(opt, r);
  if (!opt.json)
    std::printf("  %-26s cpu %.3f ms/call -> idle estimate %.3f ms: %.1f GFLOP/s\n", "", cpu_ms, est_ms, flops / (est_ms * 1e-3) / 1e9);
}

namespace bench_gemm_local {
const RegisterBench reg("gemm", "Matrix engine: 2048^3, expert and decode shapes (or --m/--n/--k)", [](Options& sub, const BenchOptions& o) {
  struct Args { int64_t m = 0, n = 2048, k = 2048; std::string dtype = "bf16", form = "packed"; NtModes nt; };
  auto args = std::make_shared<Args>();
  sub.value("--m", args->m, "Rows of A (omit for the named cases)");
  sub.value("--n", args->n, "Columns of B");
  sub.value("--k", args->k, "Inner dimension");
  sub.choice("--dtype", args->dtype, {"bf16", "fp16", "fp32"}, "bf16 | fp16 | fp32");
  sub.choice("--form", args->form, {"packed", "nt"}, "packed: gemm on prepacked weights; nt: grouped_gemm_nt at Qwen3 T512's backward shapes");
  sub.flag("--per-thread-jobs", args->nt.per_thread_jobs, "nt: one job per thread at a time (nested single-threaded calls)");
  sub.flag("--same-w", args->nt.same_w, "nt: every job reads expert 0's weights (L3-resident)");
  const BenchOptions* opt = &o;
  return [args, opt]() -> int {
    if (args->form == "nt") {
      for (const NtCaseSpec& cs : {NtCaseSpec{"nt_qwen3-T512_g", 768, 2048, 0}, NtCaseSpec{"nt_qwen3-T512_dx", 2048, 768, 768}})
        if (opt->selected(cs.name)) run_nt_case(*opt, cs, args->nt);
      return 0;
    }
    std::vector<Shape> shapes;
    if (args->m > 0) {
      shapes.push_back({"gemm_m" + std::to_string(args->m) + "_n" + std::to_string(args->n) + "_k" + std::to_string(args->k) + "_" + args->dtype,
                        args->m, args->n, args->k, args->dtype, 0, args->m <= 16});
    } else {
      shapes.push_back({"square_2048_bf16_1t", 2048, 2048, 2048, "bf16", 1});
      shapes.push_back({"square_2048_fp32_1t", 2048, 2048, 2048, "fp32", 1});
      shapes.push_back({"square_2048_bf16", 2048, 2048, 2048, "bf16"});
      for (auto& s : expert_shapes()) shapes.push_back(s);
      for (int64_t m = 1; m <= 4; ++m) shapes.push_back({"decode_m" + std::to_string(m) + "_n4096_k4096_bf16", m, 4096, 4096, "bf16", 0, true});
    }
    for (auto& s : shapes)
      if (opt->selected(s.name)) run_shape(*opt, s);
    ot::set_num_threads(opt->threads);
    return 0;
  };
});

}  // namespace bench_gemm_local
}  // namespace ot::cli
