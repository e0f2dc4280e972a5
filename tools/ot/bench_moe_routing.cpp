// `ot bench moe_routing`: the memory-bound routing operators (routers, init routing, permute,
// unpermute, finalize) at prefill batches (H 2048, K 8, E 128), in GB/s of the bytes each must read
// and write at least, against the memory peak; the reference runs once per case.
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_gemm_common.h"
#include "bench_harness.h"
#include "ot/moe.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace bench_moe_routing_local {

constexpr int64_t H = 2048, K = 8, E = 128;

Tensor rnd(DType dt, const std::vector<int64_t>& shape, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  Tensor f = Tensor::empty(DType::f32, shape);
  for (int64_t i = 0; i < f.numel(); ++i) f.ptr<float>()[i] = d(g);
  if (dt == DType::f32) return f;
  Tensor t = Tensor::empty(dt, shape);
  convert_from_f32(f.ptr<float>(), t.view().data, dt, f.numel());
  return t;
}

struct Case {
  std::string name, shape;
  double bytes;
  std::function<void()> fast, ref;
  std::string kernel;
};

// Inputs of one batch size; the cases capture them by reference.
struct Batch {
  int64_t T;
  Tensor logits, logits256, bias, x, scales;
  moe::GatingResult g;
  moe::InitRoutingV2Options io;
  moe::InitRoutingV2Result ir;
  moe::TokenPermuteResult pr;
  moe::GatingTopKOptions go;
  explicit Batch(int64_t t) : T(t) {}
  void init(bool rows) {
    uint32_t s = uint32_t(T);
    logits = rnd(DType::f32, {T, E}, s + 1); logits256 = rnd(DType::f32, {T, 256}, s + 2); bias = rnd(DType::f32, {256}, 3);
    go.k = K; go.bias = bias; go.group_count = 8; go.k_group = 4; go.group_select_mode = 1; go.norm_type = 1; go.routed_scaling_factor = 2.5f;
    g = moe::moe_gating_top_k_softmax(logits, K);
    if (!rows) return;
    x = rnd(DType::bf16, {T, H}, s + 4);
    io.expert_num = E; io.expert_tokens_num_type = 1;
    ir = moe::moe_init_routing_v2(x, g.expert_idx, io);
    pr = moe::moe_token_permute(x, g.expert_idx);
    scales = Tensor::empty(DType::bf16, {T, K});
    convert_from_f32(g.y.ptr<float>(), scales.view().data, DType::bf16, T * K);
  }
};

// Routers at T 1 (a decode step: the call's fixed cost), T 1024 (the input is 0.5 MiB, in cache:
// this measures per-token work and dispatch) and T 16384 (a prefill batch, 8 MiB); the row-moving operators at T 1024 (36+ MiB) and 4096.
void add_cases(Batch& b, bool routers, bool rows, std::vector<Case>& cases) {
  const int64_t T = b.T;
  const std::string t = "-t" + std::to_string(T);
  // The bytes each operator must move at least (read + written once; docs/moe.md "Benchmarks"):
  // x rows xb, expanded rows eb, a [T, K] int32 / fp32 index or weight array ib, bf16 scales sb.
  const double xb = double(T * H * 2), eb = double(T * K * H * 2), ib = double(T * K * 4), sb = double(T * K * 2);
  if (routers) {
    cases.push_back({"gating-softmax" + t + "-e128-k8", "[" + std::to_string(T) + ", 128] fp32 k8", double(T * E * 4) + 3 * ib,
                     [&b] { moe::moe_gating_top_k_softmax(b.logits, K); }, [&b] { moe::ref::moe_gating_top_k_softmax(b.logits, K); }, "router"});
    cases.push_back({"gating-top-k-sigmoid" + t + "-e256-k8", "[" + std::to_string(T) + ", 256] fp32 g8/4", double(T * 256 * 4) + 2 * ib,
                     [&b] { moe::moe_gating_top_k(b.logits256, b.go); }, [&b] { moe::ref::moe_gating_top_k(b.logits256, b.go); }, "router"});
  }
  if (!rows) return;
  const std::string sh = "[" + std::to_string(T) + ", 2048] bf16 k8", ex = "[" + std::to_string(T * K) + ", 2048] bf16";
  cases.push_back({"init-routing-v2" + t + "-h2048-k8", sh, xb + eb + 2 * ib, [&b] { moe::moe_init_routing_v2(b.x, b.g.expert_idx, b.io); },
                   [&b] { moe::ref::moe_init_routing_v2(b.x, b.g.expert_idx, b.io); }, "counting_sort"});
  cases.push_back({"token-permute" + t + "-h2048-k8", sh, xb + eb + 2 * ib, [&b] { moe::moe_token_permute(b.x, b.g.expert_idx); },
                   [&b] { moe::ref::moe_token_permute(b.x, b.g.expert_idx); }, "counting_sort"});
  cases.push_back({"token-unpermute" + t + "-h2048-k8", ex, eb + xb + 2 * ib,
                   [&b] { moe::moe_token_unpermute(b.pr.permuted_tokens, b.pr.sorted_indices, b.g.y); },
                   [&b] { moe::ref::moe_token_unpermute(b.pr.permuted_tokens, b.pr.sorted_indices, b.g.y); }, "combine"});
  cases.push_back({"finalize-routing" + t + "-h2048-k8", ex + " +skip", eb + 2 * xb + ib + sb,
                   [&b] { moe::moe_finalize_routing_v2(b.ir.expanded_x, b.ir.expanded_row_idx, b.x, {}, {}, b.scales, {}, 2); },
                   [&b] { moe::ref::moe_finalize_routing_v2(b.ir.expanded_x, b.ir.expanded_row_idx, b.x, {}, {}, b.scales, {}, 2); }, "combine"});
}

