// Token permutation by expert (spec sections 4, 5, 8). All sorts are the canonical stable sort of
// the token-major flattened expert ids (ties keep token order). Index tensors are int32.
// int8 outputs (quantised expanded_x) are DType::i8 tensors, as the EP dispatch's.
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot::moe {

// ---- init routing v1 (npu_moe_init_routing) -------------------------------------------------
// x [N, H]; row_idx [N, K] int32 (normally the router's k-major row_idx); expert_idx [N, K] int32
// with ids in [0, 2^24) (E itself is fine: finished rows sort last). active_num counts tokens.
struct InitRoutingResult {
  Tensor expanded_x;           // [min(N, active_num) * K, H]
  Tensor expanded_row_idx;     // [N*K] int32, indexed by row_idx value (k-major): destination row
  Tensor expanded_expert_idx;  // [N*K] int32, sorted ids
};
InitRoutingResult moe_init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num);

// ---- init routing v2 (npu_moe_init_routing_v2 = aclnn V3 semantics) -------------------------
struct InitRoutingV2Options {
  TensorView scale;               // no quant: [N] per-token scale carried along; quant 0: [1]; quant 1: [E_range, H] or [1, H]
  TensorView offset;              // quant 0 only: [1]
  int64_t active_num = -1;        // -1/0: all available rows; > 0: at most that many expanded rows (dropless)
  int64_t expert_capacity = -1;   // drop/pad only: 0 < C <= N
  int64_t expert_num = -1;        // -1: max id + 1 (dropless only); ids must be < expert_num, or == expert_num (finished)
  int drop_pad_mode = 0;          // 0 dropless, 1 drop/pad to [E, C, H]
  int expert_tokens_num_type = 0; // 0 cumsum, 1 count, 2 key_value (counts are always returned)
  int quant_mode = -1;            // -1 none, 0 static int8, 1 dynamic int8 (per-row scale)
  int64_t active_expert_range[2] = {0, 0};  // [start, end); {0, 0} means [0, expert_num)
  int row_idx_type = 0;           // 0 gather (src->dst, token-major), 1 scatter (dst->src)
};
struct InitRoutingV2Result {
  Tensor expanded_x;          // dropless [rows, H]; drop/pad [E, C, H] (zeros in empty slots); i8 when quantised
  Tensor expanded_row_idx;    // [N*K] int32
  Tensor expert_tokens;       // int64: [end-start] cumsum/count, or [expert_num, 2] key_value; drop/pad: counts before capacity [E]
  Tensor expanded_scale;      // [rows] (or [E*C]) fp32 when quant 1 or a per-token scale was given
  int64_t dropped = 0;        // (token, k) pairs lost to capacity (drop/pad) or active_num (dropless): reported, not an error
  int64_t available = 0;      // pairs whose expert lies in the active range
};
InitRoutingV2Result moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& opt = {});

// ---- moe_compute_expert_tokens: sorted [L] int32 (non-decreasing, in [0, E)) -> [E] int32 cumsum.
Tensor moe_compute_expert_tokens(const TensorView& sorted_experts, int64_t num_experts);

// ---- moe_re_routing: rows blocked [src rank][local expert] -> [local expert][src rank] ----------
struct ReRoutingResult {
  Tensor permute_tokens;           // [A, H]
  Tensor permute_per_token_scales; // [A] fp32 (when given)
  Tensor permute_token_idx;        // [A] int32 gather index: out[d] = in[idx[d]]
  Tensor expert_token_num;         // [E_l] int64 counts
};
// tokens [A, H]; expert_token_num_per_rank [R, E_l] int32/int64 with sum A.
ReRoutingResult moe_re_routing(const TensorView& tokens, const TensorView& expert_token_num_per_rank,
                               const TensorView& per_token_scales = {});

// ---- Megatron-style permute / unpermute (npu_moe_token_permute / unpermute) -------------------
struct TokenPermuteResult {
  Tensor permuted_tokens;  // [rows, H]
  Tensor sorted_indices;   // [T*K] int32 src->dst (padded_mode: [E*C] token ids, dst->src)
};
// indices [T, K] or [T] int32 expert ids. num_out_tokens: 0 keeps all, > 0 the first min(v, T*K),
// < 0 keeps T*K + v. padded_mode: indices are [E, C] token ids per expert (Megatron capacity layout).
TokenPermuteResult moe_token_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens = 0,
                                     bool padded_mode = false);
// out[t] = sum_k probs[t,k] * permuted[sorted_indices[t*K+k]] over valid (0 <= d < P, prob != 0).
// padded_mode: sorted_indices [E*C] token ids, probs [E, C], out has restore_rows rows (scatter-add).
Tensor moe_token_unpermute(const TensorView& permuted_tokens, const TensorView& sorted_indices, const TensorView& probs = {},
                           bool padded_mode = false, int64_t restore_rows = -1);

namespace ref {
InitRoutingResult moe_init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num);
InitRoutingV2Result moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& opt = {});
Tensor moe_compute_expert_tokens(const TensorView& sorted_experts, int64_t num_experts);
ReRoutingResult moe_re_routing(const TensorView& tokens, const TensorView& expert_token_num_per_rank, const TensorView& per_token_scales = {});
TokenPermuteResult moe_token_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens = 0, bool padded_mode = false);
Tensor moe_token_unpermute(const TensorView& permuted_tokens, const TensorView& sorted_indices, const TensorView& probs = {},
                           bool padded_mode = false, int64_t restore_rows = -1);
}  // namespace ref

}  // namespace ot::moe
