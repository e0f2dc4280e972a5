// Grouped matmul, finalize routing and the per-token expert matmul (spec sections 6, 7, 10).
#pragma once
#include <cstdint>
#include <vector>

#include "ot/gemm.h"
#include "ot/gemm_quant.h"
#include "ot/quant_weights.h"
#include "ot/tensor.h"

namespace ot::moe {

// group_list forms (GMM group_list_type): 0 cumsum, 1 count, 2 key-value [G', 2] (group, count).
enum class GroupListType : int { cumsum = 0, count = 1, key_value = 2 };

// One contiguous row block per weight: rows [offset, offset + count) use weight `group`.
struct GroupSpan { int64_t group, offset, count; };
// Validates group_list (int32 or int64; monotone cumsum, non-negative counts, key ids in
// [0, num_groups), total == rows) and returns the spans (empty groups skipped).
std::vector<GroupSpan> parse_group_list(const char* op, const TensorView& group_list, GroupListType type, int64_t num_groups,
                                        int64_t rows);

// npu_grouped_matmul, M-split (group_type 0): y[rows of g] = act(x[rows of g] @ weight[g] + bias[g]).
// x [M, K] bf16/fp16/fp32; weight [G, K, N] same dtype (a transposed view of torch's [G, N, K] is
// accepted through its strides); bias [G, N] float (optional); Act::swiglu halves N ([gate | up]).
// y [M, N'] has x's dtype; group_list must cover all M rows.
Tensor grouped_matmul(const TensorView& x, const TensorView& weight, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none);
// Same on weights packed once (all with equal K and N).
Tensor grouped_matmul(const TensorView& x, const std::vector<const gemm::PackedB*>& weights, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none);

// Weight-only quantised experts (torch_npu's antiquant_scale, antiquant_offset and
// antiquant_group_size, ot/quant_weights.h): y = act(x @ ((q + offset) * scale) + bias) per group,
// x bf16/fp16/fp32, y in x's dtype, fp32 accumulation; the codes are dequantised in registers.
// The view form packs the weights per call; the packed form takes them packed once.
// activations int8_per_token (W8A8, int8 weights; ot/gemm_quant.h): x's rows are quantised per
// token to int8 inside the call (the packed form: when packed for it; gemm::QuantGroup also takes
// rows already quantised, with their scales).
Tensor grouped_matmul(const TensorView& x, const QuantWeightView& weight, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none,
                      gemm::ActivationQuant activations = gemm::ActivationQuant::none);
Tensor grouped_matmul(const TensorView& x, const gemm::PackedQuantB& weight, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none);

// npu_moe_finalize_routing (v2): out[n] = x1[n] + x2[n] + sum_k scales[n,k] * (R[d] + bias[expert_idx[n,k]])
// with d = expanded_row_idx at k*N+n (modes 0, 1: column layout) or n*K+k (modes 2, 3: row layout);
// in drop/pad modes (1, 3) d = -1 reads a zero row (the bias is still added, as upstream).
// expanded_x [N*K, H] (modes 0, 2) or [E, C, H] (1, 3); out [N, H] in expanded_x's dtype.
Tensor moe_finalize_routing_v2(const TensorView& expanded_x, const TensorView& expanded_row_idx, const TensorView& x1 = {},
                               const TensorView& x2 = {}, const TensorView& bias = {}, const TensorView& scales = {},
                               const TensorView& expert_idx = {}, int drop_pad_mode = 0);
// v1: skip1, bias, scales and expert_idx required, skip2 optional, column layout (mode 0).
Tensor moe_finalize_routing(const TensorView& expanded_x, const TensorView& skip1, const TensorView& skip2, const TensorView& bias,
                            const TensorView& scales, const TensorView& expanded_src_to_dst_row, const TensorView& expert_for_source_row);

// moe_final_optimizer_mm (spec section 10, the project's definition): y[t] = x[t] @ W[idx[t]].
// x [T, H]; expert_weight [E, H, I] (same dtype); token_expert_idx [T] int32 in [0, E). y [T, I].
Tensor moe_final_optimizer_mm(const TensorView& x, const TensorView& expert_weight, const TensorView& token_expert_idx);

namespace ref {
Tensor grouped_matmul(const TensorView& x, const TensorView& weight, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none);
// dequantize_weights (and for int8_per_token the activations' quantise-dequantise), then the plain
// grouped matmul; y in x's dtype.
Tensor grouped_matmul(const TensorView& x, const QuantWeightView& weight, const TensorView& group_list,
                      GroupListType type = GroupListType::cumsum, const TensorView& bias = {}, gemm::Act act = gemm::Act::none,
                      gemm::ActivationQuant activations = gemm::ActivationQuant::none);
Tensor moe_finalize_routing_v2(const TensorView& expanded_x, const TensorView& expanded_row_idx, const TensorView& x1 = {},
                               const TensorView& x2 = {}, const TensorView& bias = {}, const TensorView& scales = {},
                               const TensorView& expert_idx = {}, int drop_pad_mode = 0);
Tensor moe_final_optimizer_mm(const TensorView& x, const TensorView& expert_weight, const TensorView& token_expert_idx);
}  // namespace ref

}  // namespace ot::moe
