// Validated descriptions of the routing calls (init routing v1/v2, permute, unpermute, re-routing),
// executed by the fast kernels (the references, src/ref/moe_routing_ref.h, take the public arguments).
#pragma once
#include <vector>

#include "ot/moe/routing.h"

namespace ot::moe::impl {

struct InitV1Plan {
  int64_t N = 0, K = 0, H = 0, active_tokens = 0;
  Tensor hx, hr, he;
  TensorView x, row_idx, expert_idx;  // contiguous
};
InitV1Plan plan_init_v1(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num);
InitRoutingResult alloc_init_v1(const InitV1Plan& p);
void init_v1_fast(const InitV1Plan& p, InitRoutingResult& r);

struct InitV2Plan {
  InitRoutingV2Options o;
  int64_t N = 0, K = 0, H = 0, E = 0, start = 0, end = 0, C = 0;
  enum class Scale { none, per_token, smooth_one, smooth_expert, static_q } scale = Scale::none;
  float static_scale = 1, static_offset = 0;
  Tensor hx, he, hs;
  TensorView x, expert_idx, smooth;  // contiguous; smooth: [N] fp32 per token or [rows, H] fp32
};
InitV2Plan plan_init_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o);
// The sort and counts are data-dependent, so the executor allocates its outputs.
InitRoutingV2Result init_v2_fast(const InitV2Plan& p);

struct PermutePlan {
  int64_t T = 0, K = 0, H = 0, rows = 0, experts = 0, cap = 0;
  bool padded = false;
  Tensor ht, hi;
  TensorView tokens, indices;
};
PermutePlan plan_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens, bool padded);
void permute_fast(const PermutePlan& p, TokenPermuteResult& r);

struct UnpermutePlan {
  int64_t T = 0, K = 0, H = 0, P = 0;
  bool padded = false;
  Tensor hp, hi, hpr;
  TensorView permuted, sorted, probs;
};
UnpermutePlan plan_unpermute(const TensorView& permuted, const TensorView& sorted, const TensorView& probs, bool padded, int64_t restore_rows);
void unpermute_fast(const UnpermutePlan& p, const TensorView& out);

}  // namespace ot::moe::impl
