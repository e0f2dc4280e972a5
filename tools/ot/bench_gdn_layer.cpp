// `ot bench causal_conv1d_fn`, `causal_conv1d_update` and `rms_norm_gated` at Qwen3.5 GDN layer
// shapes (conv channels 2*16*128 + 32*128 = 8192, W 4; the norm over 32 value heads of 128), bf16,
// in GB/s of the bytes each call must read and write at least, against the memory peak. The
// reference is the operator's fp64 path (OT_FORCE_REF), timed once per case.
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "ot/cpu.h"
#include "ot/gdn_layer.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace bench_gdn_layer_local {

constexpr int64_t kConvDim = 2 * 16 * 128 + 32 * 128, kW = 4, kHV = 32, kDV = 128;

using Case = RefCase;
const auto run_cases = run_ref_cases;

// Prefill (T tokens, one sequence, with an initial state and the final state out) and its backward.
int run_conv(const BenchOptions& opt) {
  std::mt19937 rng(1);
  const int64_t T = 1024, D = kConvDim;
  Tensor x = uniform_tensor(rng, DType::bf16, {1, T, D}, -2, 2), w = uniform_tensor(rng, DType::bf16, {D, kW}, -0.5f, 0.5f);
  Tensor s0 = uniform_tensor(rng, DType::bf16, {1, D, kW - 1}, -2, 2), dy = uniform_tensor(rng, DType::bf16, {1, T, D}, -1, 1);
  gdn::CausalConv1dOptions o;
  o.initial_states = s0;
  o.return_final_states = true;
  const double act = double(T * D * 2);
  const std::string sh = "[1, 1024, 8192] W4";
  run_cases(opt, {{"qwen35-T1024-fwd", sh, "bf16", 2 * act, false, [&] { gdn::causal_conv1d_fn(x, w, o); }},
                  {"qwen35-T1024-bwd", sh, "bf16", 3 * act, false, [&] { gdn::causal_conv1d_bwd(x, w, dy, o); }}});
  return 0;
}

// Decode: one token per row on a bf16 state cache, rows in every other slot.
int run_update(const BenchOptions& opt) {
  std::mt19937 rng(2);
  const int64_t D = kConvDim;
  std::vector<Case> cases;
  std::vector<Tensor> keep;
  for (int64_t B : {1, 64}) {
    Tensor x = uniform_tensor(rng, DType::bf16, {B, D}, -2, 2), w = uniform_tensor(rng, DType::bf16, {D, kW}, -0.5f, 0.5f);
    Tensor cache = uniform_tensor(rng, DType::bf16, {2 * B, D, kW - 1}, -2, 2), idx = Tensor::empty(DType::i32, {B});
    for (int64_t b = 0; b < B; ++b) idx.ptr<int32_t>()[b] = int32_t(2 * b);
    keep.insert(keep.end(), {x, w, cache, idx});
    const double bytes = double(B * D * 2 * 2) + 2.0 * double(B * D * (kW - 1) * 2);
    cases.push_back({"qwen35-decode-B" + std::to_string(B), "[" + std::to_string(B) + ", 8192] W4 slots", "bf16", bytes, false, [x, w, cache, idx] {
                       gdn::CausalConv1dUpdateOptions uo;
                       uo.conv_state_indices = idx;
                       gdn::causal_conv1d_update(x, cache, w, uo);
                     }});
  }
  run_cases(opt, cases);
  return 0;
}

// The output norm of T tokens: rows T * 32 heads of 128, fp32 weight.
int run_norm(const BenchOptions& opt) {
  std::mt19937 rng(3);
  const int64_t T = 1024;
  Tensor x = uniform_tensor(rng, DType::bf16, {T, kHV, kDV}, -2, 2), z = uniform_tensor(rng, DType::bf16, {T, kHV, kDV}, -3, 3);
  Tensor w = uniform_tensor(rng, DType::f32, {kDV}, 0.5f, 1.5f), dy = uniform_tensor(rng, DType::bf16, {T, kHV, kDV}, -1, 1);
  gdn::RmsNormGatedOut f = gdn::rms_norm_gated(x, z, w);
  const double act = double(T * kHV * kDV * 2), stat = double(T * kHV * 4);
  const std::string sh = "[1024, 32, 128]";
  run_cases(opt, {{"qwen35-T1024-fwd", sh, "bf16", 3 * act + stat, false, [&] { gdn::rms_norm_gated(x, z, w); }},
                  {"qwen35-T1024-bwd", sh, "bf16", 5 * act + stat, false, [&] { gdn::rms_norm_gated_bwd(dy, x, z, w, f.rstd); }}});
  return 0;
}

RegisterBench conv_bench("causal_conv1d_fn", "GDN short causal conv1d (+ SiLU) forward and backward at Qwen3.5 shapes, GB/s",
                         [](Options&, const BenchOptions& o) { return [&o] { return run_conv(o); }; });
RegisterBench update_bench("causal_conv1d_update", "GDN conv decode step on a bf16 state cache at Qwen3.5 shapes, GB/s",
                           [](Options&, const BenchOptions& o) { return [&o] { return run_update(o); }; });
RegisterBench norm_bench("rms_norm_gated", "GDN gated RMSNorm forward and backward at Qwen3.5 shapes, GB/s",
                         [](Options&, const BenchOptions& o) { return [&o] { return run_norm(o); }; });

}  // namespace bench_gdn_layer_local
}  // namespace ot::cli
