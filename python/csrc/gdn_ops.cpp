// Gated DeltaNet ops (include/ot/gdn.h) with fla's argument names and order. Layout strings:
// "BTHD" (fla, time-major, default) or "BNSD"/"BHTD" (head-major); head_first=True means BHTD.
#include "bridge.h"
#include "gdn_args.h"
#include "ops.h"
#include "ot/gdn.h"

namespace ot::py {
using namespace gdn_args;
namespace {

// The options both recurrent entry points share (fused gates A_log, dt_bias; sigmoid beta).
gdn::RecurrentOptions recurrent_options(const char* op, c10::string_view layout, const OptTensor& cu_seqlens,
                                        c10::optional<double> scale, bool use_qk_l2norm_in_kernel, const OptTensor& A_log,
                                        const OptTensor& dt_bias, bool beta_sigmoid) {
  gdn::RecurrentOptions o;
  set_common(o, op, layout, cu_seqlens);
  o.scale = opt_float(scale);
  o.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  o.A_log = view(A_log, op, "A_log");
  o.dt_bias = view(dt_bias, op, "dt_bias");
  o.beta_sigmoid = beta_sigmoid;
  return o;
}

// The final state's dtype: fp32 unless the caller asks for another (fla returns fp32).
ot::DType state_dtype(const c10::optional<c10::ScalarType>& t, const char* op) {
  return t ? to_ot(*t, op, "final_state_dtype") : ot::DType::f32;
}

gdn::RecurrentOut run_recurrent(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& g,
                                const OptTensor& beta, const gdn::RecurrentOptions& o) {
  return gdn::recurrent_gated_delta_rule(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), view(g, op, "g"),
                                         view(beta, op, "beta"), o);
}

}  // namespace

GdnChunkFwd chunk_gated_delta_rule_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                       c10::optional<double> scale, const OptTensor& initial_state, bool output_final_state,
                                       const OptTensor& cu_seqlens, bool use_qk_l2norm_in_kernel, c10::string_view layout,
                                       bool save_for_backward, c10::optional<c10::ScalarType> final_state_dtype, bool save_states) {
  const char* op = "chunk_gated_delta_rule";
  gdn::ChunkOptions o;
  set_common(o, op, layout, cu_seqlens);
  o.scale = opt_float(scale);
  o.initial_state = view(initial_state, op, "initial_state");
  o.output_final_state = output_final_state;
  o.final_state_dtype = state_dtype(final_state_dtype, op);
  o.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  o.save_for_backward = save_for_backward;
  o.save_states = save_states;
  auto r = gdn::chunk_gated_delta_rule_fwd(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), view(g, op, "g"),
                                           view(beta, op, "beta"), o);
  return {wrap(r.o),          wrap_opt(r.final_state), wrap_opt(r.g_cumsum), wrap_opt(r.A), wrap_opt(r.q_rstd),
          wrap_opt(r.k_rstd), wrap_opt(r.h),           wrap_opt(r.v_new)};
}

std::tuple<Tensor, OptTensor> chunk_gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                                     const Tensor& beta, c10::optional<double> scale, const OptTensor& initial_state,
                                                     bool output_final_state, const OptTensor& cu_seqlens,
                                                     bool use_qk_l2norm_in_kernel, c10::string_view layout,
                                                     c10::optional<c10::ScalarType> final_state_dtype) {
  auto r = chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                      use_qk_l2norm_in_kernel, layout, false, final_state_dtype, false);
  return {std::get<0>(r), std::get<1>(r)};
}

std::tuple<Tensor, OptTensor> fused_recurrent_gated_delta_rule(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& g, const OptTensor& beta, c10::optional<double> scale,
    const OptTensor& initial_state, bool output_final_state, const OptTensor& cu_seqlens, bool use_qk_l2norm_in_kernel,
    const OptTensor& A_log, const OptTensor& dt_bias, bool beta_sigmoid, c10::string_view layout,
    c10::optional<c10::ScalarType> final_state_dtype) {
  const char* op = "fused_recurrent_gated_delta_rule";
  gdn::RecurrentOptions o = recurrent_options(op, layout, cu_seqlens, scale, use_qk_l2norm_in_kernel, A_log, dt_bias, beta_sigmoid);
  o.initial_state = view(initial_state, op, "initial_state");
  o.output_final_state = output_final_state;
  o.final_state_dtype = state_dtype(final_state_dtype, op);
  auto r = run_recurrent(op, q, k, v, g, beta, o);
  return {wrap(r.o), wrap_opt(r.final_state)};
}

