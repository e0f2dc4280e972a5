// MoE ops (include/ot/moe.h) with torch_npu's names (npu_ prefix dropped), argument order and
// defaults, plus the prepacked expert store and the fused moe_ffn.
#include <ATen/ops/cumsum.h>
#include <ATen/ops/stack.h>

#include "bridge.h"
#include "holders.h"
#include "ops.h"

namespace ot::py {
namespace {

moe::WeightLayout weight_layout(const std::string& s, const char* op) {
  if (s == "torch") return moe::WeightLayout::torch;
  if (s == "EHI") return moe::WeightLayout::EHI;
  throw ot::Error(op, "layout", "\"torch\" (nn.Linear [E, I, H] / [E, H, I]) or \"EHI\"", s);
}

}  // namespace

// ---- custom classes ----------------------------------------------------------------------------

MoeExpertsHolder::MoeExpertsHolder(const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                                   const std::string& layout, const std::string& weights, int64_t group_size, bool symmetric) {
  guard([&] {
    const char* op = "MoeExperts";
    auto l = weight_layout(layout, op);
    OT_CHECK(weights == "float" || weights == "int8" || weights == "int4" || weights == "w8a8", op, "weights",
             "\"float\" (the tensors' dtype), \"int8\", \"int4\" or \"w8a8\" (int8 weights, int8 per-token activations)", weights);
    if (weights != "float") {
      // Fused gate_up: its halves ([E, 2I, H] torch, [E, H, 2I] EHI) are gate and up.
      TensorView g = view(gate, op, up ? "gate" : "gate_up"), u;
      if (up) {
        u = view(*up, op, "up");
      } else {
        const int dim = l == moe::WeightLayout::torch ? 1 : 2;
        OT_CHECK(g.ndim == 3 && g.size(dim) % 2 == 0, op, "gate_up", "[E, 2I, H] (torch) or [E, H, 2I] (EHI)", g.shape_str());
        const int64_t I = g.size(dim) / 2;
        u = g.narrow(dim, I, I);
        g = g.narrow(dim, 0, I);
      }
      quant = std::make_shared<moe::QuantMoeExperts>(moe::QuantMoeExperts::quantize(
          g, u, view(down, op, "down"), l, weights == "int4" ? WeightFormat::int4 : WeightFormat::int8, group_size, symmetric,
          weights == "w8a8" ? gemm::ActivationQuant::int8_per_token : gemm::ActivationQuant::none));
      return 0;
    }
    experts = up ? moe::MoeExperts::from_stacked(view(gate, op, "gate"), view(*up, op, "up"), view(down, op, "down"), l)
                 : moe::MoeExperts::from_fused(view(gate, op, "gate_up"), view(down, op, "down"), l);
    return 0;
  });
}

void MoeExpertsHolder::set_expert(int64_t e, const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                                  const std::string& layout) {
  guard([&] {
    const char* op = "MoeExperts.set_expert";
    OT_CHECK(!quant, op, "experts", "a float store (a quantised store is rebuilt whole)", weights());
    auto l = weight_layout(layout, op);
    if (up) experts.set(e, view(gate, op, "gate"), view(*up, op, "up"), view(down, op, "down"), l);
    else experts.set_fused(e, view(gate, op, "gate_up"), view(down, op, "down"), l);
    return 0;
  });
}

void MoeExpertsHolder::remove_expert(int64_t e) {
  guard([&] {
    OT_CHECK(!quant, "MoeExperts.remove_expert", "experts", "a float store (a quantised store is rebuilt whole)", weights());
    experts.remove(e);
    return 0;
  });
}

int64_t MoeExpertsHolder::packed_bytes() const {
  if (quant) return int64_t(quant->expert_bytes()) * quant->num_experts();
  int64_t s = 0;
  for (int64_t e = 0; e < experts.num_experts(); ++e) s += int64_t(experts.expert_bytes(e));
  return s;
}

std::string MoeExpertsHolder::weights() const {
  if (!quant) return "float";
  return quant->activation_quant() == gemm::ActivationQuant::int8_per_token ? "w8a8" : weight_format_name(quant->format());
}

// ---- routers -----------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> moe_gating_top_k_softmax(const Tensor& x, const OptTensor& finished, int64_t k,
                                                            const OptTensor& allowed) {
  const char* op = "moe_gating_top_k_softmax";
  auto r = moe::moe_gating_top_k_softmax(view(x, op, "x"), k, view(finished, op, "finished"), view(allowed, op, "allowed"));
  return {wrap(r.y), wrap(r.expert_idx), wrap(r.row_idx)};
}

