// THE registration file: every operator of the library as torch.ops.ops_transformer.<name>, with an
// explicit schema. Names, argument order and defaults follow torch_npu (npu_moe_* without the npu_
// prefix) for MoE and fla for GDN, so porting code is a namespace change.
#include <torch/library.h>

#include <torch/custom_class.h>

#include <string>

#include "bridge.h"
#include "holders.h"
#include "ops.h"

TORCH_LIBRARY(ops_transformer, m) {
  using namespace ot::py;
  // ---- matrix engine and run-time controls
  m.def("matmul(Tensor a, Tensor b, *, float alpha=1.0, ScalarType? out_dtype=None) -> Tensor", OT_OP(matmul));
  m.def("bmm(Tensor a, Tensor b) -> Tensor", OT_OP(bmm));
  m.def("set_max_isa(int isa) -> ()", OT_OP(set_max_isa));
  m.def("set_force_ref(bool on) -> ()", OT_OP(set_force_ref));
  m.def("isa_state() -> (int, bool)", OT_OP(isa_state));
  m.def("_cpp_call_us(str op, Tensor[] args, int iters, bool cpu_time=False) -> float", OT_OP(cpp_call_us));
  m.class_<PackedWeightHolder>("PackedWeight")
      .def(torch::init<at::Tensor, std::string>())
      .def("K", &PackedWeightHolder::K)
      .def("N", &PackedWeightHolder::N);
  m.def("linear_packed(Tensor x, __torch__.torch.classes.ops_transformer.PackedWeight weight) -> Tensor", OT_OP(linear_packed));
#ifdef OT_HAVE_MOE
  // ---- MoE (torch_npu: npu_moe_* without the npu_ prefix)
  m.class_<MoeExpertsHolder>("MoeExperts")
      .def(torch::init<at::Tensor, c10::optional<at::Tensor>, at::Tensor, std::string, std::string, int64_t, bool>())
      .def("set_expert", &MoeExpertsHolder::set_expert)
      .def("remove_expert", &MoeExpertsHolder::remove_expert)
      .def("num_experts", &MoeExpertsHolder::num_experts)
      .def("hidden", &MoeExpertsHolder::hidden)
      .def("intermediate", &MoeExpertsHolder::intermediate)
      .def("packed_bytes", &MoeExpertsHolder::packed_bytes)
      .def("weights", &MoeExpertsHolder::weights)
      .def("group_size", &MoeExpertsHolder::group_size);
  m.def("moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1, *, Tensor? allowed=None) "
        "-> (Tensor y, Tensor expert_idx, Tensor row_idx)", OT_OP(moe_gating_top_k_softmax));
  m.def("moe_gating_top_k_softmax_v2(Tensor x, *, int k=1, Tensor? finished=None, int renorm=0, "
        "bool output_softmax=False, Tensor? allowed=None) -> (Tensor y, Tensor expert_idx, Tensor? softmax_result)",
        OT_OP(moe_gating_top_k_softmax_v2));
  m.def("moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, int k_group=1, int group_count=1, "
        "int group_select_mode=0, int renorm=0, int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, "
        "float eps=1e-20, Tensor? allowed=None) -> (Tensor y, Tensor expert_idx, Tensor? out)", OT_OP(moe_gating_top_k));
  m.def("moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) "
        "-> (Tensor expanded_x, Tensor expanded_row_idx, Tensor expanded_expert_idx)", OT_OP(moe_init_routing));
  m.def("moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, int active_num=-1, "
        "int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
        "bool expert_tokens_num_flag=False, int quant_mode=-1, int[] active_expert_range=[], int row_idx_type=0, "
        "ScalarType? x_dtype=None) -> (Tensor expanded_x, Tensor expanded_row_idx, Tensor expert_token_cumsum_or_count, "
        "Tensor? expanded_scale)", OT_OP(moe_init_routing_v2));
  m.def("moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor",
        OT_OP(moe_compute_expert_tokens));
  m.def("moe_re_routing(Tensor tokens, Tensor expert_token_num_per_rank, *, Tensor? per_token_scales=None, "
        "int expert_token_num_type=1, int idx_type=0) -> (Tensor permute_tokens, Tensor? permute_per_token_scales, "
        "Tensor permute_token_idx, Tensor expert_token_num)", OT_OP(moe_re_routing));
  m.def("moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) "
        "-> (Tensor permuted_tokens, Tensor sorted_indices)", OT_OP(moe_token_permute));
  m.def("moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, bool padded_mode=False, "
        "int[]? restore_shape=None) -> Tensor", OT_OP(moe_token_unpermute));
  m.def("grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor? group_list=None, int split_item=0, "
        "int? group_type=None, int group_list_type=0, int act_type=0, ScalarType? output_dtype=None, "
        "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, int antiquant_group_size=0, "
        "str activation_quant='none') -> Tensor[]",
        OT_OP(grouped_matmul));
  m.def("quantize_weights(Tensor w, str format='int8', int group_size=0, bool symmetric=True) "
        "-> (Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset)", OT_OP(quantize_weights));
  m.def("dequantize_weights(Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, int antiquant_group_size=0) -> Tensor",
        OT_OP(dequantize_weights));
  m.def("moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, Tensor? scales, "
        "Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0) -> Tensor",
        OT_OP(moe_finalize_routing));
  m.def("moe_finalize_routing_v2(Tensor expanded_x, Tensor expanded_row_idx, *, Tensor? x1=None, Tensor? x2=None, "
        "Tensor? bias=None, Tensor? scales=None, Tensor? expert_idx=None, int drop_pad_mode=0) -> Tensor",
        OT_OP(moe_finalize_routing_v2));
  m.def("moe_final_optimizer_mm(Tensor x, Tensor expert_weight, Tensor token_expert_idx) -> Tensor",
        OT_OP(moe_final_optimizer_mm));
  m.def("moe_aux_loss(Tensor probs, Tensor tokens_per_expert, int k, float coeff=1.0) -> float", OT_OP(moe_aux_loss));
  m.def("moe_z_loss(Tensor logits, float coeff=1.0, Tensor? mask=None) -> float", OT_OP(moe_z_loss));
  m.def("moe_capacity(int tokens, int k, int experts, float capacity_factor, int min_capacity=0) -> int",
        OT_OP(moe_capacity));
  m.def("moe_ffn(Tensor x, __torch__.torch.classes.ops_transformer.PackedWeight router, "
        "__torch__.torch.classes.ops_transformer.MoeExperts experts, *, int k=2, str router_type=\"softmax\", int renorm=0, "
        "bool norm_topk_prob=False, Tensor? bias=None, int k_group=1, int group_count=1, int group_select_mode=0, "
        "int norm_type=0, float routed_scaling_factor=1.0, float eps=1e-20, Tensor? allowed=None, int expert_capacity=-1, "
        "float capacity_factor=0.0, __torch__.torch.classes.ops_transformer.MoeExperts? shared=None, Tensor? residual=None) "
        "-> (Tensor y, Tensor router_logits, Tensor topk_ids, Tensor topk_weights, Tensor expert_counts, int dropped)",
        OT_OP(moe_ffn));
#endif
#ifdef OT_HAVE_MOE_BWD
  // ---- MoE backward (include/ot/moe_bwd.h): <forward op>_backward, the header's argument order
  m.class_<MoeFfnSavedHolder>("MoeFfnSaved").def("rows", &MoeFfnSavedHolder::rows);
  m.def("grouped_matmul_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor group_list, *, int group_list_type=0, "
        "int act_type=0, Tensor? bias=None, Tensor? pre_act=None, bool need_dx=True, bool need_dweight=True, "
        "bool need_dbias=False) -> (Tensor? dx, Tensor? dweight, Tensor? dbias)", OT_OP(grouped_matmul_backward));
  m.def("moe_act_backward(int act_type, Tensor z, Tensor dy) -> Tensor", OT_OP(moe_act_backward));
  m.def("moe_token_permute_backward(Tensor d_permuted, Tensor sorted_indices, int topk) -> Tensor",
        OT_OP(moe_token_permute_backward));
  m.def("moe_token_unpermute_backward(Tensor d_out, Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None) "
        "-> (Tensor d_permuted, Tensor? d_probs)", OT_OP(moe_token_unpermute_backward));
  m.def("moe_init_routing_v2_backward(Tensor d_expanded_x, Tensor expanded_row_idx, int num_tokens, int topk, "
        "int row_idx_type=0) -> Tensor", OT_OP(moe_init_routing_v2_backward));
  m.def("moe_init_routing_backward(Tensor d_expanded_x, Tensor expanded_row_idx, int num_tokens, int topk) -> Tensor",
        OT_OP(moe_init_routing_backward));
  m.def("moe_finalize_routing_v2_backward(Tensor d_out, Tensor expanded_x, Tensor expanded_row_idx, Tensor? scales=None, "
        "Tensor? bias=None, Tensor? expert_idx=None, int drop_pad_mode=0) -> (Tensor d_expanded_x, Tensor? d_scales, "
        "Tensor? d_bias)", OT_OP(moe_finalize_routing_v2_backward));
  m.def("moe_gating_top_k_softmax_backward(Tensor dy, Tensor x, Tensor expert_idx, Tensor? allowed=None) -> Tensor",
        OT_OP(moe_gating_top_k_softmax_backward));
  m.def("moe_gating_top_k_softmax_v2_backward(Tensor dy, Tensor x, Tensor expert_idx, int renorm=0, Tensor? allowed=None) "
        "-> Tensor", OT_OP(moe_gating_top_k_softmax_v2_backward));
  m.def("moe_gating_top_k_backward(Tensor dy, Tensor scores, Tensor expert_idx, int renorm=0, int norm_type=0, "
        "float routed_scaling_factor=1.0, float eps=1e-20) -> Tensor", OT_OP(moe_gating_top_k_backward));
  m.def("topk_renorm_backward(Tensor dw, Tensor y) -> Tensor", OT_OP(topk_renorm_backward));
  m.def("moe_aux_loss_backward(Tensor probs, Tensor tokens_per_expert, int k, float coeff=1.0, float d_loss=1.0) -> Tensor",
        OT_OP(moe_aux_loss_backward));
  m.def("moe_z_loss_backward(Tensor logits, float coeff=1.0, Tensor? mask=None, float d_loss=1.0) -> Tensor",
        OT_OP(moe_z_loss_backward));
  m.def("moe_ffn_forward_train(Tensor x, Tensor router, Tensor gate, Tensor up, Tensor down, *, int k=2, "
        "str router_type=\"softmax\", int renorm=0, bool norm_topk_prob=False, Tensor? bias=None, int k_group=1, "
        "int group_count=1, int group_select_mode=0, int norm_type=0, float routed_scaling_factor=1.0, float eps=1e-20, "
        "Tensor? allowed=None, int expert_capacity=-1, float capacity_factor=0.0, Tensor? shared_gate=None, "
        "Tensor? shared_up=None, Tensor? shared_down=None, Tensor? residual=None, str layout=\"torch\") "
        "-> (Tensor y, Tensor router_logits, Tensor topk_ids, Tensor topk_weights, Tensor expert_counts, int dropped, __torch__.torch.classes.ops_transformer.MoeFfnSaved saved)", OT_OP(moe_ffn_forward_train));
  m.def("moe_ffn_backward(Tensor dy, Tensor x, Tensor router, Tensor gate, Tensor up, Tensor down, "
        "__torch__.torch.classes.ops_transformer.MoeFfnSaved saved, *, Tensor? shared_gate=None, Tensor? shared_up=None, "
        "Tensor? shared_down=None, float aux_loss_coeff=0.0, float z_loss_coeff=0.0, str layout=\"torch\", "
        "ScalarType? weight_grad_dtype=None) -> (Tensor dx, Tensor d_router, Tensor d_gate, Tensor d_up, Tensor d_down, Tensor? d_shared_gate, "
        "Tensor? d_shared_up, Tensor? d_shared_down, float aux_loss, float z_loss)", OT_OP(moe_ffn_backward));
#endif
#ifdef OT_HAVE_EP
  // ---- expert parallelism over MPI (torch_npu npu_moe_distribute_*_v2; group_ep is an EpComm)
  m.class_<EpCommHolder>("EpComm")
      .def(torch::init<int64_t, int64_t, int64_t, bool, int64_t>())
      .def("ep_world_size", &EpCommHolder::ep_world_size)
      .def("node_size", &EpCommHolder::node_size)
      .def("threads_per_rank", &EpCommHolder::threads_per_rank)
      .def("node_window", &EpCommHolder::node_window)
      .def("ep_rank_id", &EpCommHolder::ep_rank_id)
      .def("num_local_experts", &EpCommHolder::num_local_experts)
      .def("local_experts", &EpCommHolder::local_experts)
      .def("rebalance", &EpCommHolder::rebalance)
      .def("set_shared_expert_ranks", &EpCommHolder::set_shared_expert_ranks)
      .def("last_bytes_sent", &EpCommHolder::last_bytes_sent);
  m.def("ep_init() -> (int world_size, int rank)", OT_OP(ep_init));
  m.def("ep_finalize() -> ()", OT_OP(ep_finalize));
  // v2 semantics under both torch_npu names (v1's expand_idx is opaque by contract: assist info here).
  for (const char* v : {"", "_v2"}) {
    m.def((std::string("moe_distribute_dispatch") + v + "(Tensor x, Tensor expert_ids, __torch__.torch.classes.ops_transformer.EpComm group_ep, "
          "int ep_world_size, int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
          "Tensor? expert_scales=None, int shared_expert_num=1, int shared_expert_rank_num=0, int quant_mode=0, "
          "int expert_token_nums_type=1, str comm_alg=\"\", int zero_expert_num=0, int copy_expert_num=0, int const_expert_num=0, "
          "bool dedup_combine=True, int comm_quant_mode=0) -> (Tensor expand_x, "
          "Tensor? dynamic_scales, Tensor assist_info_for_combine, Tensor expert_token_nums, Tensor ep_recv_counts, "
          "Tensor tp_recv_counts, Tensor? expand_scales)").c_str(), OT_OP(moe_distribute_dispatch));
    m.def((std::string("moe_distribute_combine") + v + "(Tensor expand_x, Tensor expert_ids, Tensor assist_info_for_combine, "
          "Tensor ep_send_counts, Tensor expert_scales, __torch__.torch.classes.ops_transformer.EpComm group_ep, int ep_world_size, int ep_rank_id, "
          "int moe_expert_num, *, Tensor? shared_expert_x=None, Tensor? ori_x=None, Tensor? const_expert_alpha_1=None, "
          "Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None, int shared_expert_num=1, int shared_expert_rank_num=0, "
          "int comm_quant_mode=0, int zero_expert_num=0, int copy_expert_num=0, int const_expert_num=0) -> Tensor").c_str(),
          OT_OP(moe_distribute_combine));
  }
  m.def("ep_moe_ffn(Tensor x, Tensor expert_ids, Tensor? expert_scales, __torch__.torch.classes.ops_transformer.EpComm group_ep, "
        "__torch__.torch.classes.ops_transformer.MoeExperts experts, int moe_expert_num, *, str comm_alg=\"\", int chunks=2, "
        "int quant_mode=0, Tensor? shared_expert_x=None, Tensor? x_active_mask=None, Tensor? scales=None, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, bool dedup_combine=True, int comm_quant_mode=0, int zero_expert_num=0, int copy_expert_num=0, "
        "int const_expert_num=0, Tensor? const_expert_alpha_1=None, Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None) "
        "-> Tensor", OT_OP(ep_moe_ffn));
#endif
#ifdef OT_HAVE_GDN
  // ---- Gated DeltaNet (fla functional API; layout: "BTHD" default, "BNSD" head-major)
  m.def("chunk_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale=None, "
        "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
        "bool use_qk_l2norm_in_kernel=False, *, str layout=\"BTHD\", ScalarType? final_state_dtype=None) -> (Tensor, Tensor?)",
        OT_OP(chunk_gated_delta_rule));
  m.def("chunk_gated_delta_rule_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale=None, "
        "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
        "bool use_qk_l2norm_in_kernel=False, *, str layout=\"BTHD\", bool save_for_backward=True, ScalarType? final_state_dtype=None, "
        "bool save_states=False) "
        "-> (Tensor o, Tensor? final_state, Tensor? g_cumsum, Tensor? A, Tensor? q_rstd, Tensor? k_rstd, Tensor? h, Tensor? v_new)",
        OT_OP(chunk_gated_delta_rule_fwd));
  m.def("fused_recurrent_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor? g=None, Tensor? beta=None, "
        "float? scale=None, Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
        "bool use_qk_l2norm_in_kernel=False, *, Tensor? A_log=None, Tensor? dt_bias=None, bool beta_sigmoid=False, "
        "str layout=\"BTHD\", ScalarType? final_state_dtype=None) -> (Tensor, Tensor?)", OT_OP(fused_recurrent_gated_delta_rule));
  m.def("recurrent_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor? g, Tensor? beta, Tensor(a!) state_cache, "
        "Tensor state_indices, *, float? scale=None, Tensor? cu_seqlens=None, Tensor? num_accepted_tokens=None, "
        "bool use_qk_l2norm_in_kernel=False, Tensor? A_log=None, Tensor? dt_bias=None, bool beta_sigmoid=False, "
        "str layout=\"BTHD\") -> Tensor", OT_OP(recurrent_gated_delta_rule));
  m.def("chunk_local_cumsum(Tensor g, int chunk_size=64, bool reverse=False, float? scale=None, "
        "Tensor? cu_seqlens=None, bool head_first=False) -> Tensor", OT_OP(chunk_local_cumsum));
  m.def("l2norm_fwd(Tensor x, float eps=1e-6) -> (Tensor y, Tensor rstd)", OT_OP(l2norm_fwd));
  m.def("l2norm_bwd(Tensor y, Tensor rstd, Tensor dy) -> Tensor", OT_OP(l2norm_bwd));
  m.def("chunk_scaled_dot_kkt_fwd(Tensor k, Tensor g_cumsum, Tensor beta, Tensor? cu_seqlens=None, *, "
        "str layout=\"BTHD\") -> Tensor", OT_OP(chunk_scaled_dot_kkt_fwd));
  m.def("solve_tril(Tensor A, Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> Tensor", OT_OP(solve_tril));
  m.def("recompute_w_u_fwd(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor g_cumsum, Tensor? cu_seqlens=None, *, "
        "str layout=\"BTHD\") -> (Tensor w, Tensor u)", OT_OP(recompute_w_u_fwd));
  m.def("chunk_gated_delta_rule_fwd_h(Tensor k, Tensor w, Tensor u, Tensor g, Tensor? initial_state=None, "
        "bool output_final_state=False, Tensor? cu_seqlens=None, *, str layout=\"BTHD\") "
        "-> (Tensor h, Tensor v_new, Tensor? final_state)", OT_OP(chunk_gated_delta_rule_fwd_h));
  m.def("chunk_fwd_o(Tensor q, Tensor k, Tensor v_new, Tensor h, Tensor g, float? scale=None, "
        "Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> Tensor", OT_OP(chunk_fwd_o));
#endif
#ifdef OT_HAVE_GDN_BWD
  // ---- Gated DeltaNet backward (spec section 6): composition and stages
  m.def("chunk_gated_delta_rule_bwd(Tensor q, Tensor k, Tensor v, Tensor g_cumsum, Tensor beta, Tensor dO, *, "
        "float? scale=None, Tensor? initial_state=None, Tensor? dht=None, bool use_qk_l2norm_in_kernel=False, "
        "Tensor? A=None, Tensor? cu_seqlens=None, str layout=\"BTHD\", Tensor? h=None, Tensor? v_new=None, "
        "bool bf16_compute=False) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor? dh0)", OT_OP(chunk_gated_delta_rule_bwd));
  m.def("chunk_bwd_dv_local(Tensor q, Tensor k, Tensor g_cumsum, Tensor dO, float? scale=None, Tensor? cu_seqlens=None, *, "
        "str layout=\"BTHD\") -> Tensor", OT_OP(chunk_bwd_dv_local));
  m.def("chunk_gated_delta_rule_bwd_dhu(Tensor q, Tensor k, Tensor w, Tensor g_cumsum, Tensor? dht, Tensor dO, "
        "Tensor dv_local, bool want_dh0=False, float? scale=None, Tensor? cu_seqlens=None, *, str layout=\"BTHD\") "
        "-> (Tensor dh, Tensor? dh0, Tensor dv2)", OT_OP(chunk_gated_delta_rule_bwd_dhu));
  m.def("chunk_bwd_dqkwg(Tensor q, Tensor k, Tensor v_new, Tensor h, Tensor g_cumsum, Tensor dv2, Tensor dO, Tensor dh, "
        "float? scale=None, Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> (Tensor dq, Tensor dk, Tensor dw, Tensor dg)",
        OT_OP(chunk_bwd_dqkwg));
  m.def("prepare_wy_repr_bwd_da(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dw, Tensor du, Tensor g_cumsum, "
        "Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> Tensor", OT_OP(prepare_wy_repr_bwd_da));
  m.def("prepare_wy_repr_bwd_full(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dP, Tensor dw, Tensor du, "
        "Tensor g_cumsum, Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> (Tensor dk, Tensor dv, Tensor dbeta, Tensor dg)",
        OT_OP(prepare_wy_repr_bwd_full));
  m.def("prepare_wy_repr_bwd(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dw, Tensor du, Tensor g_cumsum, "
        "Tensor? cu_seqlens=None, *, str layout=\"BTHD\") -> (Tensor dk, Tensor dv, Tensor dbeta, Tensor dg)", OT_OP(prepare_wy_repr_bwd));
#endif
#ifdef OT_HAVE_NORM
  // ---- RMSNorm (torch_npu's npu_rms_norm / npu_add_rms_norm): x [..., N], gamma [N]; rstd fp32 [rows]
  m.def("rms_norm(Tensor x, Tensor gamma, float epsilon=1e-6) -> (Tensor y, Tensor rstd)", OT_OP(rms_norm));
  m.def("add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-6) -> (Tensor y, Tensor rstd, Tensor x)", OT_OP(add_rms_norm));
  m.def("rms_norm_backward(Tensor dy, Tensor x, Tensor gamma, Tensor? rstd=None, float epsilon=1e-6, Tensor? dx_extra=None) "
        "-> (Tensor dx, Tensor dgamma)", OT_OP(rms_norm_backward));
#endif
#ifdef OT_HAVE_OPTIM
  // ---- multi-tensor optimizer steps (ops_transformer.optim)
  m.def("adamw_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg, Tensor(c!)[] exp_avg_sq, float lr, "
        "float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale=1.0) -> ()", OT_OP(adamw_step));
  m.def("multi_tensor_l2_norm(Tensor[] tensors) -> float", OT_OP(multi_tensor_l2_norm));
#endif
#ifdef OT_HAVE_ROTARY
  // ---- rotary embedding, rotate-half form (torch_npu's npu_rotary_mul): x [..., T, D], cos / sin [T, D]
  m.def("rotary_mul(Tensor x, Tensor cos, Tensor sin) -> Tensor", OT_OP(rotary_mul));
  m.def("rotary_mul_backward(Tensor dy, Tensor cos, Tensor sin) -> Tensor", OT_OP(rotary_mul_backward));
#endif
#ifdef OT_HAVE_ATTENTION
  // ---- causal attention, q [B, H, T, D], k / v [B, H, S, D] (queries = the last T positions)
  m.def("causal_attention(Tensor q, Tensor k, Tensor v, float scale) -> (Tensor o, Tensor lse)", OT_OP(causal_attention));
  m.def("causal_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, float scale) "
        "-> (Tensor dq, Tensor dk, Tensor dv)", OT_OP(causal_attention_backward));
#endif
#ifdef OT_HAVE_GDN_LAYER
  // ---- the GDN layer around its core: short causal conv (x [B, T, D] channels-last, weight [D, W],
  // states [N, D, W-1]) and the gated RMSNorm
  m.def("causal_conv1d_fn(Tensor x, Tensor weight, Tensor? bias=None, Tensor? initial_states=None, "
        "bool return_final_states=False, str? activation=\"silu\", Tensor? cu_seqlens=None) -> (Tensor, Tensor?)",
        OT_OP(causal_conv1d_fn));
  m.def("causal_conv1d_bwd(Tensor x, Tensor weight, Tensor dy, Tensor? bias=None, Tensor? initial_states=None, "
        "Tensor? dfinal_states=None, str? activation=\"silu\", Tensor? cu_seqlens=None) "
        "-> (Tensor dx, Tensor dweight, Tensor? dbias, Tensor? dinitial_states)", OT_OP(causal_conv1d_bwd));
  m.def("causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, str? activation=\"silu\", "
        "Tensor? conv_state_indices=None) -> Tensor", OT_OP(causal_conv1d_update));
  m.def("rms_norm_gated(Tensor x, Tensor z, Tensor weight, float eps=1e-6, bool norm_before_gate=True, int group_size=0) "
        "-> (Tensor y, Tensor rstd)", OT_OP(rms_norm_gated));
  m.def("rms_norm_gated_bwd(Tensor dy, Tensor x, Tensor z, Tensor weight, Tensor? rstd=None, float eps=1e-6, "
        "bool norm_before_gate=True, int group_size=0) -> (Tensor dx, Tensor dz, Tensor dweight)", OT_OP(rms_norm_gated_bwd));
  // the whole layer's decode step (Qwen3.5 projections: in_proj = [qkv | z | b | a] packed once)
  m.def("gated_delta_net_decode(Tensor x, __torch__.torch.classes.ops_transformer.PackedWeight in_proj, "
        "__torch__.torch.classes.ops_transformer.PackedWeight out_proj, Tensor conv_weight, Tensor A_log, Tensor dt_bias, "
        "Tensor norm_weight, Tensor(a!) conv_state, Tensor(b!) state, int num_k_heads, int num_v_heads, int head_k_dim, "
        "int head_v_dim, float eps=1e-6) -> Tensor", OT_OP(gated_delta_net_decode));
#endif
}
