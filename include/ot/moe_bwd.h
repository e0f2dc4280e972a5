// MoE backward (training): gradients of the MoE forward operators (ot/moe.h) whose outputs carry
// gradients: the grouped matmul and its activation epilogue, routing (permute / unpermute, init
// routing, finalize), routers and the load-balancing losses.
// Shape letters: T tokens, H hidden, E experts, K top-k; for the grouped matmul M rows (tokens x k,
// sorted by expert), K in features, N out features, G groups.
// Index conventions are the forward's (spec moe_ops.md section 2): token-major j = t*K + k,
// k-major c = k*T + t, gather (src->dst) or scatter (dst->src) maps, -1 = dropped.
// Conventions: activations' gradients come back in the activation dtype; weight and bias gradients
// are fp32 (master-weight precision; moe_ffn_backward can give bf16 expert gradients on request);
// compute accumulates in fp32 (reference: fp64). Every entry
// point validates all arguments (ot::Error naming the argument) before writing anything, and
// OT_FORCE_REF=1 routes to ot::moe::ref.
#pragma once
#include <cstdint>

#include "ot/gemm.h"
#include "ot/moe.h"
#include "ot/tensor.h"

namespace ot::moe {

// ---- activation epilogue ----------------------------------------------------------------------
// Gradient of y = act(z) with respect to z. For Act::swiglu, z [M, 2N] = [gate | up] and
// y = silu(gate) * up [M, N]; otherwise z and y are [M, N]. dz: z's shape, f32/bf16/f16.
void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);

// ---- grouped_matmul_backward --------------------------------------------------------------------
// Forward (moe grouped_matmul, M-split): for the rows r of group g, y[r] = act(x[r] @ W[g] + b[g]).
//   dz     = act'(z) * dy            z = x @ W + b is recomputed (one grouped GEMM) unless given:
//                                    storing z costs M x N per layer, recomputing it costs the
//                                    forward's FLOPs again, so callers that keep it pass it in.
//   dx[r]  = dz[r] @ W[g]^T          (matmul on the transposed weight view, no copy)
//   dW[g]  = x_g^T @ dz_g            (matmul on the transposed activation view)
//   db[g]  = sum of dz_g's rows
// group_list: [G] cumsum (type 0) / count (type 1) or [G', 2] (group, count) (type 2), int32 or
// int64, covering all M rows. Groups with no rows get zero weight/bias gradients.
struct GroupedMatmulBackwardOptions {
  int group_list_type = 0;        // 0 cumsum, 1 count, 2 key-value
  gemm::Act act = gemm::Act::none;
  TensorView bias;                // [G, N] forward bias (float), used to recompute z
  TensorView pre_act;             // [M, N] stored z (skips the recompute), any float dtype
  bool need_dx = true, need_dweight = true, need_dbias = false;
  // Optional caller buffers (e.g. fp32 gradient accumulators, or a transposed view of a torch
  // [G, N, K] gradient). When given, the gradient goes there (added when accumulate) and the
  // matching result tensor stays empty.
  TensorView dweight_out;         // [G, K, N] float, any strides
  TensorView dbias_out;           // [G, N] float
  bool accumulate = false;
};
struct GroupedMatmulGrads {
  Tensor dx;       // [M, K] x's dtype
  Tensor dweight;  // [G, K, N] fp32
  Tensor dbias;    // [G, N] fp32
};
// dy [M, N'] (N' = N, or N/2 for swiglu) in x's dtype; x [M, K]; weight [G, K, N] (strided views
// accepted, e.g. torch's [G, N, K] transposed).
GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt = {});

// ---- routing: permute / unpermute, init routing, finalize ---------------------------------------
// moe_token_permute: permuted[sorted_indices[t*K+k]] = tokens[t] for destinations < P.
// d_tokens[t] = sum_k d_permuted[sorted_indices[t*K+k]] (destinations >= P, i.e. rows cut by
// num_out_tokens, contribute nothing). d_permuted [P, H]; sorted_indices [T*K] int32 -> [T, H].
Tensor moe_token_permute_backward(const TensorView& d_permuted, const TensorView& sorted_indices, int64_t topk);

// moe_token_unpermute: out[t] = sum_k probs[t,k] * permuted[d], d = sorted_indices[t*K+k] valid
// when 0 <= d < P.  d_permuted[d] = probs[t,k] * d_out[t] (rows nobody reads get 0);
// d_probs[t,k] = d_out[t] . permuted[d] (0 for invalid d). Without probs, K = 1 and no d_probs.
struct TokenUnpermuteGrads {
  Tensor d_permuted;  // [P, H] permuted's dtype
  Tensor d_probs;     // [T, K] fp32
};
TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& d_out, const TensorView& permuted_tokens,
                                                 const TensorView& sorted_indices, const TensorView& probs = {});