std::tuple<Tensor, Tensor, OptTensor> moe_gating_top_k_softmax_v2(const Tensor& x, int64_t k, const OptTensor& finished,
                                                                  int64_t renorm, bool output_softmax, const OptTensor& allowed) {
  const char* op = "moe_gating_top_k_softmax_v2";
  auto r = moe::moe_gating_top_k_softmax_v2(view(x, op, "x"), k, view(finished, op, "finished"), int(renorm), output_softmax,
                                            view(allowed, op, "allowed"));
  return {wrap(r.y), wrap(r.expert_idx), wrap_opt(r.scores)};
}

std::tuple<Tensor, Tensor, OptTensor> moe_gating_top_k(const Tensor& x, int64_t k, const OptTensor& bias, int64_t k_group,
                                                       int64_t group_count, int64_t group_select_mode, int64_t renorm,
                                                       int64_t norm_type, bool out_flag, double routed_scaling_factor,
                                                       double eps, const OptTensor& allowed) {
  const char* op = "moe_gating_top_k";
  moe::GatingTopKOptions o;
  o.k = k;
  o.bias = view(bias, op, "bias");
  o.k_group = k_group;
  o.group_count = group_count;
  o.group_select_mode = int(group_select_mode);
  o.renorm = int(renorm);
  o.norm_type = int(norm_type);
  o.out_flag = out_flag;
  o.routed_scaling_factor = float(routed_scaling_factor);
  o.eps = float(eps);
  o.allowed = view(allowed, op, "allowed");
  auto r = moe::moe_gating_top_k(view(x, op, "x"), o);
  return {wrap(r.y), wrap(r.expert_idx), wrap_opt(r.scores)};
}

// ---- routing -----------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> moe_init_routing(const Tensor& x, const Tensor& row_idx, const Tensor& expert_idx,
                                                    int64_t active_num) {
  const char* op = "moe_init_routing";
  auto r = moe::moe_init_routing(view(x, op, "x"), view(row_idx, op, "row_idx"), view(expert_idx, op, "expert_idx"), active_num);
  return {wrap(r.expanded_x), wrap(r.expanded_row_idx), wrap(r.expanded_expert_idx)};
}

std::tuple<Tensor, Tensor, Tensor, OptTensor> moe_init_routing_v2(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale, const OptTensor& offset, int64_t active_num,
    int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t expert_tokens_num_type,
    bool expert_tokens_num_flag, int64_t quant_mode, c10::IntArrayRef active_expert_range, int64_t row_idx_type,
    c10::optional<c10::ScalarType> x_dtype) {
  const char* op = "moe_init_routing_v2";
  OT_CHECK(active_expert_range.empty() || active_expert_range.size() == 2, op, "active_expert_range", "[] or [start, end]",
           active_expert_range.size(), " values");
  OT_CHECK(!x_dtype || *x_dtype == x.scalar_type(), op, "x_dtype", "None or x's dtype", c10::toString(*x_dtype));
  moe::InitRoutingV2Options o;
  o.scale = view(scale, op, "scale");
  o.offset = view(offset, op, "offset");
  o.active_num = active_num;
  o.expert_capacity = expert_capacity;
  o.expert_num = expert_num;
  o.drop_pad_mode = int(drop_pad_mode);
  o.expert_tokens_num_type = int(expert_tokens_num_type);
  o.quant_mode = int(quant_mode);
  if (active_expert_range.size() == 2) {
    o.active_expert_range[0] = active_expert_range[0];
    o.active_expert_range[1] = active_expert_range[1];
  }
  o.row_idx_type = int(row_idx_type);
  auto r = moe::moe_init_routing_v2(view(x, op, "x"), view(expert_idx, op, "expert_idx"), o);
  return {wrap(r.expanded_x), wrap(r.expanded_row_idx), wrap(r.expert_tokens), wrap_opt(r.expanded_scale)};
}

