// Gated DeltaNet backward ops (include/ot/gdn_bwd.h): the composition used by the autograd Function
// of ops_transformer.gdn.chunk_gated_delta_rule, and the stages under their spec names.
#include "bridge.h"
#include "gdn_args.h"
#include "ops.h"
#include "ot/gdn_bwd.h"

namespace ot::py {
using namespace gdn_args;

GdnChunkBwd chunk_gated_delta_rule_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g_cumsum,
                                       const Tensor& beta, const Tensor& dO, c10::optional<double> scale,
                                       const OptTensor& initial_state, const OptTensor& dht, bool use_qk_l2norm_in_kernel,
                                       const OptTensor& A, const OptTensor& cu_seqlens, c10::string_view layout, const OptTensor& h,
                                       const OptTensor& v_new, bool bf16_compute) {
  const char* op = "chunk_gated_delta_rule_bwd";
  gdn::ChunkBwdOptions o;
  set_common(o, op, layout, cu_seqlens);
  o.scale = opt_float(scale);
  o.initial_state = view(initial_state, op, "initial_state");
  o.dht = view(dht, op, "dht");
  o.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  o.A = view(A, op, "A");
  o.h = view(h, op, "h");
  o.v_new = view(v_new, op, "v_new");
  o.bf16_compute = bf16_compute;
  auto r = gdn::chunk_gated_delta_rule_bwd(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), view(g_cumsum, op, "g_cumsum"),
                                           view(beta, op, "beta"), view(dO, op, "dO"), o);
  return {wrap(r.dq), wrap(r.dk), wrap(r.dv), wrap(r.dg), wrap(r.dbeta), wrap_opt(r.dh0)};
}

Tensor chunk_bwd_dv_local(const Tensor& q, const Tensor& k, const Tensor& g_cumsum, const Tensor& dO, c10::optional<double> scale,
                          const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "chunk_bwd_dv_local";
  return wrap(gdn::chunk_bwd_dv_local(view(q, op, "q"), view(k, op, "k"), view(g_cumsum, op, "g_cumsum"), view(dO, op, "dO"),
                                      opt_float(scale), common(op, layout, cu_seqlens)));
}

std::tuple<Tensor, OptTensor, Tensor> chunk_gated_delta_rule_bwd_dhu(const Tensor& q, const Tensor& k, const Tensor& w,
                                                                     const Tensor& g_cumsum, const OptTensor& dht, const Tensor& dO,
                                                                     const Tensor& dv_local, bool want_dh0,
                                                                     c10::optional<double> scale, const OptTensor& cu_seqlens,
                                                                     c10::string_view layout) {
  const char* op = "chunk_gated_delta_rule_bwd_dhu";
  auto r = gdn::chunk_gated_delta_rule_bwd_dhu(view(q, op, "q"), view(k, op, "k"), view(w, op, "w"), view(g_cumsum, op, "g_cumsum"),
                                               view(dht, op, "dht"), view(dO, op, "dO"), view(dv_local, op, "dv_local"), want_dh0,
                                               opt_float(scale), common(op, layout, cu_seqlens));
  return {wrap(r.dh), wrap_opt(r.dh0), wrap(r.dv2)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> chunk_bwd_dqkwg(const Tensor& q, const Tensor& k, const Tensor& v_new, const Tensor& h,
                                                           const Tensor& g_cumsum, const Tensor& dv2, const Tensor& dO,
                                                           const Tensor& dh, c10::optional<double> scale,
                                                           const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "chunk_bwd_dqkwg";
  auto r = gdn::chunk_bwd_dqkwg(view(q, op, "q"), view(k, op, "k"), view(v_new, op, "v_new"), view(h, op, "h"),
                                view(g_cumsum, op, "g_cumsum"), view(dv2, op, "dv2"), view(dO, op, "dO"), view(dh, op, "dh"),
                                opt_float(scale), common(op, layout, cu_seqlens));
  return {wrap(r.dq), wrap(r.dk), wrap(r.dw), wrap(r.dg)};
}

Tensor prepare_wy_repr_bwd_da(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A, const Tensor& dw,
                              const Tensor& du, const Tensor& g_cumsum, const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "prepare_wy_repr_bwd_da";
  return wrap(gdn::prepare_wy_repr_bwd_da(view(k, op, "k"), view(v, op, "v"), view(beta, op, "beta"), view(A, op, "A"),
                                          view(dw, op, "dw"), view(du, op, "du"), view(g_cumsum, op, "g_cumsum"),
                                          common(op, layout, cu_seqlens)));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_wy_repr_bwd_full(const Tensor& k, const Tensor& v, const Tensor& beta,
                                                                    const Tensor& A, const Tensor& dP, const Tensor& dw,
                                                                    const Tensor& du, const Tensor& g_cumsum,
                                                                    const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "prepare_wy_repr_bwd_full";
  auto r = gdn::prepare_wy_repr_bwd_full(view(k, op, "k"), view(v, op, "v"), view(beta, op, "beta"), view(A, op, "A"),
                                         view(dP, op, "dP"), view(dw, op, "dw"), view(du, op, "du"), view(g_cumsum, op, "g_cumsum"),
                                         common(op, layout, cu_seqlens));
  return {wrap(r.dk), wrap(r.dv), wrap(r.dbeta), wrap(r.dg)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> prepare_wy_repr_bwd(const Tensor& k, const Tensor& v, const Tensor& beta, const Tensor& A,
                                                               const Tensor& dw, const Tensor& du, const Tensor& g_cumsum,
                                                               const OptTensor& cu_seqlens, c10::string_view layout) {
  const char* op = "prepare_wy_repr_bwd";
  auto r = gdn::prepare_wy_repr_bwd(view(k, op, "k"), view(v, op, "v"), view(beta, op, "beta"), view(A, op, "A"), view(dw, op, "dw"),
                                    view(du, op, "du"), view(g_cumsum, op, "g_cumsum"), common(op, layout, cu_seqlens));
  return {wrap(r.dk), wrap(r.dv), wrap(r.dbeta), wrap(r.dg)};
}

}  // namespace ot::py
