// The public references of the MoE backward operators (ot::moe::ref, ot/moe_bwd.h): the same
// validation as the fast entry points, then the plain reference of src/ref/moe_bwd_ref.h.
#include "ot/moe_bwd.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"
#include "src/ref/moe_bwd_ref.h"

namespace ot::moe::ref {

void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  bwd::check_act_backward("act_backward", act, z, dy, dz);
  refimpl::act_backward(act, z, dy, dz);
}

GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& group_list,
                                           const GroupedMatmulBackwardOptions& opt) {
  bwd::plan_grouped_matmul_backward("grouped_matmul_backward", dy, x, w, group_list, opt);
  return refimpl::grouped_matmul_backward(dy, x, w, group_list, opt);
}

Tensor moe_token_permute_backward(const TensorView& dp, const TensorView& si, int64_t topk) {
  bwd::plan_permute_backward("moe_token_permute_backward", dp, si, topk);
  return refimpl::moe_token_permute_backward(dp, si, topk);
}

TokenUnpermuteGrads moe_token_unpermute_backward(const TensorView& dout, const TensorView& permuted, const TensorView& si,
                                                 const TensorView& probs) {
  bwd::plan_unpermute_backward("moe_token_unpermute_backward", dout, permuted, si, probs);
  return refimpl::moe_token_unpermute_backward(dout, permuted, si, probs);
}

Tensor moe_init_routing_v2_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K, int type) {
  bwd::plan_init_routing_backward("moe_init_routing_v2_backward", dex, idx, N, K, type);
  return refimpl::moe_init_routing_v2_backward(dex, idx, N, K, type);
}

Tensor moe_init_routing_backward(const TensorView& dex, const TensorView& idx, int64_t N, int64_t K) {
  bwd::plan_init_routing_backward("moe_init_routing_backward", dex, idx, N, K, 0);
  return refimpl::moe_init_routing_backward(dex, idx, N, K);
}

FinalizeRoutingGrads moe_finalize_routing_v2_backward(const TensorView& dout, const TensorView& ex, const TensorView& idx, const TensorView& scales,
                                                      const TensorView& bias, const TensorView& expert_idx, int mode) {
  bwd::plan_finalize_backward("moe_finalize_routing_v2_backward", dout, ex, idx, scales, bias, expert_idx, mode);
  return refimpl::moe_finalize_routing_v2_backward(dout, ex, idx, scales, bias, expert_idx, mode);
}

Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, const TensorView& allowed) {
  return moe_gating_top_k_softmax_v2_backward(dy, x, ids, 0, allowed);
}

Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, int renorm, const TensorView& allowed) {
  bwd::plan_router_backward("moe_gating_top_k_softmax_backward", dy, x, "x", ids, allowed);
  return refimpl::moe_gating_top_k_softmax_v2_backward(dy, x, ids, renorm, allowed);
}

Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& sc, const TensorView& ids, int renorm, int norm_type, float rsf,
                                 float eps) {
  bwd::plan_router_backward("moe_gating_top_k_backward", dy, sc, "scores", ids, {});
  return refimpl::moe_gating_top_k_backward(dy, sc, ids, renorm, norm_type, rsf, eps);
}

Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y) { return refimpl::topk_renorm_backward(dw, y); }

Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tpe, int64_t k, float coeff, float d_loss) {
  bwd::check_loss_input("moe_aux_loss_backward", "probs", probs);
  bwd::read_counts("moe_aux_loss_backward", tpe, probs.size(1));
  return refimpl::moe_aux_loss_backward(probs, tpe, k, coeff, d_loss);
}

Tensor moe_z_loss_backward(const TensorView& logits, float coeff, const TensorView& mask, float d_loss) {
  bwd::check_loss_input("moe_z_loss_backward", "logits", logits);
  bwd::check_mask("moe_z_loss_backward", mask, logits.size(0));
  return refimpl::moe_z_loss_backward(logits, coeff, mask, d_loss);
}

MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o,
                             const MoeFfnBackwardOptions& bo) {
  const char* op = "moe_ffn_backward";
  bwd::FfnDims d;
  bwd::check_ffn(op, x, w, o, d);
  bwd::check_shape(op, "dy", dy, {d.T, d.H});
  return refimpl::moe_ffn_backward(dy, x, w, o, bo);
}

}  // namespace ot::moe::ref
