// Declarations of every torch-facing operator function (defined per family in <family>_ops.cpp,
// registered with their schemas in register.cpp). Signatures use the types the schemas map to.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/intrusive_ptr.h>
#include <c10/util/string_view.h>

#include <tuple>
#include <vector>

#include "ot/gemm.h"

namespace ot::moe {
struct MoeFfnOptions;
}

namespace ot::py {

using Tensor = at::Tensor;
using OptTensor = c10::optional<at::Tensor>;

// gemm_ops.cpp
gemm::Act act_of(int64_t act_type, const char* op);
Tensor matmul(const Tensor& a, const Tensor& b, double alpha, c10::optional<c10::ScalarType> out_dtype);
// c[i] = a[i] @ b[i] (a [B, M, K], b [B, K, N], strided; c in a's dtype): the products split over
// the batch, one thread each.
Tensor bmm(const Tensor& a, const Tensor& b);
void set_max_isa(int64_t isa);
void set_force_ref(bool on);
std::tuple<int64_t, bool> isa_state();

#ifdef OT_HAVE_MOE
// moe_ops.cpp (torch_npu names without the npu_ prefix)
struct PackedWeightHolder;
// y = x @ W^T on a weight packed once (x [M, K] in the weight's dtype family; y in x's dtype).
Tensor linear_packed(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& w);
struct MoeExpertsHolder;
std::tuple<Tensor, Tensor, Tensor> moe_gating_top_k_softmax(const Tensor& x, const OptTensor& finished, int64_t k,
                                                            const OptTensor& allowed);
std::tuple<Tensor, Tensor, OptTensor> moe_gating_top_k_softmax_v2(const Tensor& x, int64_t k, const OptTensor& finished,
                                                                  int64_t renorm, bool output_softmax, const OptTensor& allowed);
std::tuple<Tensor, Tensor, OptTensor> moe_gating_top_k(const Tensor& x, int64_t k, const OptTensor& bias, int64_t k_group,
                                                       int64_t group_count, int64_t group_select_mode, int64_t renorm,
                                                       int64_t norm_type, bool out_flag, double routed_scaling_factor,
                                                       double eps, const OptTensor& allowed);
std::tuple<Tensor, Tensor, Tensor> moe_init_routing(const Tensor& x, const Tensor& row_idx, const Tensor& expert_idx,
                                                    int64_t active_num);
std::tuple<Tensor, Tensor, Tensor, OptTensor> moe_init_routing_v2(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale, const OptTensor& offset, int64_t active_num,
    int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t expert_tokens_num_type,
    bool expert_tokens_num_flag, int64_t quant_mode, c10::IntArrayRef active_expert_range, int64_t row_idx_type,
    c10::optional<c10::ScalarType> x_dtype);
Tensor moe_compute_expert_tokens(const Tensor& sorted_expert_for_source_row, int64_t num_expert);
std::tuple<Tensor, OptTensor, Tensor, Tensor> moe_re_routing(const Tensor& tokens, const Tensor& expert_token_num_per_rank,
                                                             const OptTensor& per_token_scales, int64_t expert_token_num_type,
                                                             int64_t idx_type);
std::tuple<Tensor, Tensor> moe_token_permute(const Tensor& tokens, const Tensor& indices, c10::optional<int64_t> num_out_tokens,
                                             bool padded_mode);
Tensor moe_token_unpermute(const Tensor& permuted_tokens, const Tensor& sorted_indices, const OptTensor& probs, bool padded_mode,
                           c10::OptionalIntArrayRef restore_shape);
std::vector<Tensor> grouped_matmul(const std::vector<Tensor>& x, const std::vector<Tensor>& weight,
                                   const c10::optional<std::vector<Tensor>>& bias, const OptTensor& group_list, int64_t split_item,
                                   c10::optional<int64_t> group_type, int64_t group_list_type, int64_t act_type,
                                   c10::optional<c10::ScalarType> output_dtype, const c10::optional<std::vector<Tensor>>& antiquant_scale,
                                   const c10::optional<std::vector<Tensor>>& antiquant_offset, int64_t antiquant_group_size,
                                   c10::string_view activation_quant);
// Weight-only quantisation (ot/quant_weights.h): int8 codes (int8 tensor) or int4 codes two a byte (uint8).
std::tuple<Tensor, Tensor, OptTensor> quantize_weights(const Tensor& w, c10::string_view format, int64_t group_size, bool symmetric);
Tensor dequantize_weights(const Tensor& weight, const Tensor& antiquant_scale, const OptTensor& antiquant_offset, int64_t antiquant_group_size);
Tensor moe_finalize_routing(const Tensor& expanded_permuted_rows, const OptTensor& skip1, const OptTensor& skip2,
                            const OptTensor& bias, const OptTensor& scales, const Tensor& expanded_src_to_dst_row,
                            const OptTensor& export_for_source_row, c10::optional<int64_t> drop_pad_mode);
Tensor moe_finalize_routing_v2(const Tensor& expanded_x, const Tensor& expanded_row_idx, const OptTensor& x1, const OptTensor& x2,
                               const OptTensor& bias, const OptTensor& scales, const OptTensor& expert_idx, int64_t drop_pad_mode);
Tensor moe_final_optimizer_mm(const Tensor& x, const Tensor& expert_weight, const Tensor& token_expert_idx);
double moe_aux_loss(const Tensor& probs, const Tensor& tokens_per_expert, int64_t k, double coeff);
double moe_z_loss(const Tensor& logits, double coeff, const OptTensor& mask);
int64_t moe_capacity(int64_t tokens, int64_t k, int64_t experts, double capacity_factor, int64_t min_capacity);
// moe_ffn's options from the schema's arguments (shared by moe_ffn and moe_ffn_forward_train).
moe::MoeFfnOptions ffn_options(const char* op, int64_t k, c10::string_view router_type, int64_t renorm, bool norm_topk_prob,
                               const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                               int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed,
                               int64_t expert_capacity, double capacity_factor, const OptTensor& residual);
using MoeFfnOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, int64_t>;
MoeFfnOut moe_ffn(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& router,
                  const c10::intrusive_ptr<MoeExpertsHolder>& experts, int64_t k, c10::string_view router_type, int64_t renorm,
                  bool norm_topk_prob, const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                  int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed, int64_t expert_capacity,
                  double capacity_factor, const c10::optional<c10::intrusive_ptr<MoeExpertsHolder>>& shared,
                  const OptTensor& residual);
#endif

#ifdef OT_HAVE_MOE_BWD
// moe_bwd_ops.cpp
struct MoeFfnSavedHolder;
std::tuple<OptTensor, OptTensor, OptTensor> grouped_matmul_backward(
    const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& group_list, int64_t group_list_type,
    int64_t act_type, const OptTensor& bias, const OptTensor& pre_act, bool need_dx, bool need_dweight, bool need_dbias);
Tensor moe_act_backward(int64_t act_type, const Tensor& z, const Tensor& dy);
Tensor moe_token_permute_backward(const Tensor& d_permuted, const Tensor& sorted_indices, int64_t topk);
std::tuple<Tensor, OptTensor> moe_token_unpermute_backward(const Tensor& d_out, const Tensor& permuted_tokens,
                                                           const Tensor& sorted_indices, const OptTensor& probs);
Tensor moe_init_routing_v2_backward(const Tensor& d_expanded_x, const Tensor& expanded_row_idx, int64_t num_tokens, int64_t topk,
                                    int64_t row_idx_type);
Tensor moe_init_routing_backward(const Tensor& d_expanded_x, const Tensor& expanded_row_idx, int64_t num_tokens, int64_t topk);
std::tuple<Tensor, OptTensor, OptTensor> moe_finalize_routing_v2_backward(const Tensor& d_out, const Tensor& expanded_x,
                                                                          const Tensor& expanded_row_idx, const OptTensor& scales,
                                                                          const OptTensor& bias, const OptTensor& expert_idx,
                                                                          int64_t drop_pad_mode);
Tensor moe_gating_top_k_softmax_backward(const Tensor& dy, const Tensor& x, const Tensor& expert_idx, const OptTensor& allowed);
Tensor moe_gating_top_k_softmax_v2_backward(const Tensor& dy, const Tensor& x, const Tensor& expert_idx, int64_t renorm,
                                            const OptTensor& allowed);
Tensor moe_gating_top_k_backward(const Tensor& dy, const Tensor& scores, const Tensor& expert_idx, int64_t renorm, int64_t norm_type,
                                 double routed_scaling_factor, double eps);
Tensor topk_renorm_backward(const Tensor& dw, const Tensor& y);
Tensor moe_aux_loss_backward(const Tensor& probs, const Tensor& tokens_per_expert, int64_t k, double coeff, double d_loss);
Tensor moe_z_loss_backward(const Tensor& logits, double coeff, const OptTensor& mask, double d_loss);
using MoeFfnTrainOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, c10::intrusive_ptr<MoeFfnSavedHolder>>;
MoeFfnTrainOut moe_ffn_forward_train(const Tensor& x, const Tensor& router, const Tensor& gate, const Tensor& up, const Tensor& down,
                                     int64_t k, c10::string_view router_type, int64_t renorm, bool norm_topk_prob,
                                     const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                                     int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed,
                                     int64_t expert_capacity, double capacity_factor, const OptTensor& shared_gate,
                                     const OptTensor& shared_up, const OptTensor& shared_down, const OptTensor& residual,
                                     c10::string_view layout);
using MoeFfnBwdOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, OptTensor, OptTensor, OptTensor, double, double>;
MoeFfnBwdOut moe_ffn_backward(const Tensor& dy, const Tensor& x, const Tensor& router, const Tensor& gate, const Tensor& up,
                              const Tensor& down, const c10::intrusive_ptr<MoeFfnSavedHolder>& saved, const OptTensor& shared_gate,
                              const OptTensor& shared_up, const OptTensor& shared_down, double aux_loss_coeff, double z_loss_coeff,
                              c10::string_view layout, c10::optional<c10::ScalarType> weight_grad_dtype);
#endif

#ifdef OT_HAVE_EP
// ep_ops.cpp (torch_npu npu_moe_distribute_*_v2 argument lists)
struct EpCommHolder;
std::tuple<int64_t, int64_t> ep_init();
void ep_finalize();
using EpDispatchOut = std::tuple<Tensor, OptTensor, Tensor, Tensor, Tensor, Tensor, OptTensor>;
EpDispatchOut moe_distribute_dispatch(const Tensor& x, const Tensor& expert_ids, const c10::intrusive_ptr<EpCommHolder>& group_ep,
                                      int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& scales,
                                      const OptTensor& x_active_mask, const OptTensor& expert_scales, int64_t shared_expert_num,
                                      int64_t shared_expert_rank_num, int64_t quant_mode, int64_t expert_token_nums_type,
                                      c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                                      int64_t const_expert_num, bool dedup_combine, int64_t comm_quant_mode);
Tensor moe_distribute_combine(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& assist_info_for_combine,
                              const Tensor& ep_send_counts, const Tensor& expert_scales,
                              const c10::intrusive_ptr<EpCommHolder>& group_ep, int64_t ep_world_size, int64_t ep_rank_id,
                              int64_t moe_expert_num, const OptTensor& shared_expert_x, const OptTensor& ori_x,
                              const OptTensor& const_expert_alpha_1, const OptTensor& const_expert_alpha_2,
                              const OptTensor& const_expert_v, int64_t shared_expert_num, int64_t shared_expert_rank_num,
                              int64_t comm_quant_mode, int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num);
Tensor ep_moe_ffn(const Tensor& x, const Tensor& expert_ids, const OptTensor& expert_scales,
                  const c10::intrusive_ptr<EpCommHolder>& group_ep, const c10::intrusive_ptr<MoeExpertsHolder>& experts,
                  int64_t moe_expert_num, c10::string_view comm_alg, int64_t chunks, int64_t quant_mode,
                  const OptTensor& shared_expert_x, const OptTensor& x_active_mask, const OptTensor& scales,
                  int64_t shared_expert_num, int64_t shared_expert_rank_num, bool dedup_combine, int64_t comm_quant_mode,
                  int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num, const OptTensor& const_expert_alpha_1,
                  const OptTensor& const_expert_alpha_2, const OptTensor& const_expert_v);
#endif

// gdn_ops.cpp (fla names and argument order)
using GdnChunkFwd = std::tuple<Tensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor>;
GdnChunkFwd chunk_gated_delta_rule_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                       c10::optional<double> scale, const OptTensor& initial_state, bool output_final_state,
                                       const OptTensor& cu_seqlens, bool use_qk_l2norm_in_kernel, c10::string_view layout,
                                       bool save_for_backward, c10::optional<c10::ScalarType> final_state_dtype, bool save_states);