// moe_init_routing_v2 (expanded_x[dst] = x[src / K]): d_x[n] = sum over kept (n, k) of
// d_expanded_x[dst]. Dropped pairs (-1, capacity or active range) and rows cut by active_num
// (dst >= rows) get nothing. d_expanded_x: dropless [rows, H], drop/pad [E, C, H].
// expanded_row_idx [N*K]: row_idx_type 0 gather (token-major src -> dst, -1 dropped), 1 scatter
// (dst -> src for dst < rows; dropless only). Quantised (int8) outputs carry no gradient.
Tensor moe_init_routing_v2_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens,
                                    int64_t topk, int row_idx_type = 0);
// moe_init_routing (v1): expanded_row_idx is k-major (c = k*N + n -> dst), rows >= min(N, active_num)*K cut.
Tensor moe_init_routing_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens, int64_t topk);

// moe_finalize_routing (v1 = v2 mode 0) / v2: out[n] = x1[n] + x2[n] + sum_k s[n,k] (R[d] + bias[e]).
//   d_expanded_x[d] = s[n,k] d_out[n]   (d = -1 in drop/pad modes: nothing; unused rows/slots 0)
//   d_scales[n,k]  = d_out[n] . (R[d] + bias[e])   (R[-1] = 0, the bias still counts, as forward)
//   d_bias[e]     += s[n,k] d_out[n]
//   d_x1 = d_x2 = d_out (returned by the caller's own d_out: not copied here)
struct FinalizeRoutingGrads {
  Tensor d_expanded_x;  // expanded_x's shape and dtype
  Tensor d_scales;      // [N, K] fp32 (when scales given)
  Tensor d_bias;        // [E, H] fp32 (when bias given)
};
FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& d_out, const TensorView& expanded_x,
                                                      const TensorView& expanded_row_idx, const TensorView& scales = {},
                                                      const TensorView& bias = {}, const TensorView& expert_idx = {},
                                                      int drop_pad_mode = 0);

// ---- routers: gradient to the selected scores only -------------------------------------------
// Selection (top-k, groups, the selection bias, masks) is piecewise constant: no gradient.
// Rows whose ids are E (finished) get zero gradient. allowed [T, E] u8 as in the forward
// (softmax over the allowed experts only). dy [T, K] gradient of y; result d_x [T, E] fp32.
// v1 and v2 renorm 0: y = softmax(x)[ids]  ->  d_x = p * (g - sum(g * p)), g = dy scattered to ids.
Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx,
                                         const TensorView& allowed = {});
// v2: renorm 0 as v1; renorm 1: y = softmax over the k selected logits.
Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx, int renorm = 0,
                                            const TensorView& allowed = {});
// moe_gating_top_k (torch_npu npu_moe_gating_top_k_backward): scores [T, E] fp32 = the forward's
// `out` (softmax or sigmoid of x, before the bias). y = scale * v, v = s[ids] (norm_type 0) or
// s[ids] / (sum + eps) (norm_type 1); renorm 1 (softmax path) divides by the sum as well, the
// way vllm-ascend renormalises outside the kernel.
Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& scores, const TensorView& expert_idx, int renorm = 0,
                                 int norm_type = 0, float routed_scaling_factor = 1.f, float eps = 1e-20f);
// Renormalised weights w = y / sum_k y (Qwen3 norm_topk_prob): dy = (dw - sum(dw * w)) / sum_k y.
// y, dw [T, K] -> dy [T, K] fp32.
Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y);

// ---- losses ------------------------------------------------------------------------------------
// moe_aux_loss = coeff * E / (K T^2) * sum_i (sum_t probs[t,i]) * counts[i]: the counts are
// constants, so d probs[t,i] = d_loss * coeff * E * counts[i] / (K T^2). -> [T, E] fp32.
Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff = 1.f,
                             float d_loss = 1.f);
// moe_z_loss = coeff * mean over valid t of lse_t^2: d logits[t] = d_loss * coeff * 2 lse_t softmax(logits[t]) / n_valid.
Tensor moe_z_loss_backward(const TensorView& logits, float coeff = 1.f, const TensorView& mask = {}, float d_loss = 1.f);