Tensor moe_compute_expert_tokens(const Tensor& sorted_expert_for_source_row, int64_t num_expert) {
  const char* op = "moe_compute_expert_tokens";
  return wrap(moe::moe_compute_expert_tokens(view(sorted_expert_for_source_row, op, "sorted_expert_for_source_row"), num_expert));
}

std::tuple<Tensor, OptTensor, Tensor, Tensor> moe_re_routing(const Tensor& tokens, const Tensor& expert_token_num_per_rank,
                                                             const OptTensor& per_token_scales, int64_t expert_token_num_type,
                                                             int64_t idx_type) {
  const char* op = "moe_re_routing";
  OT_CHECK(expert_token_num_type == 0 || expert_token_num_type == 1, op, "expert_token_num_type", "0 (cumsum) or 1 (count)",
           expert_token_num_type);
  OT_CHECK(idx_type == 0 || idx_type == 1, op, "idx_type", "0 (gather) or 1 (scatter)", idx_type);
  auto r = moe::moe_re_routing(view(tokens, op, "tokens"), view(expert_token_num_per_rank, op, "expert_token_num_per_rank"),
                               view(per_token_scales, op, "per_token_scales"));
  Tensor idx = wrap(r.permute_token_idx), counts = wrap(r.expert_token_num);
  if (idx_type == 1) {  // scatter form: out position of every input row
    Tensor inv = empty({idx.numel()}, c10::ScalarType::Int);
    const int32_t* g = idx.data_ptr<int32_t>();
    int32_t* s = inv.data_ptr<int32_t>();
    for (int64_t d = 0; d < idx.numel(); ++d) s[g[d]] = int32_t(d);
    idx = inv;
  }
  if (expert_token_num_type == 0) counts = at::cumsum(counts, 0);
  return {wrap(r.permute_tokens), wrap_opt(r.permute_per_token_scales), idx, counts};
}

std::tuple<Tensor, Tensor> moe_token_permute(const Tensor& tokens, const Tensor& indices, c10::optional<int64_t> num_out_tokens,
                                             bool padded_mode) {
  const char* op = "moe_token_permute";
  auto r = moe::moe_token_permute(view(tokens, op, "tokens"), view(indices, op, "indices"), num_out_tokens.value_or(0), padded_mode);
  return {wrap(r.permuted_tokens), wrap(r.sorted_indices)};
}

Tensor moe_token_unpermute(const Tensor& permuted_tokens, const Tensor& sorted_indices, const OptTensor& probs, bool padded_mode,
                           c10::OptionalIntArrayRef restore_shape) {
  const char* op = "moe_token_unpermute";
  int64_t rows = -1;
  if (restore_shape.has_value()) {
    OT_CHECK(!restore_shape->empty(), op, "restore_shape", "[rows, H]", "[]");
    rows = (*restore_shape)[0];
  }
  return wrap(moe::moe_token_unpermute(view(permuted_tokens, op, "permuted_tokens"), view(sorted_indices, op, "sorted_indices"),
                                       view(probs, op, "probs"), padded_mode, rows));
}

// ---- grouped matmul, finalize, per-token expert mm ------------------------------------------------