std::tuple<Tensor, OptTensor> chunk_gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                                     const Tensor& beta, c10::optional<double> scale, const OptTensor& initial_state,
                                                     bool output_final_state, const OptTensor& cu_seqlens,
                                                     bool use_qk_l2norm_in_kernel, c10::string_view layout,
                                                     c10::optional<c10::ScalarType> final_state_dtype);
std::tuple<Tensor, OptTensor> fused_recurrent_gated_delta_rule(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& g, const OptTensor& beta, c10::optional<double> scale,
    const OptTensor& initial_state, bool output_final_state, const OptTensor& cu_seqlens, bool use_qk_l2norm_in_kernel,
    const OptTensor& A_log, const OptTensor& dt_bias, bool beta_sigmoid, c10::string_view layout,
    c10::optional<c10::ScalarType> final_state_dtype);
Tensor recurrent_gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& g, const OptTensor& beta,
                                  const Tensor& state_cache, const Tensor& state_indices, c10::optional<double> scale,
                                  const OptTensor& cu_seqlens, const OptTensor& num_accepted_tokens, bool use_qk_l2norm_in_kernel,
                                  const OptTensor& A_log, const OptTensor& dt_bias, bool beta_sigmoid, c10::string_view layout);
Tensor chunk_local_cumsum(const Tensor& g, int64_t chunk_size, bool reverse, c10::optional<double> scale,
                          const OptTensor& cu_seqlens, bool head_first);