// ---- moe_ffn_backward: the whole layer --------------------------------------------------------
// Layer (as ot::moe::moe_ffn, EHI weights): logits = x R^T; (ids, w) = router(logits);
//   y[t] = residual[t] + shared(x[t]) + sum over kept (t, k) of w[t,k] * FFN_e(x[t]),
//   FFN_e(v) = (silu(v Wg_e) * (v Wu_e)) Wd_e.
// Training runs moe_ffn_forward_train (same result as moe_ffn, on unpacked weights) which keeps
// what the backward needs, then moe_ffn_backward. What is kept and what is recomputed:
//   kept:        router logits, ids, weights (before and after norm_topk_prob), gating scores
//                (all [T, E] or [T, K]: small); the routing plan; the gate/up pre-activation
//                z [A, 2I] (A = kept pairs) in x's dtype, since recomputing it costs a third of
//                the layer's forward FLOPs; the shared expert's z [T, 2Is].
//   recomputed:  the gathered x rows (a copy), a = silu(g) * u and its derivative (element-wise
//                from z).
//   never built: the down projection output o: d w[t,k] = dy[t] . o = (dy[t] Wd^T) . a, and
//                dy[t] Wd^T is needed for d a anyway.
// Backward FLOPs: 2x the expert forward (dx, dW for each of the three projections).
struct MoeFfnWeights {
  TensorView router;                    // [E, H]
  TensorView gate, up;                  // [E, H, I]
  TensorView down;                      // [E, I, H]
  TensorView shared_gate, shared_up;    // [H, Is] (optional shared expert, weight 1)
  TensorView shared_down;               // [Is, H]
};
struct MoeFfnSaved {
  int64_t T = 0, H = 0, E = 0, K = 0, I = 0, Is = 0;
  DType dtype = DType::f32;
  Tensor router_logits;  // [T, E] fp32
  Tensor topk_ids;       // [T, K] int32
  Tensor router_y;       // [T, K] fp32 router output (before norm_topk_prob)
  Tensor topk_weights;   // [T, K] fp32 combine weights
  Tensor scores;         // [T, E] fp32 gating_top_k scores (that router only)
  RoutingPlan plan;      // kept pairs sorted by expert
  Tensor z;              // [A, 2I] x's dtype: [gate | up] pre-activation
  Tensor shared_z;       // [T, 2Is]
  Tensor expert_counts;  // [E] int64
  int64_t dropped = 0;
};
struct MoeFfnTrainResult {
  Tensor y;          // [T, H] x's dtype
  MoeFfnSaved saved;
};
// opt as for moe_ffn; opt.shared is ignored (the shared expert comes from w.shared_*).
MoeFfnTrainResult moe_ffn_forward_train(const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& opt = {});

struct MoeFfnBackwardOptions {
  float aux_loss_coeff = 0;  // > 0: add moe_aux_loss (on the softmax / normalised sigmoid probs) to the loss
  float z_loss_coeff = 0;    // > 0: add moe_z_loss of the router logits
  // dtype of the expert weight gradients d_gate/d_up/d_down: f32 (master-precision accumulators)
  // or bf16 (as PyTorch produces for bf16 parameters: half the bytes, and writing these gradients
  // is what bounds the backward). Rounded once from the fp32 sum (with accumulate: c + sum), to
  // nearest even; on AVX512_BF16 by vcvtne2ps2bf16, which flushes results below bf16's normal
  // range (|v| < 1.2e-38) to zero -- harmless for weight gradients (an optimizer step on such a
  // value is 0 anyway); fp32 gradients are not flushed.
  DType weight_grad_dtype = DType::f32;
  // Optional caller-owned buffers for the expert weight gradients (contiguous [E, H, I], [E, H, I],
  // [E, I, H] in weight_grad_dtype): written in place of fresh tensors (the result's
  // d_gate/d_up/d_down share their storage), or added to with accumulate (experts without rows are
  // then untouched). A training loop keeps one set: fresh multi-GB gradient tensors per call cost
  // page faults that can exceed the backward itself.
  Tensor d_gate_out, d_up_out, d_down_out;
  bool accumulate = false;
};
struct MoeFfnGrads {
  Tensor dx;                                          // [T, H] x's dtype (d residual = dy: the caller's)
  Tensor d_router;                                    // [E, H] fp32
  Tensor d_gate, d_up, d_down;                        // [E, H, I], [E, H, I], [E, I, H] weight_grad_dtype
  Tensor d_shared_gate, d_shared_up, d_shared_down;   // [H, Is], [H, Is], [Is, H] fp32
  float aux_loss = 0, z_loss = 0;                     // values of the added losses
};
// dy [T, H] in x's dtype; x, w, opt: those of the forward; saved: its result.
MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnSaved& saved,
                             const MoeFfnOptions& opt = {}, const MoeFfnBackwardOptions& bopt = {});

namespace ref {
// fp64 per-token reference of the layer's gradients (router selection from the forward's reference
// router, then every projection differentiated row by row).
MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& opt = {},
                             const MoeFfnBackwardOptions& bopt = {});
Tensor moe_token_permute_backward(const TensorView& d_permuted, const TensorView& sorted_indices, int64_t topk);
TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& d_out, const TensorView& permuted_tokens,
                                                 const TensorView& sorted_indices, const TensorView& probs = {});
Tensor moe_init_routing_v2_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens,
                                    int64_t topk, int row_idx_type = 0);
Tensor moe_init_routing_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens, int64_t topk);
FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& d_out, const TensorView& expanded_x,
                                                      const TensorView& expanded_row_idx, const TensorView& scales = {},
                                                      const TensorView& bias = {}, const TensorView& expert_idx = {},
                                                      int drop_pad_mode = 0);
Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx,
                                         const TensorView& allowed = {});
Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx, int renorm = 0,
                                            const TensorView& allowed = {});
Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& scores, const TensorView& expert_idx, int renorm = 0,
                                 int norm_type = 0, float routed_scaling_factor = 1.f, float eps = 1e-20f);
Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y);
Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff = 1.f,
                             float d_loss = 1.f);
Tensor moe_z_loss_backward(const TensorView& logits, float coeff = 1.f, const TensorView& mask = {}, float d_loss = 1.f);
void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);
GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt = {});
}  // namespace ref

}  // namespace ot::moe
