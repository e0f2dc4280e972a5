// The two operators of the Gated DeltaNet layer around its core (names and semantics of
// flash-linear-attention and the causal-conv1d package):
//   causal_conv1d_fn / causal_conv1d_bwd: the short depthwise causal convolution over time (+ SiLU)
//     of the q, k, v projections, fixed-length or packed varlen (cu_seqlens), with conv states;
//   causal_conv1d_update: its decode step on a conv state cache (slots picked per row);
//   rms_norm_gated / rms_norm_gated_bwd: the output norm y = rmsnorm(o) * weight * silu(z);
//   gated_delta_net_decode: one decode step of the whole layer (projections to projections).
// Inputs fp32 / bf16 / fp16 with any strides; compute in fp32; outputs contiguous in x's dtype.
#pragma once
#include <cstdint>

#include "ot/gemm.h"
#include "ot/tensor.h"

namespace ot::gdn {

enum class Activation : uint8_t { none, silu };

// ---- causal depthwise conv1d ----------------------------------------------------------------
// x [B, T, D] (channels last; packed varlen: [1, T_total, D] with cu_seqlens), weight [D, W]
// (W in [2, 8]), bias [D]:
//   y[t, d] = act(bias[d] + sum_k weight[d, k] * x[t - (W-1) + k, d])
// where the W-1 inputs before a sequence's first token come from its initial state (zeros when
// none). A sequence never sees the previous sequence's tokens.
// States [N, D, W-1] (N = B, or the number of sequences in varlen mode), oldest input first:
// initial_states in x's dtype or fp32; final_states are the last W-1 inputs of each sequence in x's
// dtype: with fewer than W-1 tokens, the tail of the initial state (zeros without one) in front.
struct CausalConv1dOptions {
  TensorView bias;                 // [D], any float dtype; undefined: none
  TensorView initial_states;       // [N, D, W-1]; undefined: zeros
  bool return_final_states = false;
  Activation activation = Activation::silu;
  TensorView cu_seqlens;           // host [N+1] int32/int64, 0 first, non-decreasing, last == T (B == 1)
};
struct CausalConv1dOut {
  Tensor y;             // [B, T, D] in x's dtype
  Tensor final_states;  // [N, D, W-1] in x's dtype (return_final_states only)
};
CausalConv1dOut causal_conv1d_fn(const TensorView& x, const TensorView& weight, const CausalConv1dOptions& o = {});

// Backward of causal_conv1d_fn (the pre-activation is recomputed from x): dy like y, dfinal_states
// (optional) like final_states. dweight [D, W] and dbias [D] are fp32, accumulated in a fixed order
// (deterministic whatever the thread count); dinitial_states is defined when initial_states is, in
// its dtype; dx in x's dtype.
struct CausalConv1dGrads {
  Tensor dx, dweight, dbias, dinitial_states;
};
CausalConv1dGrads causal_conv1d_bwd(const TensorView& x, const TensorView& weight, const TensorView& dy,
                                    const CausalConv1dOptions& o = {}, const TensorView& dfinal_states = {});

// One decode step (or a few tokens) on a conv state cache, vLLM style. x [B, D] or [B, S, D];
// conv_state [num_slots, D, W-1] in x's dtype or fp32, updated in place: row b uses slot
// conv_state_indices[b] (int32 [B]; undefined: slot b, num_slots == B). A negative index marks a
// padded row: its output is zeros and no state is touched. Two rows may not share a slot.
struct CausalConv1dUpdateOptions {
  TensorView bias;
  Activation activation = Activation::silu;
  TensorView conv_state_indices;
};
Tensor causal_conv1d_update(const TensorView& x, const TensorView& conv_state, const TensorView& weight,
                            const CausalConv1dUpdateOptions& o = {});

// ---- gated RMSNorm ----------------------------------------------------------------------------
// x, z [..., N] (same shape), weight [N]; rms over groups of group_size consecutive values of the
// last dim (0: the whole last dim; must divide N):
//   norm_before_gate:  y = x * rstd(x) * weight * silu(z)
//   otherwise:         y = u * rstd(u) * weight,  u = x * silu(z)
// with rstd(v) = 1 / sqrt(mean(v^2) + eps) per group. rstd is returned ([rows, N / group_size]
// fp32) for the backward.
struct RmsNormGatedOptions {
  float eps = 1e-6f;
  bool norm_before_gate = true;
  int64_t group_size = 0;
};
struct RmsNormGatedOut {
  Tensor y, rstd;
};
RmsNormGatedOut rms_norm_gated(const TensorView& x, const TensorView& z, const TensorView& weight,
                               const RmsNormGatedOptions& o = {});
// dx, dz in x's / z's dtype; dweight fp32 (fixed-order reduction over rows: deterministic).
// rstd: the forward's (undefined: recomputed).
struct RmsNormGatedGrads {
  Tensor dx, dz, dweight;
};
RmsNormGatedGrads rms_norm_gated_bwd(const TensorView& dy, const TensorView& x, const TensorView& z, const TensorView& weight,
                                     const TensorView& rstd, const RmsNormGatedOptions& o = {});

// ---- one decode step of the whole layer (Qwen3.5 GatedDeltaNet) ------------------------------
// B sequences, one token each, x [B, H]:
//   proj = x in_proj^T, in_proj the rows [q k v | z | b | a] ([2 HK DK + HV DV | HV DV | HV | HV], H)
//   [q k v] = causal_conv1d_update([q k v], conv_state, conv_weight) with SiLU (conv_state
//            [B, C, W-1], C = 2 HK DK + HV DV, updated in place)
//   o = the recurrent step on state [B, HV, DK, DV] (fp32, updated in place): q, k l2-normalised,
//       g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), scale 1 / sqrt(DK)
//   y = rms_norm_gated(o, z, norm_weight) out_proj^T ([H, HV DV])
// The same operators as the layer run one by one (the same bits), without a caller round trip
// between them. x in in_proj's dtype; y [B, H] in x's dtype.
struct GdnDecodeLayer {
  const gemm::PackedB* in_proj = nullptr;
  const gemm::PackedB* out_proj = nullptr;
  TensorView conv_weight;     // [C, W]
  TensorView A_log, dt_bias;  // [HV] fp32
  TensorView norm_weight;     // [DV]
  int64_t HK = 0, HV = 0, DK = 0, DV = 0;
  float eps = 1e-6f;          // the gated norm's
};
Tensor gated_delta_net_decode(const TensorView& x, const GdnDecodeLayer& layer, const TensorView& conv_state, const TensorView& state);

}  // namespace ot::gdn
