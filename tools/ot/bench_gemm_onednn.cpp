// `ot bench gemm_onednn`: our engine against oneDNN's bf16 matmul (Debian libdnnl, a benchmark-only
// dependency linked into the ot tool when found) on the expert shapes, timed side by side
// (interleaved). Both get the weights pre-packed in their preferred layout, bf16 in and out.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "ot/gemm.h"
#include "ot/parallel.h"

namespace ot::cli {

using namespace gemmbench;

static void run_vs_onednn(const BenchOptions& opt, const Shape& s) {
  ot::set_num_threads(opt.threads);
  const int threads = ot::num_threads();
  omp_set_num_threads(threads);
  Tensor a = random(DType::bf16, {s.M, s.K}, 1), w = random(DType::bf16, {s.N, s.K}, 2);
  Tensor c = Tensor::empty(DType::bf16, {s.M, s.N}), cd = Tensor::empty(DType::bf16, {s.M, s.N});
  gemm::PackedB pw = gemm::prepack(w, gemm::BLayout::NK);

  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::memory::desc a_md({s.M, s.K}, dt::bf16, tag::ab), c_md({s.M, s.N}, dt::bf16, tag::ab);
  dnnl::memory::desc w_user({s.K, s.N}, dt::bf16, tag::ba);  // torch Linear [N, K] storage
  dnnl::memory::desc w_any({s.K, s.N}, dt::bf16, tag::any);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_any, c_md), eng);
  dnnl::memory a_mem(a_md, eng, a.view().data), c_mem(c_md, eng, cd.view().data), wu_mem(w_user, eng, w.view().data);
  dnnl::memory w_mem(pd.weights_desc(), eng);
  dnnl::reorder(wu_mem, w_mem).execute(strm, wu_mem, w_mem);
  strm.wait();
  dnnl::matmul mm(pd);

  auto ours = [&] { gemm::gemm(s.M, {a.view().data, DType::bf16, s.K}, pw, {c.view().data, DType::bf16, s.N}); };
  auto theirs = [&] {
    mm.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  };
  const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
  int reps = opt.repeats > 0 ? opt.repeats : int(std::clamp(2e10 / flops, 5.0, 100.0));
  Timing t = time_interleaved(ours, theirs, reps, reps);
  BenchResult r;
  r.name = s.name;
  r.shape = shape_str(s);
  r.dtype = "bf16";
  r.threads = threads;
  r.ms = t.fast_ms;
  r.ref_ms = t.ref_ms;  // the "reference" of this benchmark is oneDNN: speedup = ours over oneDNN
  r.gflops = flops / (t.fast_ms * 1e-3) / 1e9;
  r.peak_fraction = r.gflops / matrix_peak_gflops("bf16", threads);
  r.kernel = std::string(gemm::kernel_name(DType::bf16, DType::bf16, s.M)) + " vs onednn";
  r.extra["onednn_ms"] = t.ref_ms;
  r.extra["onednn_gflops"] = flops / (t.ref_ms * 1e-3) / 1e9;
  r.extra["speedup_vs_onednn"] = t.ref_ms / t.fast_ms;
  // CPU time per call of both (the machine is shared; see cpu_ms_per_call).
  const double ours_cpu = cpu_ms_per_call(ours, 3), theirs_cpu = cpu_ms_per_call(theirs, 3);
  r.extra["cpu_ms"] = ours_cpu;
  r.extra["onednn_cpu_ms"] = theirs_cpu;
  r.extra["cpu_speedup_vs_onednn"] = theirs_cpu / ours_cpu;
  report(opt, r);
  if (!opt.json)
    std::printf("  %-26s cpu ms/call: ours %.3f, oneDNN %.3f -> %.2fx\n", "", ours_cpu, theirs_cpu, theirs_cpu / ours_cpu);
}

namespace bench_gemm_onednn_local {
const RegisterBench reg("gemm_onednn", "Our bf16 GEMM vs oneDNN matmul on the expert shapes (speedup = ours over oneDNN)",
                         [](Options& sub, const BenchOptions& o) {
                           struct Args { int64_t m = 0, n = 4096, k = 4096; };
                           auto args = std::make_shared<Args>();
                           sub.value("--m", args->m, "Rows of A (omit for the expert shapes)");
                           sub.value("--n", args->n, "Columns of B");
                           sub.value("--k", args->k, "Inner dimension");
                           const BenchOptions* opt = &o;
                           return [args, opt]() -> int {
                             std::vector<Shape> shapes;
                             if (args->m > 0) shapes.push_back({"onednn_m" + std::to_string(args->m) + "_n" + std::to_string(args->n) + "_k" + std::to_string(args->k) + "_bf16",
                                                                args->m, args->n, args->k, "bf16"});
                             else shapes = expert_shapes();
                             for (auto& s : shapes)
                               if (opt->selected(s.name)) run_vs_onednn(*opt, s);
                             return 0;
                           };
                         });

}  // namespace bench_gemm_onednn_local
}  // namespace ot::cli