std::vector<Tensor> grouped_matmul(const std::vector<Tensor>& x, const std::vector<Tensor>& weight,
                                   const c10::optional<std::vector<Tensor>>& bias, const OptTensor& group_list, int64_t split_item,
                                   c10::optional<int64_t> group_type, int64_t group_list_type, int64_t act_type,
                                   c10::optional<c10::ScalarType> output_dtype, const c10::optional<std::vector<Tensor>>& antiquant_scale,
                                   const c10::optional<std::vector<Tensor>>& antiquant_offset, int64_t antiquant_group_size,
                                   c10::string_view activation_quant) {
  const char* op = "grouped_matmul";
  OT_CHECK(activation_quant == "none" || activation_quant == "int8_per_token", op, "activation_quant",
           "\"none\" or \"int8_per_token\" (W8A8, int8 antiquant weights)", std::string(activation_quant));
  const gemm::ActivationQuant aq = activation_quant == "none" ? gemm::ActivationQuant::none : gemm::ActivationQuant::int8_per_token;
  OT_CHECK(x.size() == 1, op, "x", "one tensor [M, K] (M-split grouping)", x.size(), " tensors");
  OT_CHECK(!weight.empty(), op, "weight", "[W] with W [G, K, N], or G tensors [K, N]", "[]");
  OT_CHECK(!group_type || *group_type == 0, op, "group_type", "None or 0 (split M)", *group_type);
  OT_CHECK(group_list.has_value(), op, "group_list", "a tensor (M-split needs group sizes)", "None");
  OT_CHECK(split_item >= 0 && split_item <= 3, op, "split_item", "0..3", split_item);
  OT_CHECK(group_list_type >= 0 && group_list_type <= 2, op, "group_list_type", "0 cumsum, 1 count or 2 key-value", group_list_type);
  OT_CHECK(!output_dtype || *output_dtype == x[0].scalar_type(), op, "output_dtype", "None or x's dtype",
           c10::toString(*output_dtype));
  // A list of per-group weights is stacked once (a copy); [G, K, N] (or its transposed view) is used in place.
  Tensor w = weight.size() == 1 ? weight[0] : at::stack(weight);
  OptTensor b;
  if (bias && !bias->empty()) b = (bias->size() == 1 ? (*bias)[0] : at::stack(*bias)).to(c10::ScalarType::Float);
  const bool quant = antiquant_scale && !antiquant_scale->empty();
  OT_CHECK(quant || !(antiquant_offset && !antiquant_offset->empty()), op, "antiquant_offset", "given only with antiquant_scale", "no scale");
  OT_CHECK(quant || aq == gemm::ActivationQuant::none, op, "activation_quant", "\"none\" without antiquant_scale (W8A8 needs int8 weights)",
           std::string(activation_quant));
  Tensor y;
  if (quant) {
    // Quantised weights: int8 codes (torch.int8) or int4 codes two a byte (torch.uint8); see quantize_weights.
    Tensor s = antiquant_scale->size() == 1 ? (*antiquant_scale)[0] : at::stack(*antiquant_scale);
    OptTensor o;
    if (antiquant_offset && !antiquant_offset->empty()) o = antiquant_offset->size() == 1 ? (*antiquant_offset)[0] : at::stack(*antiquant_offset);
    QuantWeightView qv{view(w, op, "weight"), view(s, op, "antiquant_scale"), view(o, op, "antiquant_offset"),
                       w.scalar_type() == c10::ScalarType::Byte ? WeightFormat::int4 : WeightFormat::int8, antiquant_group_size};
    y = wrap(moe::grouped_matmul(view(x[0], op, "x"), qv, view(*group_list, op, "group_list"), moe::GroupListType(group_list_type),
                                 view(b, op, "bias"), act_of(act_type, op), aq));
  } else {
    y = wrap(moe::grouped_matmul(view(x[0], op, "x"), view(w, op, "weight"), view(*group_list, op, "group_list"),
                                 moe::GroupListType(group_list_type), view(b, op, "bias"), act_of(act_type, op)));
  }
  if (split_item >= 2) return {y};
  // One output per group (split_item 0/1): views into y.
  Tensor gl = group_list->to(c10::ScalarType::Long).contiguous();
  const int64_t* p = gl.data_ptr<int64_t>();
  std::vector<Tensor> out;
  int64_t off = 0, prev = 0;
  const int64_t n = group_list_type == 2 ? gl.size(0) : gl.numel();
  for (int64_t g = 0; g < n; ++g) {
    int64_t cnt = group_list_type == 0 ? p[g] - prev : group_list_type == 1 ? p[g] : p[2 * g + 1];
    prev = group_list_type == 0 ? p[g] : prev;
    out.push_back(y.narrow(0, off, cnt));
    off += cnt;
  }
  return out;
}

