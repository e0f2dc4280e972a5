// The GDN layer operators (include/ot/gdn_layer.h) as torch ops: the causal depthwise conv1d with
// its backward and decode step (causal-conv1d / fla names; x channels-last [B, T, D], weight [D, W]),
// and the gated RMSNorm with its backward. activation: None (or "none") or "silu" / "swish".
#include <string>

#include "bridge.h"
#include "holders.h"
#include "ops.h"
#include "ot/gdn_layer.h"

namespace ot::py {
namespace {

gdn::Activation activation_of(const c10::optional<c10::string_view>& a, const char* op) {
  if (!a || *a == "none" || *a == "") return gdn::Activation::none;
  if (*a == "silu" || *a == "swish") return gdn::Activation::silu;
  throw ot::Error(op, "activation", "None, \"silu\" or \"swish\"", std::string(*a));
}

gdn::CausalConv1dOptions conv_options(const char* op, const OptTensor& bias, const OptTensor& initial_states,
                                      const c10::optional<c10::string_view>& activation, const OptTensor& cu_seqlens) {
  gdn::CausalConv1dOptions o;
  o.bias = view(bias, op, "bias");
  o.initial_states = view(initial_states, op, "initial_states");
  o.activation = activation_of(activation, op);
  o.cu_seqlens = view(cu_seqlens, op, "cu_seqlens");
  return o;
}

gdn::RmsNormGatedOptions norm_options(double eps, bool norm_before_gate, int64_t group_size) {
  gdn::RmsNormGatedOptions o;
  o.eps = float(eps);
  o.norm_before_gate = norm_before_gate;
  o.group_size = group_size;
  return o;
}

}  // namespace

std::tuple<Tensor, OptTensor> causal_conv1d_fn(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                               const OptTensor& initial_states, bool return_final_states,
                                               c10::optional<c10::string_view> activation, const OptTensor& cu_seqlens) {
  const char* op = "causal_conv1d_fn";
  gdn::CausalConv1dOptions o = conv_options(op, bias, initial_states, activation, cu_seqlens);
  o.return_final_states = return_final_states;
  auto r = gdn::causal_conv1d_fn(view(x, op, "x"), view(weight, op, "weight"), o);
  return {wrap(r.y), wrap_opt(r.final_states)};
}

std::tuple<Tensor, Tensor, OptTensor, OptTensor> causal_conv1d_bwd(const Tensor& x, const Tensor& weight, const Tensor& dy,
                                                                   const OptTensor& bias, const OptTensor& initial_states,
                                                                   const OptTensor& dfinal_states,
                                                                   c10::optional<c10::string_view> activation,
                                                                   const OptTensor& cu_seqlens) {
  const char* op = "causal_conv1d_bwd";
  const gdn::CausalConv1dOptions o = conv_options(op, bias, initial_states, activation, cu_seqlens);
  auto g = gdn::causal_conv1d_bwd(view(x, op, "x"), view(weight, op, "weight"), view(dy, op, "dy"), o,
                                  view(dfinal_states, op, "dfinal_states"));
  return {wrap(g.dx), wrap(g.dweight), wrap_opt(g.dbias), wrap_opt(g.dinitial_states)};
}

Tensor causal_conv1d_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                            c10::optional<c10::string_view> activation, const OptTensor& conv_state_indices) {
  const char* op = "causal_conv1d_update";
  gdn::CausalConv1dUpdateOptions o;
  o.bias = view(bias, op, "bias");
  o.activation = activation_of(activation, op);
  o.conv_state_indices = view(conv_state_indices, op, "conv_state_indices");
  return wrap(gdn::causal_conv1d_update(view(x, op, "x"), view(conv_state, op, "conv_state"), view(weight, op, "weight"), o));
}

std::tuple<Tensor, Tensor> rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, double eps, bool norm_before_gate,
                                          int64_t group_size) {
  const char* op = "rms_norm_gated";
  auto r = gdn::rms_norm_gated(view(x, op, "x"), view(z, op, "z"), view(weight, op, "weight"),
                               norm_options(eps, norm_before_gate, group_size));
  return {wrap(r.y), wrap(r.rstd)};
}

std::tuple<Tensor, Tensor, Tensor> rms_norm_gated_bwd(const Tensor& dy, const Tensor& x, const Tensor& z, const Tensor& weight,
                                                      const OptTensor& rstd, double eps, bool norm_before_gate, int64_t group_size) {
  const char* op = "rms_norm_gated_bwd";
  auto g = gdn::rms_norm_gated_bwd(view(dy, op, "dy"), view(x, op, "x"), view(z, op, "z"), view(weight, op, "weight"),
                                   view(rstd, op, "rstd"), norm_options(eps, norm_before_gate, group_size));
  return {wrap(g.dx), wrap(g.dz), wrap(g.dweight)};
}

}  // namespace ot::py

namespace ot::py {

Tensor gated_delta_net_decode(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& in_proj,
                              const c10::intrusive_ptr<PackedWeightHolder>& out_proj, const Tensor& conv_weight, const Tensor& A_log,
                              const Tensor& dt_bias, const Tensor& norm_weight, const Tensor& conv_state, const Tensor& state,
                              int64_t num_k_heads, int64_t num_v_heads, int64_t head_k_dim, int64_t head_v_dim, double eps) {
  const char* op = "gated_delta_net_decode";
  OT_CHECK(in_proj.defined() && out_proj.defined(), op, "in_proj", "PackedWeights", "None");
  OT_CHECK(x.dim() == 2 || (x.dim() == 3 && x.size(1) == 1), op, "x", "[B, H] or [B, 1, H]", view(x, op, "x").shape_str());
  gdn::GdnDecodeLayer L;
  L.in_proj = &in_proj->b;
  L.out_proj = &out_proj->b;
  L.conv_weight = view(conv_weight.dim() == 3 ? conv_weight.select(1, 0) : conv_weight, op, "conv_weight");
  L.A_log = view(A_log, op, "A_log");
  L.dt_bias = view(dt_bias, op, "dt_bias");
  L.norm_weight = view(norm_weight, op, "norm_weight");
  L.HK = num_k_heads, L.HV = num_v_heads, L.DK = head_k_dim, L.DV = head_v_dim;
  L.eps = float(eps);
  const Tensor x2 = x.dim() == 3 ? x.select(1, 0) : x;
  Tensor y = wrap(gdn::gated_delta_net_decode(view(x2, op, "x"), L, view(conv_state, op, "conv_state"), view(state, op, "state")));
  return x.dim() == 3 ? y.unsqueeze(1) : y;
}

}  // namespace ot::py