Tensor recurrent_gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& g, const OptTensor& beta,
                                  const Tensor& state_cache, const Tensor& state_indices, c10::optional<double> scale,
                                  const OptTensor& cu_seqlens, const OptTensor& num_accepted_tokens, bool use_qk_l2norm_in_kernel,
                                  const OptTensor& A_log, const OptTensor& dt_bias, bool beta_sigmoid, c10::string_view layout) {
  const char* op = "recurrent_gated_delta_rule";
  gdn::RecurrentOptions o = recurrent_options(op, layout, cu_seqlens, scale, use_qk_l2norm_in_kernel, A_log, dt_bias, beta_sigmoid);
  o.state_cache = view(state_cache, op, "state_cache");
  o.state_indices = view(state_indices, op, "state_indices");
  o.num_accepted_tokens = view(num_accepted_tokens, op, "num_accepted_tokens");
  return wrap(run_recurrent(op, q, k, v, g, beta, o).o);
}

// ---- stages ---------------------------------------------------------------------------------

Tensor chunk_local_cumsum(const Tensor& g, int64_t chunk_size, bool reverse, c10::optional<double> scale,
                          const OptTensor& cu_seqlens, bool head_first) {
  const char* op = "chunk_local_cumsum";
  OT_CHECK(chunk_size == gdn::kChunk, op, "chunk_size", "64", chunk_size);
  gdn::Common c;
  c.layout = head_first ? gdn::Layout::BHTD : gdn::Layout::BTHD;
  c.cu_seqlens = view(cu_seqlens, op, "cu_seqlens");
  return wrap(gdn::chunk_local_cumsum(view(g, op, "g"), reverse, float(scale.value_or(1.0)), c));
}

std::tuple<Tensor, Tensor> l2norm_fwd(const Tensor& x, double eps) {
  auto r = gdn::l2norm_fwd(view(x, "l2norm_fwd", "x"), float(eps));
  return {wrap(r.y), wrap(r.rstd)};
}

Tensor l2norm_bwd(const Tensor& y, const Tensor& rstd, const Tensor& dy) {
  const char* op = "l2norm_bwd";
  return wrap(gdn::l2norm_bwd(view(y, op, "y"), view(rstd, op, "rstd"), view(dy, op, "dy")));
}

Tensor chunk_scaled_dot_kkt_fwd(const Tensor& k, const Tensor& g_cumsum, const Tensor& beta, const OptTensor& cu_seqlens,
                                c10::string_view layout) {
  const char* op = "chunk_scaled_dot_kkt_fwd";
  const gdn::Common c = common(op, layout, cu_seqlens);
  return wrap(gdn::chunk_scaled_dot_kkt_fwd(view(k, op, "k"), view(g_cumsum, op, "g_cumsum"), view(beta, op, "beta"), c));
}

Tensor solve_tril(const Tensor& A, const OptTensor& cu_seqlens, c10::string_view layout) {
  const gdn::Common c = common("solve_tril", layout, cu_seqlens);
  return wrap(gdn::solve_tril(view(A, "solve_tril", "A"), c));
}

std::tuple<Tensor, Tensor> recompute_w_u_fwd(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A,
                                             const Tensor& g_cumsum, const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "recompute_w_u_fwd";
  const gdn::Common c = common(op, layout, cu_seqlens);
  auto r = gdn::recompute_w_u_fwd(view(k, op, "k"), view(v, op, "v"), view(beta, op, "beta"), view(A, op, "A"),
                                  view(g_cumsum, op, "g_cumsum"), c);
  return {wrap(r.w), wrap(r.u)};
}

std::tuple<Tensor, Tensor, OptTensor> chunk_gated_delta_rule_fwd_h(const Tensor& k, const Tensor& w, const Tensor& u,
                                                                   const Tensor& g, const OptTensor& initial_state,
                                                                   bool output_final_state, const OptTensor& cu_seqlens,
                                                                   c10::string_view layout) {
  const char* op = "chunk_gated_delta_rule_fwd_h";
  const gdn::Common c = common(op, layout, cu_seqlens);
  auto r = gdn::chunk_gated_delta_rule_fwd_h(view(k, op, "k"), view(w, op, "w"), view(u, op, "u"), view(g, op, "g"),
                                             view(initial_state, op, "initial_state"), output_final_state, c);
  return {wrap(r.h), wrap(r.v_new), wrap_opt(r.final_state)};
}

Tensor chunk_fwd_o(const Tensor& q, const Tensor& k, const Tensor& v_new, const Tensor& h, const Tensor& g,
                   c10::optional<double> scale, const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "chunk_fwd_o";
  const gdn::Common c = common(op, layout, cu_seqlens);
  return wrap(gdn::chunk_fwd_o(view(q, op, "q"), view(k, op, "k"), view(v_new, op, "v_new"), view(h, op, "h"),
                               view(g, op, "g"), opt_float(scale), c));
}

}  // namespace ot::py