std::tuple<Tensor, Tensor, OptTensor> quantize_weights(const Tensor& w, c10::string_view format, int64_t group_size, bool symmetric) {
  const char* op = "quantize_weights";
  OT_CHECK(format == "int8" || format == "int4", op, "format", "'int8' or 'int4'", std::string(format));
  QuantizedWeights q = ot::quantize_weights(view(w, op, "w"), format == "int4" ? WeightFormat::int4 : WeightFormat::int8, group_size, symmetric);
  OptTensor o;
  if (q.offset.defined()) o = wrap(q.offset);
  return {wrap(q.data), wrap(q.scale), o};
}

Tensor dequantize_weights(const Tensor& weight, const Tensor& antiquant_scale, const OptTensor& antiquant_offset, int64_t antiquant_group_size) {
  const char* op = "dequantize_weights";
  QuantWeightView qv{view(weight, op, "weight"), view(antiquant_scale, op, "antiquant_scale"), view(antiquant_offset, op, "antiquant_offset"),
                     weight.scalar_type() == c10::ScalarType::Byte ? WeightFormat::int4 : WeightFormat::int8, antiquant_group_size};
  return wrap(ot::dequantize_weights(qv));
}

Tensor moe_finalize_routing(const Tensor& expanded_permuted_rows, const OptTensor& skip1, const OptTensor& skip2,
                            const OptTensor& bias, const OptTensor& scales, const Tensor& expanded_src_to_dst_row,
                            const OptTensor& export_for_source_row, c10::optional<int64_t> drop_pad_mode) {
  const char* op = "moe_finalize_routing";
  auto rows = view(expanded_permuted_rows, op, "expanded_permuted_rows");
  auto idx = view(expanded_src_to_dst_row, op, "expanded_src_to_dst_row");
  auto s1 = view(skip1, op, "skip1"), s2 = view(skip2, op, "skip2"), bi = view(bias, op, "bias"), sc = view(scales, op, "scales");
  auto ex = view(export_for_source_row, op, "export_for_source_row");
  const int mode = int(drop_pad_mode.value_or(0));
  if (mode == 0 && s1.defined() && bi.defined() && sc.defined() && ex.defined())
    return wrap(moe::moe_finalize_routing(rows, s1, s2, bi, sc, idx, ex));
  return wrap(moe::moe_finalize_routing_v2(rows, idx, s1, s2, bi, sc, ex, mode));
}

Tensor moe_finalize_routing_v2(const Tensor& expanded_x, const Tensor& expanded_row_idx, const OptTensor& x1, const OptTensor& x2,
                               const OptTensor& bias, const OptTensor& scales, const OptTensor& expert_idx, int64_t drop_pad_mode) {
  const char* op = "moe_finalize_routing_v2";
  return wrap(moe::moe_finalize_routing_v2(view(expanded_x, op, "expanded_x"), view(expanded_row_idx, op, "expanded_row_idx"),
                                           view(x1, op, "x1"), view(x2, op, "x2"), view(bias, op, "bias"),
                                           view(scales, op, "scales"), view(expert_idx, op, "expert_idx"), int(drop_pad_mode)));
}

Tensor moe_final_optimizer_mm(const Tensor& x, const Tensor& expert_weight, const Tensor& token_expert_idx) {
  const char* op = "moe_final_optimizer_mm";
  return wrap(moe::moe_final_optimizer_mm(view(x, op, "x"), view(expert_weight, op, "expert_weight"),
                                          view(token_expert_idx, op, "token_expert_idx")));
}

// ---- losses and capacity -------------------------------------------------------------------------