std::tuple<Tensor, Tensor> l2norm_fwd(const Tensor& x, double eps);
Tensor l2norm_bwd(const Tensor& y, const Tensor& rstd, const Tensor& dy);
Tensor chunk_scaled_dot_kkt_fwd(const Tensor& k, const Tensor& g_cumsum, const Tensor& beta, const OptTensor& cu_seqlens,
                                c10::string_view layout);
Tensor solve_tril(const Tensor& A, const OptTensor& cu_seqlens, c10::string_view layout);
std::tuple<Tensor, Tensor> recompute_w_u_fwd(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A,
                                             const Tensor& g_cumsum, const OptTensor& cu_seqlens, c10::string_view layout);
std::tuple<Tensor, Tensor, OptTensor> chunk_gated_delta_rule_fwd_h(const Tensor& k, const Tensor& w, const Tensor& u,
                                                                   const Tensor& g, const OptTensor& initial_state,
                                                                   bool output_final_state, const OptTensor& cu_seqlens,
                                                                   c10::string_view layout);
Tensor chunk_fwd_o(const Tensor& q, const Tensor& k, const Tensor& v_new, const Tensor& h, const Tensor& g,
                   c10::optional<double> scale, const OptTensor& cu_seqlens, c10::string_view layout);

// gdn_bwd_ops.cpp
using GdnChunkBwd = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, OptTensor>;
GdnChunkBwd chunk_gated_delta_rule_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g_cumsum,
                                       const Tensor& beta, const Tensor& dO, c10::optional<double> scale,
                                       const OptTensor& initial_state, const OptTensor& dht, bool use_qk_l2norm_in_kernel,
                                       const OptTensor& A, const OptTensor& cu_seqlens, c10::string_view layout, const OptTensor& h, const OptTensor& v_new,
                                       bool bf16_compute);
