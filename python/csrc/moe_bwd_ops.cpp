// MoE backward ops (include/ot/moe_bwd.h): used by the autograd Functions of ops_transformer.moe.
// Names: the forward op's name + "_backward" (torch_npu has no public CPU-facing names for most of
// these), arguments in the header's order.
#include "bridge.h"
#include "holders.h"
#include "ops.h"
#include "ot/moe_bwd.h"

namespace ot::py {
namespace {

// Last two dims swapped (no copy): torch's nn.Linear [.., out, in] seen as the library's [.., in, out].
ot::TensorView swap_last(ot::TensorView v) {
  if (v.ndim >= 2) {
    std::swap(v.sizes[v.ndim - 1], v.sizes[v.ndim - 2]);
    std::swap(v.strides[v.ndim - 1], v.strides[v.ndim - 2]);
  }
  return v;
}

bool torch_layout(c10::string_view layout, const char* op) {
  if (layout == "torch") return true;
  if (layout == "EHI") return false;
  throw ot::Error(op, "layout", "\"torch\" (nn.Linear weights: gate/up [E, I, H], down [E, H, I]) or \"EHI\"", std::string(layout));
}

// The layer's weights as the library's EHI views (transposed views of torch-layout tensors).
moe::MoeFfnWeights ffn_weights(const char* op, const Tensor& router, const Tensor& gate, const Tensor& up, const Tensor& down,
                               const OptTensor& sg, const OptTensor& su, const OptTensor& sd, bool tl) {
  auto t = [&](ot::TensorView v) { return tl ? swap_last(v) : v; };
  moe::MoeFfnWeights w;
  w.router = view(router, op, "router");
  w.gate = t(view(gate, op, "gate"));
  w.up = t(view(up, op, "up"));
  w.down = t(view(down, op, "down"));
  w.shared_gate = t(view(sg, op, "shared_gate"));
  w.shared_up = t(view(su, op, "shared_up"));
  w.shared_down = t(view(sd, op, "shared_down"));
  return w;
}

Tensor wrap_t(const ot::Tensor& t, bool tl) {
  Tensor r = wrap(t);
  return tl && r.defined() && r.dim() >= 2 ? r.transpose(-1, -2) : r;
}
OptTensor wrap_opt_t(const ot::Tensor& t, bool tl) {
  if (!t.defined()) return c10::nullopt;
  return wrap_t(t, tl);
}

}  // namespace

// ---- grouped matmul and its activation epilogue ----------------------------------------------------

std::tuple<OptTensor, OptTensor, OptTensor> grouped_matmul_backward(
    const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& group_list, int64_t group_list_type,
    int64_t act_type, const OptTensor& bias, const OptTensor& pre_act, bool need_dx, bool need_dweight, bool need_dbias) {
  const char* op = "grouped_matmul_backward";
  moe::GroupedMatmulBackwardOptions o;
  o.group_list_type = int(group_list_type);
  o.act = act_of(act_type, op);
  OptTensor b32;
  if (bias && bias->defined()) b32 = bias->to(c10::ScalarType::Float);
  o.bias = view(b32, op, "bias");
  o.pre_act = view(pre_act, op, "pre_act");
  o.need_dx = need_dx;
  o.need_dweight = need_dweight;
  o.need_dbias = need_dbias;
  auto r = moe::grouped_matmul_backward(view(grad_y, op, "grad_y"), view(x, op, "x"), view(weight, op, "weight"),
                                        view(group_list, op, "group_list"), o);
  return {wrap_opt(r.dx), wrap_opt(r.dweight), wrap_opt(r.dbias)};
}

Tensor moe_act_backward(int64_t act_type, const Tensor& z, const Tensor& dy) {
  const char* op = "moe_act_backward";
  auto a = act_of(act_type, op);
  auto vz = view(z, op, "z");
  Tensor dz = empty(std::vector<int64_t>(z.sizes().begin(), z.sizes().end()), z.scalar_type());
  moe::act_backward(a, vz, view(dy, op, "dy"), view(dz, op, "z"));
  return dz;
}

// ---- routing ---------------------------------------------------------------------------------------

Tensor moe_token_permute_backward(const Tensor& d_permuted, const Tensor& sorted_indices, int64_t topk) {
  const char* op = "moe_token_permute_backward";
  return wrap(moe::moe_token_permute_backward(view(d_permuted, op, "d_permuted"), view(sorted_indices, op, "sorted_indices"), topk));
}

std::tuple<Tensor, OptTensor> moe_token_unpermute_backward(const Tensor& d_out, const Tensor& permuted_tokens,
                                                           const Tensor& sorted_indices, const OptTensor& probs) {
  const char* op = "moe_token_unpermute_backward";
  auto r = moe::moe_token_unpermute_backward(view(d_out, op, "d_out"), view(permuted_tokens, op, "permuted_tokens"),
                                             view(sorted_indices, op, "sorted_indices"), view(probs, op, "probs"));
  return {wrap(r.d_permuted), wrap_opt(r.d_probs)};
}

Tensor moe_init_routing_v2_backward(const Tensor& d_expanded_x, const Tensor& expanded_row_idx, int64_t num_tokens, int64_t topk,
                                    int64_t row_idx_type) {
  const char* op = "moe_init_routing_v2_backward";
  return wrap(moe::moe_init_routing_v2_backward(view(d_expanded_x, op, "d_expanded_x"), view(expanded_row_idx, op, "expanded_row_idx"),
                                                num_tokens, topk, int(row_idx_type)));
}

Tensor moe_init_routing_backward(const Tensor& d_expanded_x, const Tensor& expanded_row_idx, int64_t num_tokens, int64_t topk) {
  const char* op = "moe_init_routing_backward";
  return wrap(moe::moe_init_routing_backward(view(d_expanded_x, op, "d_expanded_x"), view(expanded_row_idx, op, "expanded_row_idx"),
                                             num_tokens, topk));
}

std::tuple<Tensor, OptTensor, OptTensor> moe_finalize_routing_v2_backward(const Tensor& d_out, const Tensor& expanded_x,
                                                                          const Tensor& expanded_row_idx, const OptTensor& scales,
                                                                          const OptTensor& bias, const OptTensor& expert_idx,
                                                                          int64_t drop_pad_mode) {
  const char* op = "moe_finalize_routing_v2_backward";
  auto r = moe::moe_finalize_routing_v2_backward(view(d_out, op, "d_out"), view(expanded_x, op, "expanded_x"),
                                                 view(expanded_row_idx, op, "expanded_row_idx"), view(scales, op, "scales"),
                                                 view(bias, op, "bias"), view(expert_idx, op, "expert_idx"), int(drop_pad_mode));
  return {wrap(r.d_expanded_x), wrap_opt(r.d_scales), wrap_opt(r.d_bias)};
}

// ---- routers and losses ------------------------------------------------------------------------------

Tensor moe_gating_top_k_softmax_backward(const Tensor& dy, const Tensor& x, const Tensor& expert_idx, const OptTensor& allowed) {
  const char* op = "moe_gating_top_k_softmax_backward";
  return wrap(moe::moe_gating_top_k_softmax_backward(view(dy, op, "dy"), view(x, op, "x"), view(expert_idx, op, "expert_idx"),
                                                     view(allowed, op, "allowed")));
}

Tensor moe_gating_top_k_softmax_v2_backward(const Tensor& dy, const Tensor& x, const Tensor& expert_idx, int64_t renorm,
                                            const OptTensor& allowed) {
  const char* op = "moe_gating_top_k_softmax_v2_backward";
  return wrap(moe::moe_gating_top_k_softmax_v2_backward(view(dy, op, "dy"), view(x, op, "x"), view(expert_idx, op, "expert_idx"),
                                                        int(renorm), view(allowed, op, "allowed")));
}

Tensor moe_gating_top_k_backward(const Tensor& dy, const Tensor& scores, const Tensor& expert_idx, int64_t renorm, int64_t norm_type,
                                 double routed_scaling_factor, double eps) {
  const char* op = "moe_gating_top_k_backward";
  return wrap(moe::moe_gating_top_k_backward(view(dy, op, "dy"), view(scores, op, "scores"), view(expert_idx, op, "expert_idx"),
                                             int(renorm), int(norm_type), float(routed_scaling_factor), float(eps)));
}

Tensor topk_renorm_backward(const Tensor& dw, const Tensor& y) {
  const char* op = "topk_renorm_backward";
  return wrap(moe::topk_renorm_backward(view(dw, op, "dw"), view(y, op, "y")));
}

Tensor moe_aux_loss_backward(const Tensor& probs, const Tensor& tokens_per_expert, int64_t k, double coeff, double d_loss) {
  const char* op = "moe_aux_loss_backward";
  return wrap(moe::moe_aux_loss_backward(view(probs, op, "probs"), view(tokens_per_expert, op, "tokens_per_expert"), k, float(coeff),
                                         float(d_loss)));
}

Tensor moe_z_loss_backward(const Tensor& logits, double coeff, const OptTensor& mask, double d_loss) {
  const char* op = "moe_z_loss_backward";
  return wrap(moe::moe_z_loss_backward(view(logits, op, "logits"), float(coeff), view(mask, op, "mask"), float(d_loss)));
}

// ---- the whole layer ---------------------------------------------------------------------------------

MoeFfnTrainOut moe_ffn_forward_train(const Tensor& x, const Tensor& router, const Tensor& gate, const Tensor& up, const Tensor& down,
                                     int64_t k, c10::string_view router_type, int64_t renorm, bool norm_topk_prob,
                                     const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                                     int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed,
                                     int64_t expert_capacity, double capacity_factor, const OptTensor& shared_gate,
                                     const OptTensor& shared_up, const OptTensor& shared_down, const OptTensor& residual,
                                     c10::string_view layout) {
  const char* op = "moe_ffn_forward_train";
  auto h = c10::make_intrusive<MoeFfnSavedHolder>();
  // The options point into these tensors: the holder keeps them for the backward.
  if (bias) h->bias = *bias;
  if (allowed) h->allowed = *allowed;
  if (residual) h->residual = *residual;
  h->opt = ffn_options(op, k, router_type, renorm, norm_topk_prob, h->bias, k_group, group_count, group_select_mode, norm_type,
                       routed_scaling_factor, eps, h->allowed, expert_capacity, capacity_factor, h->residual);
  auto w = ffn_weights(op, router, gate, up, down, shared_gate, shared_up, shared_down, torch_layout(layout, op));
  auto r = moe::moe_ffn_forward_train(view(x, op, "x"), w, h->opt);
  h->saved = std::move(r.saved);
  const auto& s = h->saved;
  return {wrap(r.y),          wrap(s.router_logits), wrap(s.topk_ids), wrap(s.topk_weights),
          wrap(s.expert_counts), s.dropped,          h};
}

MoeFfnBwdOut moe_ffn_backward(const Tensor& dy, const Tensor& x, const Tensor& router, const Tensor& gate, const Tensor& up,
                              const Tensor& down, const c10::intrusive_ptr<MoeFfnSavedHolder>& saved, const OptTensor& shared_gate,
                              const OptTensor& shared_up, const OptTensor& shared_down, double aux_loss_coeff, double z_loss_coeff,
                              c10::string_view layout, c10::optional<c10::ScalarType> weight_grad_dtype) {
  const char* op = "moe_ffn_backward";
  OT_CHECK(saved.defined(), op, "saved", "the MoeFfnSaved returned by moe_ffn_forward_train", "None");
  const bool tl = torch_layout(layout, op);
  auto w = ffn_weights(op, router, gate, up, down, shared_gate, shared_up, shared_down, tl);
  moe::MoeFfnBackwardOptions bo;
  bo.aux_loss_coeff = float(aux_loss_coeff);
  bo.z_loss_coeff = float(z_loss_coeff);
  // None: fp32 (master accumulators); bfloat16: half the written bytes (the library checks the choice)
  if (weight_grad_dtype) bo.weight_grad_dtype = to_ot(*weight_grad_dtype, op, "weight_grad_dtype");
  // Autograd hands over gradients that may be expanded or strided: the kernel reads dy row-major.
  Tensor dyc = dy.contiguous();
  auto g = moe::moe_ffn_backward(view(dyc, op, "dy"), view(x, op, "x"), w, saved->saved, saved->opt, bo);
  return {wrap(g.dx),
          wrap(g.d_router),
          wrap_t(g.d_gate, tl),
          wrap_t(g.d_up, tl),
          wrap_t(g.d_down, tl),
          wrap_opt_t(g.d_shared_gate, tl),
          wrap_opt_t(g.d_shared_up, tl),
          wrap_opt_t(g.d_shared_down, tl),
          double(g.aux_loss),
          double(g.z_loss)};
}

}  // namespace ot::py
