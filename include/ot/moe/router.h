// MoE routers (spec section 3): score the experts of every token and keep the top k.
// Shapes: x [T, E] (v1/v2 also [B, S, E]); outputs [.., k]. Compute is fp32; y is cast (RNE) to
// x's dtype. Ties go to the lower expert id. Every router accepts `allowed`, an optional per-token
// mask [.., E] (u8, nonzero = allowed) so tokens of one modality pick only that modality's experts:
// a disallowed expert never wins, and softmax normalises over the allowed experts only (its logit
// counts as -inf). Each row must allow at least k experts.
// Errors: NaN/Inf scores, k outside [1, min(E, 1024)], bad finished/allowed/bias shapes.
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot::moe {

struct GatingResult {
  Tensor y;           // [.., k] dtype of x: routing weights
  Tensor expert_idx;  // [.., k] int32
  Tensor row_idx;     // v1 only: [.., k] int32, k-major: row_idx[r, s] = s * R + r
  Tensor scores;      // v2 output_softmax / gating_top_k out_flag: [.., E] fp32 (kept for backward)
};

// v1 (npu_moe_gating_top_k_softmax): softmax over E, top-k, no renorm. finished [..] u8: rows with
// finished set get expert_idx = E (y still holds the top-k values).
GatingResult moe_gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished = {},
                                      const TensorView& allowed = {});

// v2: renorm 0 = softmax then top-k (output_softmax returns the full softmax);
// renorm 1 = top-k on the logits, then softmax over the k values (Mixtral); no softmax output.
GatingResult moe_gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished = {},
                                         int renorm = 0, bool output_softmax = false, const TensorView& allowed = {});

struct GatingTopKOptions {
  int64_t k = 1;
  TensorView bias;              // [E], selection only (DeepSeek-V3 e_score_correction_bias)
  int64_t k_group = 1;          // groups kept
  int64_t group_count = 1;      // must divide E
  int group_select_mode = 0;    // 0: group score = max; 1: sum of the top 2
  int renorm = 0;               // only 0 (as upstream); renormalisation is norm_type 1's sum
  int norm_type = 0;            // 0 softmax, 1 sigmoid (then y /= sum(y) + eps)
  bool out_flag = false;        // return the unbiased scores [T, E] in `scores`
  float routed_scaling_factor = 1.f;
  float eps = 1e-20f;
  TensorView allowed;           // [T, E] u8
};
// npu_moe_gating_top_k: x [T, E].
GatingResult moe_gating_top_k(const TensorView& x, const GatingTopKOptions& opt);

namespace ref {
GatingResult moe_gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished = {}, const TensorView& allowed = {});
GatingResult moe_gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished = {}, int renorm = 0,
                                         bool output_softmax = false, const TensorView& allowed = {});
GatingResult moe_gating_top_k(const TensorView& x, const GatingTopKOptions& opt);
}  // namespace ref

}  // namespace ot::moe