Tensor chunk_bwd_dv_local(const Tensor& q, const Tensor& k, const Tensor& g_cumsum, const Tensor& dO, c10::optional<double> scale,
                          const OptTensor& cu_seqlens, c10::string_view layout);
std::tuple<Tensor, OptTensor, Tensor> chunk_gated_delta_rule_bwd_dhu(const Tensor& q, const Tensor& k, const Tensor& w,
                                                                     const Tensor& g_cumsum, const OptTensor& dht, const Tensor& dO,
                                                                     const Tensor& dv_local, bool want_dh0,
                                                                     c10::optional<double> scale, const OptTensor& cu_seqlens,
                                                                     c10::string_view layout);
std::tuple<Tensor, Tensor, Tensor, Tensor> chunk_bwd_dqkwg(const Tensor& q, const Tensor& k, const Tensor& v_new, const Tensor& h,
                                                           const Tensor& g_cumsum, const Tensor& dv2, const Tensor& dO,
                                                           const Tensor& dh, c10::optional<double> scale,
                                                           const OptTensor& cu_seqlens, c10::string_view layout);
Tensor prepare_wy_repr_bwd_da(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A, const Tensor& dw,
                              const Tensor& du, const Tensor& g_cumsum, const OptTensor& cu_seqlens, c10::string_view layout);
