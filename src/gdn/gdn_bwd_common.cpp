#include "src/gdn/gdn_bwd_common.h"

#include <algorithm>
#include <cmath>

namespace ot::gdn::detail {

void check_bwd(BwdArgs& a, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
               const TensorView& dO, const ChunkBwdOptions& opt, bool gate_required, const char* op) {
  const Layout l = opt.layout;
  static_cast<Qkv&>(a) = read_qkv(q, k, v, l, op);
  a.dO = tok_vec(dO, l, op, "dO");
  OT_CHECK(dO.shape() == v.shape(), op, "dO", ::ot::detail::cat("the shape of o (= v) ", v.shape_str()), dO.shape_str());
  OT_CHECK(!gate_required || g.defined(), op, "g_cumsum", "the forward's chunk-local cumulative gate", "undefined");
  a.g = opt_scal(g, l, a.B, a.T, a.HV, op, gate_required ? "g_cumsum" : "g");
  OT_CHECK(beta.defined() || !gate_required, op, "beta", "a beta tensor", "undefined");
  a.beta = opt_scal(beta, l, a.B, a.T, a.HV, op, "beta");
  a.seq = &resolve_seq(opt, a.B, a.T, a.storage, op);
  const int64_t N = a.seq->num_seqs();
  if (opt.initial_state.defined()) expect_state_input(opt.initial_state, N, a.HV, a.DK, a.DV, op, "initial_state");
  if (opt.dht.defined()) expect_state(opt.dht, N, a.HV, a.DK, a.DV, false, op, "dht");
  if (opt.A.defined()) {
    a.A = tok_vec(opt.A, l, op, "A");
    expect_value_heads({{&a.A, "A"}}, a.B, a.T, a.HV, a.HK, op);
    expect_dim(a.A, kChunk, op, "A");
  }
  OT_CHECK(opt.h.defined() == opt.v_new.defined(), op, opt.h.defined() ? "v_new" : "h",
           "given together with the other (the forward's save_states outputs)", "undefined");
  if (opt.h.defined()) {
    a.h = chunk_states(opt.h, *a.seq, a.HV, a.DK, a.DV, op, "h");
    OT_CHECK(opt.v_new.dtype == DType::f32, op, "v_new", "fp32", dtype_name(opt.v_new.dtype));
    a.v_new = tok_vec(opt.v_new, l, op, "v_new");
    expect_value_heads({{&a.v_new, "v_new"}}, a.B, a.T, a.HV, a.HK, op);
    expect_dim(a.v_new, a.DV, op, "v_new");
  }
  a.scale = scale_or_default(opt.scale, a.DK);
  a.S0 = state_ref(state_f32(opt.initial_state, a.s0_f32));
  a.dht = state_ref(opt.dht);
  expect_finite(a.q, op, "q");
  expect_finite(a.k, op, "k");
  expect_finite(a.v, op, "v");
  expect_finite(a.dO, op, "dO");
  if (a.g.defined()) expect_finite(a.g, op, gate_required ? "g_cumsum" : "g");
  if (a.beta.defined()) expect_finite(a.beta, op, "beta");
  if (opt.dht.defined()) expect_finite(opt.dht, op, "dht");
  if (opt.initial_state.defined()) expect_finite(opt.initial_state, op, "initial_state");
  if (opt.h.defined()) {
    expect_finite(opt.h, op, "h");
    expect_finite(a.v_new, op, "v_new");
  }
}

ChunkBwd alloc_bwd(const BwdArgs& a, const TensorView& q, const TensorView& v, const TensorView& beta, const ChunkBwdOptions& opt) {
  const Layout l = opt.layout;
  const bool packed = a.q.packed;
  ChunkBwd r;
  r.dq = new_vec(l, packed, q.dtype, a.B, a.T, a.HK, a.DK);
  r.dk = new_vec(l, packed, q.dtype, a.B, a.T, a.HK, a.DK);
  r.dv = new_vec(l, packed, v.dtype, a.B, a.T, a.HV, a.DV);
  r.dg = new_scal(l, packed, DType::f32, a.B, a.T, a.HV);
  r.dbeta = new_scal(l, packed, beta.defined() ? beta.dtype : DType::f32, a.B, a.T, a.HV);
  if (opt.initial_state.defined()) r.dh0 = Tensor::empty(DType::f32, {a.seq->num_seqs(), a.HV, a.DK, a.DV});
  return r;
}

double bwd_flops(const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV) {
  double f = 0;
  for (int64_t id = 0; id < s.num_chunks(); ++id) {
    double C = double(chunk_span_global(s, id).L);
    f += 18 * C * C * DK + 10 * C * C * DV + 16 * C * DK * DV + 4 * C * C * C;
  }
  return f * double(HV);
}

}  // namespace ot::gdn::detail

namespace ot::gdn::detail {

StageScratch::StageScratch(int rows, int mats, int vecs, int64_t D, int64_t state) : D_(D) {
  rows_ = plan_.add<float>(size_t(rows) * size_t(kChunk * D), true);
  mats_ = plan_.add<float>(size_t(mats) * size_t(kChunk * kChunk), true);
  vecs_ = plan_.add<float>(size_t(vecs) * size_t(kChunk), true);
  state_ = plan_.add<float>(size_t(std::max<int64_t>(state, 1)), true);
  ws_ = std::make_unique<Workspace>(plan_);
}

}  // namespace ot::gdn::detail