double moe_aux_loss(const Tensor& probs, const Tensor& tokens_per_expert, int64_t k, double coeff) {
  const char* op = "moe_aux_loss";
  return moe::moe_aux_loss(view(probs, op, "probs"), view(tokens_per_expert, op, "tokens_per_expert"), k, float(coeff));
}

double moe_z_loss(const Tensor& logits, double coeff, const OptTensor& mask) {
  const char* op = "moe_z_loss";
  return moe::moe_z_loss(view(logits, op, "logits"), float(coeff), view(mask, op, "mask"));
}

int64_t moe_capacity(int64_t tokens, int64_t k, int64_t experts, double capacity_factor, int64_t min_capacity) {
  return moe::moe_capacity(tokens, k, experts, capacity_factor, min_capacity);
}

// ---- the fused layer -----------------------------------------------------------------------------

moe::MoeFfnOptions ffn_options(const char* op, int64_t k, c10::string_view router_type, int64_t renorm, bool norm_topk_prob,
                               const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                               int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed,
                               int64_t expert_capacity, double capacity_factor, const OptTensor& residual) {
  moe::MoeFfnOptions o;
  o.k = k;
  if (router_type == "softmax") o.router = moe::RouterKind::softmax_topk;
  else if (router_type == "softmax_v2") o.router = moe::RouterKind::softmax_topk_v2;
  else if (router_type == "gating_top_k") o.router = moe::RouterKind::gating_top_k;
  else throw ot::Error(op, "router_type", "\"softmax\", \"softmax_v2\" or \"gating_top_k\"", std::string(router_type));
  o.renorm = int(renorm);
  o.norm_topk_prob = norm_topk_prob;
  o.gating.bias = view(bias, op, "bias");
  o.gating.k_group = k_group;
  o.gating.group_count = group_count;
  o.gating.group_select_mode = int(group_select_mode);
  o.gating.norm_type = int(norm_type);
  o.gating.routed_scaling_factor = float(routed_scaling_factor);
  o.gating.eps = float(eps);
  o.allowed = view(allowed, op, "allowed");
  o.expert_capacity = expert_capacity;
  o.capacity_factor = capacity_factor;
  o.residual = view(residual, op, "residual");
  return o;
}

MoeFfnOut moe_ffn(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& router,
                  const c10::intrusive_ptr<MoeExpertsHolder>& experts, int64_t k, c10::string_view router_type, int64_t renorm,
                  bool norm_topk_prob, const OptTensor& bias, int64_t k_group, int64_t group_count, int64_t group_select_mode,
                  int64_t norm_type, double routed_scaling_factor, double eps, const OptTensor& allowed, int64_t expert_capacity,
                  double capacity_factor, const c10::optional<c10::intrusive_ptr<MoeExpertsHolder>>& shared,
                  const OptTensor& residual) {
  const char* op = "moe_ffn";
  moe::MoeFfnOptions o = ffn_options(op, k, router_type, renorm, norm_topk_prob, bias, k_group, group_count, group_select_mode,
                                     norm_type, routed_scaling_factor, eps, allowed, expert_capacity, capacity_factor, residual);
  OT_CHECK(router.defined(), op, "router", "a PackedWeight", "None");
  OT_CHECK(experts.defined(), op, "experts", "a MoeExperts", "None");
  if (shared && *shared) {
    // A quantised shared expert goes with quantised routed experts (the C++ float layer refuses it).
    OT_CHECK(!(*shared)->quant || experts->quant, op, "shared", "a float MoeExperts with float routed experts (a quantised shared expert needs quantised routed experts)",
             (*shared)->weights());
    if ((*shared)->quant) o.shared_quant = (*shared)->quant.get();
    else o.shared = &(*shared)->experts;
  }
  auto r = experts->quant ? moe::moe_ffn(view(x, op, "x"), router->b, *experts->quant, o) : moe::moe_ffn(view(x, op, "x"), router->b, experts->experts, o);
  return {wrap(r.y), wrap(r.router_logits), wrap(r.topk_ids), wrap(r.topk_weights), wrap(r.expert_counts), r.dropped};
}

}  // namespace ot::py