std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_wy_repr_bwd_full(const Tensor& k, const Tensor& v, const Tensor& beta,
                                                                    const Tensor& A, const Tensor& dP, const Tensor& dw,
                                                                    const Tensor& du, const Tensor& g_cumsum,
                                                                    const OptTensor& cu_seqlens, c10::string_view layout);
std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_wy_repr_bwd(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A,
                                                               const Tensor& dw, const Tensor& du, const Tensor& g_cumsum,
                                                               const OptTensor& cu_seqlens, c10::string_view layout);

#ifdef OT_HAVE_NORM
// norm_ops.cpp
std::tuple<Tensor, Tensor> rms_norm(const Tensor& x, const Tensor& gamma, double epsilon);
std::tuple<Tensor, Tensor, Tensor> add_rms_norm(const Tensor& x1, const Tensor& x2, const Tensor& gamma, double epsilon);
std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const OptTensor& rstd, double epsilon,
                                             const OptTensor& dx_extra);
#endif
#ifdef OT_HAVE_OPTIM
// optim_ops.cpp
void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step, double grad_scale);
double multi_tensor_l2_norm(at::TensorList tensors);
#endif
#ifdef OT_HAVE_ROTARY
// rotary_ops.cpp
Tensor rotary_mul(const Tensor& x, const Tensor& cos, const Tensor& sin);
Tensor rotary_mul_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin);
#endif
#ifdef OT_HAVE_ATTENTION
// attention_ops.cpp
std::tuple<Tensor, Tensor> causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
std::tuple<Tensor, Tensor, Tensor> causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& o, const Tensor& lse, double scale);
#endif
#ifdef OT_HAVE_GDN_LAYER
// gdn_layer_ops.cpp (causal-conv1d / fla names)
std::tuple<Tensor, OptTensor> causal_conv1d_fn(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                               const OptTensor& initial_states, bool return_final_states,
                                               c10::optional<c10::string_view> activation, const OptTensor& cu_seqlens);
std::tuple<Tensor, Tensor, OptTensor, OptTensor> causal_conv1d_bwd(const Tensor& x, const Tensor& weight, const Tensor& dy,
                                                                   const OptTensor& bias, const OptTensor& initial_states,
                                                                   const OptTensor& dfinal_states,
                                                                   c10::optional<c10::string_view> activation,
                                                                   const OptTensor& cu_seqlens);
Tensor causal_conv1d_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                            c10::optional<c10::string_view> activation, const OptTensor& conv_state_indices);
std::tuple<Tensor, Tensor> rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, double eps, bool norm_before_gate,
                                          int64_t group_size);
std::tuple<Tensor, Tensor, Tensor> rms_norm_gated_bwd(const Tensor& dy, const Tensor& x, const Tensor& z, const Tensor& weight,
                                                      const OptTensor& rstd, double eps, bool norm_before_gate, int64_t group_size);
Tensor gated_delta_net_decode(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& in_proj,
                              const c10::intrusive_ptr<PackedWeightHolder>& out_proj, const Tensor& conv_weight, const Tensor& A_log,
                              const Tensor& dt_bias, const Tensor& norm_weight, const Tensor& conv_state, const Tensor& state,
                              int64_t num_k_heads, int64_t num_v_heads, int64_t head_k_dim, int64_t head_v_dim, double eps);
#endif

// bench_ops.cpp
double cpp_call_us(c10::string_view op, const std::vector<Tensor>& args, int64_t iters, bool cpu_time);

}  // namespace ot::py