int run(const BenchOptions& opt) {
  std::vector<std::unique_ptr<Batch>> batches;
  std::vector<Case> cases;
  for (auto [T, routers, rows] : {std::tuple{int64_t(1), true, false}, {int64_t(1024), true, true}, {int64_t(16384), true, false}, {int64_t(4096), false, true}}) {
    std::vector<Case> mine;
    auto b = std::make_unique<Batch>(T);
    add_cases(*b, routers, rows, mine);
    bool any = false, any_rows = false;
    for (Case& c : mine)
      if (opt.selected(c.name)) {
        any = true;
        any_rows |= c.kernel != "router";
        cases.push_back(std::move(c));
      }
    if (!any) continue;  // nothing selected: the inputs are never made
    b->init(any_rows);
    batches.push_back(std::move(b));
  }
  for (const Case& c : cases) {
    Timing tm = time_interleaved(c.fast, opt.no_ref ? std::function<void()>() : c.ref, opt.repeats > 0 ? opt.repeats : 20, opt.no_ref ? 0 : 1, true);
    BenchResult r;
    r.name = c.name;
    r.shape = c.shape;
    r.dtype = c.kernel == "router" ? "fp32" : "bf16";
    r.threads = num_threads();
    r.ms = tm.fast_ms;
    r.ref_ms = tm.ref_ms;
    set_bandwidth(r, c.bytes / (r.ms * 1e6), tm);
    r.kernel = c.kernel == "router" ? kernel_of_call(c.fast) : c.kernel;
    r.extra["bytes"] = c.bytes;
    // Idle-machine estimate from process CPU time (the machine is shared; spinning OpenMP workers
    // are counted, so it errs slow).
    const double cpu_ms = gemmbench::cpu_ms_per_call(c.fast, 3), est_ms = cpu_ms / r.threads, est = c.bytes / (est_ms * 1e6);
    r.extra["cpu_ms"] = cpu_ms;
    r.extra["idle_estimate_ms"] = est_ms;
    r.extra["cpu_gbps"] = est;
    report(opt, r);
    if (!opt.json) {
      const double peak = memory_peak_gbps(r.threads);
      std::printf("  %-26s cpu %.3f ms/call -> idle estimate %.3f ms: %.1f GB/s (%.1f%% of peak)\n", "", cpu_ms, est_ms, est,
                  peak > 0 ? 100 * est / peak : 0.0);
    }
  }
  return 0;
}

RegisterBench reg("moe_routing", "MoE routing operators (routers, init routing, permute, unpermute, finalize) in GB/s",
                  [](Options&, const BenchOptions& common) { return [&common] { return run(common); }; });

}  // namespace bench_moe_routing_local
}  // namespace ot::cli
