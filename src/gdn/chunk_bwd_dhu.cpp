// chunk_gated_delta_rule_bwd_dhu (spec 6.2): the reverse state scan, one task per (sequence, value
// head): dh[c] (gradient of the state after chunk c), dv2 = dL/dv_new, dh0.
#include <cmath>
#include <cstring>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_bwd_kernels.h"
#include "src/gdn/gdn_bwd_common.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_bwd_ref.h"

namespace ot::gdn {
using namespace detail;

BwdDhu chunk_gated_delta_rule_bwd_dhu(const TensorView& q, const TensorView& k, const TensorView& w, const TensorView& g_cumsum,
                                      const TensorView& dht, const TensorView& dO, const TensorView& dv_local, bool want_dh0,
                                      std::optional<float> scale, const Common& c) {
  const char* op = "chunk_gated_delta_rule_bwd_dhu";
  trace::OpScope scope(op);
  Tok qt = tok_vec(q, c.layout, op, "q"), kt = tok_vec(k, c.layout, op, "k"), wt = tok_vec(w, c.layout, op, "w");
  Tok Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum"), dOt = tok_vec(dO, c.layout, op, "dO"), dlt = tok_vec(dv_local, c.layout, op, "dv_local");
  expect_like_q(k, q, op);
  const int64_t HV = dOt.H, DK = qt.D, DV = dOt.D;
  expect_value_heads({{&wt, "w"}, {&Gt, "g_cumsum"}, {&dOt, "dO"}, {&dlt, "dv_local"}}, qt.B, qt.T, HV, qt.H, op);
  expect_dim(wt, DK, op, "w");
  expect_dim(dlt, DV, op, "dv_local");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, qt.B, qt.T, st, op);
  const int64_t N = s.num_seqs();
  if (dht.defined()) expect_state(dht, N, HV, DK, DV, false, op, "dht");
  const float sc = scale_or_default(scale, DK);
  BwdDhu r;
  r.dh = new_chunk_states(s, HV, DK, DV);
  r.dv2 = new_vec(c.layout, qt.packed, DType::f32, qt.B, qt.T, HV, DV);
  if (want_dh0) r.dh0 = Tensor::empty(DType::f32, {N, HV, DK, DV});
  Tok d2 = tok_vec(r.dv2, c.layout, op, "dv2");
  StateRef D0 = state_ref(r.dh0), Dt = state_ref(dht);
  float* dh = r.dh.ptr<float>();
  if (scope.active()) scope.args(dO.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(6.0 * double(qt.B * qt.T * HV) * DK * DV);
  if (cpu::force_ref()) {
    bwdref::dhu(q, k, w, g_cumsum, dht, dO, dv_local, sc, dh, r.dh0, r.dv2, c.layout, cu_of(s));
    return r;
  }
  const int64_t group = HV / qt.H;
  StageScratch scr(6, 0, 1, std::max(DK, DV), DK * DV);
  parallel_for_dynamic(N * HV, 1, [&](int64_t i0, int64_t i1) {
    const int tid = thread_id();
    float *bq = scr.row(tid, 0), *bk = scr.row(tid, 1), *bw = scr.row(tid, 2), *bo = scr.row(tid, 3), *bd = scr.row(tid, 4), *t = scr.row(tid, 5);
    float *G = scr.vec(tid, 0), *dH = scr.state(tid);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / HV, hv = i % HV, nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
      if (Dt.defined()) std::memcpy(dH, Dt.f32(n, hv), sizeof(float) * size_t(DK * DV));
      else std::memset(dH, 0, sizeof(float) * size_t(DK * DV));
      for (int64_t cc = nc - 1; cc >= 0; --cc) {
        ChunkSpan sp = chunk_span(s, n, cc);
        std::memcpy(dh + (s.chunk_id(n, cc) * HV + hv) * DK * DV, dH, sizeof(float) * size_t(DK * DV));
        load_rows(qt, sp, hv / group, bq, DK);
        load_rows(kt, sp, hv / group, bk, DK);
        load_rows(wt, sp, hv, bw, DK);
        load_rows(dOt, sp, hv, bo, DV);
        load_rows(dlt, sp, hv, bd, DV);
        load_scal(Gt, sp, hv, G);
        BwdChunk bc{sp.L, DK, DV, sc, bq, bk, nullptr, bo, G, nullptr, nullptr};
        dv2_chunk(bc, dH, bd, bd, t);
        store_rows(bd, DV, d2, sp, hv);
        dh_update_chunk(bc, dH, bw, bd, t);
      }
      if (D0.defined()) std::memcpy(D0.f32(n, hv), dH, sizeof(float) * size_t(DK * DV));
    }
  });
  return r;
}

}  // namespace ot::gdn
