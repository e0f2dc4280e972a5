// `ot bench causal_attention`, `rotary_mul`, `adamw_step`, `gated_delta_net_decode` and
// `rms_norm`: the hybrid model's attention, RoPE, optimizer, GDN decode step and norms at its shapes
// (and rms_norm at the demo's). Each case against the operator's fp64 path (OT_FORCE_REF), timed
// interleaved: GFLOP/s against the fp32 matrix peak for attention, GB/s of the bytes a call must
// read and write against the memory peak for the rest.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "ot/attention.h"
#include "ot/cpu.h"
#include "ot/gdn_layer.h"
#include "ot/gemm.h"
#include "ot/norm.h"
#include "ot/optim.h"
#include "ot/parallel.h"
#include "ot/rotary.h"

namespace ot::cli {
namespace bench_layer_ops_local {

using Case = RefCase;
const auto run_cases = run_ref_cases;

std::vector<Tensor> g_keep;  // the cases' tensors (the closures hold views)
Tensor keep(Tensor t) {
  g_keep.push_back(t);
  return t;
}

int attention(const BenchOptions& opt) {
  std::mt19937 rng(1);
  const int64_t B = 8, H = 4, T = 128, D = 32;
  Tensor q = keep(uniform_tensor(rng, DType::f32, {B, H, T, D}, -1, 1)), k = keep(uniform_tensor(rng, DType::f32, {B, H, T, D}, -1, 1));
  Tensor v = keep(uniform_tensor(rng, DType::f32, {B, H, T, D}, -1, 1)), dout = keep(uniform_tensor(rng, DType::f32, {B, H, T, D}, -1, 1));
  AttentionOut o = causal_attention(q, k, v, 0.18f);
  keep(o.o), keep(o.lse);
  const double f = 4.0 * double(B * H * T * T * D);  // the products as computed (full [T, T] scores)
  run_cases(opt, {{"causal_attention-B8H4T128D32", "[8, 4, 128, 32]", "fp32", f, true, [=] { causal_attention(q, k, v, 0.18f); }},
                  {"causal_attention_backward-B8H4T128D32", "[8, 4, 128, 32]", "fp32", 2.5 * f, true,
                   [=] { causal_attention_backward(dout, q, k, v, o.o, o.lse, 0.18f); }}});
  return 0;
}

int rotary(const BenchOptions& opt) {
  std::mt19937 rng(2);
  Tensor x = keep(uniform_tensor(rng, DType::f32, {8, 4, 128, 32}, -1, 1));
  Tensor c = keep(uniform_tensor(rng, DType::f32, {128, 32}, -1, 1)), s = keep(uniform_tensor(rng, DType::f32, {128, 32}, -1, 1));
  run_cases(opt, {{"rotary_mul-B8H4T128D32", "[8, 4, 128, 32]", "fp32", 2.0 * double(x.view().nbytes()), false, [=] { rotary_mul(x, c, s); }}});
  return 0;
}

int adamw(const BenchOptions& opt) {
  // A parameter list shaped like the hybrid model's: 133 tensors, 1.95 M values (experts 128 x 128, projections, norms).
  std::mt19937 rng(3);
  std::vector<TensorView> p, g, m, v;
  int64_t n = 0;
  auto add = [&](std::vector<int64_t> shape) {
    for (auto* list : {&p, &g, &m, &v}) list->push_back(keep(uniform_tensor(rng, DType::f32, shape, 0.f, 0.1f)).view());
    n += p.back().numel();
  };
  add({256, 128});
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 24; ++e) add({128, 128});
    add({8, 128}), add({128}), add({128});
    for (auto shape : {std::vector<int64_t>{384, 128}, {128, 128}, {4, 128}, {4, 128}, {256, 4}, {128, 128}}) add(shape);
  }
  optim::AdamW c;
  run_cases(opt, {{"adamw_step-hybrid", std::to_string(p.size()) + " tensors, " + std::to_string(n) + " values", "fp32", 28.0 * double(n), false,
                   [=] { optim::adamw_step(p, g, m, v, c); }},
                  {"multi_tensor_l2_norm-hybrid", std::to_string(g.size()) + " tensors", "fp32", 4.0 * double(n), false,
                   [=] { optim::multi_tensor_l2_norm(g); }}});
  return 0;
}

