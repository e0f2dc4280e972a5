// `ot bench moe_routing`: the memory-bound routing operators (routers, init routing, permute,
// unpermute, finalize) at a prefill batch (T 1024, H 2048, K 8, E 128), in GB/s of the bytes each
// must read and write at least, against the memory peak; the reference runs once per case.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "ot/moe.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace {

constexpr int64_t T = 1024, H = 2048, K = 8, E = 128;

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
};

int run(const BenchOptions& opt) {
  Tensor logits = rnd(DType::f32, {T, E}, 1), logits256 = rnd(DType::f32, {T, 256}, 2), bias = rnd(DType::f32, {256}, 3);
  Tensor x = rnd(DType::bf16, {T, H}, 4);
  moe::GatingResult g = moe::moe_gating_top_k_softmax(logits, K);
  moe::InitRoutingV2Options io;
  io.expert_num = E; io.expert_tokens_num_type = 1;
  moe::InitRoutingV2Result ir = moe::moe_init_routing_v2(x, g.expert_idx, io);
  moe::TokenPermuteResult pr = moe::moe_token_permute(x, g.expert_idx);
  Tensor scales = Tensor::empty(DType::bf16, {T, K});
  convert_from_f32(g.y.ptr<float>(), scales.view().data, DType::bf16, T * K);
  moe::GatingTopKOptions go;
  go.k = K; go.bias = bias; go.group_count = 8; go.k_group = 4; go.group_select_mode = 1; go.norm_type = 1; go.routed_scaling_factor = 2.5f;
  const double xb = double(T * H * 2), eb = double(T * K * H * 2), ib = double(T * K * 4);
  std::vector<Case> cases = {
      {"gating-softmax-t1024-e128-k8", "[1024, 128] fp32 k8", double(T * E * 4) + 3 * ib,
       [&] { moe::moe_gating_top_k_softmax(logits, K); }, [&] { moe::ref::moe_gating_top_k_softmax(logits, K); }},
      {"gating-top-k-sigmoid-t1024-e256-k8", "[1024, 256] fp32 g8/4", double(T * 256 * 4) + 2 * ib,
       [&] { moe::moe_gating_top_k(logits256, go); }, [&] { moe::ref::moe_gating_top_k(logits256, go); }},
      {"init-routing-v2-t1024-h2048-k8", "[1024, 2048] bf16 k8", xb + eb + 2 * ib,
       [&] { moe::moe_init_routing_v2(x, g.expert_idx, io); }, [&] { moe::ref::moe_init_routing_v2(x, g.expert_idx, io); }},
      {"token-permute-t1024-h2048-k8", "[1024, 2048] bf16 k8", xb + eb + 2 * ib,
       [&] { moe::moe_token_permute(x, g.expert_idx); }, [&] { moe::ref::moe_token_permute(x, g.expert_idx); }},
      {"token-unpermute-t1024-h2048-k8", "[8192, 2048] bf16", eb + xb + 2 * ib,
       [&] { moe::moe_token_unpermute(pr.permuted_tokens, pr.sorted_indices, g.y); },
       [&] { moe::ref::moe_token_unpermute(pr.permuted_tokens, pr.sorted_indices, g.y); }},
      {"finalize-routing-t1024-h2048-k8", "[8192, 2048] bf16 +skip", eb + 2 * xb + 2 * ib,
       [&] { moe::moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, x, {}, {}, scales, {}, 2); },
       [&] { moe::ref::moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, x, {}, {}, scales, {}, 2); }},
  };
  for (const Case& c : cases) {
    if (!opt.selected(c.name)) continue;
    Timing tm = time_interleaved(c.fast, opt.no_ref ? std::function<void()>() : c.ref, opt.repeats > 0 ? opt.repeats : 20, opt.no_ref ? 0 : 1);
    BenchResult r;
    r.name = c.name;
    r.shape = c.shape;
    r.dtype = "bf16";
    r.threads = num_threads();
    r.ms = tm.fast_ms;
    r.ref_ms = tm.ref_ms;
    r.gbps = c.bytes / (r.ms * 1e6);
    double peak = memory_peak_gbps(r.threads);
    r.peak_fraction = peak > 0 ? r.gbps / peak : 0;
    r.kernel = "fp32_rows";
    r.extra["bytes"] = c.bytes;
    report(opt, r);
  }
  return 0;
}

RegisterBench reg("moe_routing", "MoE routing operators (routers, init routing, permute, unpermute, finalize) in GB/s",
                  [](CLI::App*, const BenchOptions& common) { return [&common] { return run(common); }; });

}  // namespace
}  // namespace ot::cli
