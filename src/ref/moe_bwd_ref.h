// Plain references of the MoE backward operators (ot/moe_bwd.h), in fp64: the OT_FORCE_REF path
// and the tests' ground truth. The caller validates the arguments (the public ot::moe::ref entry
// points do, src/moe/bwd_ref_entries.cpp).
#pragma once
#include <cstdint>

#include "ot/moe_bwd.h"

namespace ot::moe::refimpl {

MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& opt,
                             const MoeFfnBackwardOptions& bopt);
Tensor moe_token_permute_backward(const TensorView& d_permuted, const TensorView& sorted_indices, int64_t topk);
TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& d_out, const TensorView& permuted_tokens, const TensorView& sorted_indices,
                                                 const TensorView& probs);
Tensor moe_init_routing_v2_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens, int64_t topk,
                                    int row_idx_type);
Tensor moe_init_routing_backward(const TensorView& d_expanded_x, const TensorView& expanded_row_idx, int64_t num_tokens, int64_t topk);
FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& d_out, const TensorView& expanded_x, const TensorView& expanded_row_idx,
                                                      const TensorView& scales, const TensorView& bias, const TensorView& expert_idx,
                                                      int drop_pad_mode);
Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx, const TensorView& allowed);
Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& expert_idx, int renorm,
                                            const TensorView& allowed);
Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& scores, const TensorView& expert_idx, int renorm, int norm_type,
                                 float routed_scaling_factor, float eps);
Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y);
Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff, float d_loss);
Tensor moe_z_loss_backward(const TensorView& logits, float coeff, const TensorView& mask, float d_loss);
void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);
GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& weight, const TensorView& group_list,
                                           const GroupedMatmulBackwardOptions& opt);

}  // namespace ot::moe::refimpl