int gdn_decode(const BenchOptions& opt) {
  // The hybrid model's GDN layer (hidden 128, 2 key / 4 value heads of 32), one token, fp32.
  std::mt19937 rng(4);
  const int64_t H = 128, HK = 2, HV = 4, DK = 32, DV = 32, C = 2 * HK * DK + HV * DV, Np = C + HV * DV + 2 * HV;
  static gemm::PackedB in, out;
  Tensor win = keep(uniform_tensor(rng, DType::f32, {Np, H}, -0.1f, 0.1f)), wout = keep(uniform_tensor(rng, DType::f32, {H, HV * DV}, -0.1f, 0.1f));
  in = gemm::prepack(win, gemm::BLayout::NK);
  out = gemm::prepack(wout, gemm::BLayout::NK);
  gdn::GdnDecodeLayer L;
  L.in_proj = &in, L.out_proj = &out;
  L.conv_weight = keep(uniform_tensor(rng, DType::f32, {C, 4}, -0.5f, 0.5f));
  L.A_log = keep(uniform_tensor(rng, DType::f32, {HV}, 0.f, 1.f));
  L.dt_bias = keep(uniform_tensor(rng, DType::f32, {HV}, 0.f, 1.f));
  L.norm_weight = keep(uniform_tensor(rng, DType::f32, {DV}, 0.5f, 1.5f));
  L.HK = HK, L.HV = HV, L.DK = DK, L.DV = DV;
  Tensor x = keep(uniform_tensor(rng, DType::f32, {1, H}, -1, 1)), cs = keep(uniform_tensor(rng, DType::f32, {1, C, 3}, -1, 1));
  Tensor st = keep(uniform_tensor(rng, DType::f32, {1, HV, DK, DV}, -0.1f, 0.1f));
  const double bytes = 4.0 * double(Np * H + H * HV * DV + C * 4) + 8.0 * double(HV * DK * DV + C * 3);  // weights, states in and out
  run_cases(opt, {{"gated_delta_net_decode-hybrid-B1", "H128 HK2 HV4 D32", "fp32", bytes, false, [=] { gdn::gated_delta_net_decode(x, L, cs, st); }}});
  return 0;
}

int norms(const BenchOptions& opt) {
  std::mt19937 rng(5);
  std::vector<Case> cases;
  for (auto [T, N] : {std::pair<int64_t, int64_t>{763, 1024}, {1024, 128}}) {
    Tensor x = keep(uniform_tensor(rng, DType::bf16, {T, N}, -2, 2)), x2 = keep(uniform_tensor(rng, DType::bf16, {T, N}, -1, 1));
    Tensor dy = keep(uniform_tensor(rng, DType::bf16, {T, N}, -1, 1)), w = keep(uniform_tensor(rng, DType::f32, {N}, 0.9f, 1.1f));
    Tensor rstd = keep(rms_norm(x, w).rstd);
    const std::string sh = "[" + std::to_string(T) + ", " + std::to_string(N) + "]", tag = "-T" + std::to_string(T) + "N" + std::to_string(N);
    const double act = double(x.view().nbytes());
    cases.push_back({"rms_norm" + tag, sh, "bf16", 2 * act, false, [=] { rms_norm(x, w); }});
    cases.push_back({"add_rms_norm" + tag, sh, "bf16", 4 * act, false, [=] { add_rms_norm(x, x2, w); }});
    cases.push_back({"rms_norm_bwd" + tag, sh, "bf16", 3 * act, false, [=] { rms_norm_bwd(dy, x, w, rstd); }});
  }
  run_cases(opt, cases);
  return 0;
}

RegisterBench attention_bench("causal_attention", "Causal attention forward and backward at the hybrid model's shape, GFLOP/s",
                              [](Options&, const BenchOptions& o) { return [&o] { return attention(o); }; });
RegisterBench rotary_bench("rotary_mul", "Rotate-half RoPE at the hybrid model's attention shape, GB/s",
                           [](Options&, const BenchOptions& o) { return [&o] { return rotary(o); }; });
RegisterBench adamw_bench("adamw_step", "AdamW step and gradient norm over a parameter list shaped like the hybrid model's, GB/s",
                          [](Options&, const BenchOptions& o) { return [&o] { return adamw(o); }; });
RegisterBench gdn_decode_bench("gated_delta_net_decode", "A GDN layer's whole decode step at the hybrid model's shape, GB/s",
                               [](Options&, const BenchOptions& o) { return [&o] { return gdn_decode(o); }; });
RegisterBench norms_bench("rms_norm", "rms_norm, add_rms_norm and rms_norm_bwd at the demo's and the hybrid model's shapes, GB/s",
                          [](Options&, const BenchOptions& o) { return [&o] { return norms(o); }; });

}  // namespace bench_layer_ops_local
}  // namespace ot::cli
