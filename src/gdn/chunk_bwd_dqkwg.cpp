// chunk_bwd_dqkwg (spec 6.3): dq, dk (output and state paths), dw and the cumulative-gate gradient,
// per value head, one task per (chunk, value head).
#include <cmath>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_bwd_kernels.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/gdn_bwd_common.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_bwd_ref.h"

namespace ot::gdn {
using namespace detail;

BwdDqkwg chunk_bwd_dqkwg(const TensorView& q, const TensorView& k, const TensorView& v_new, const TensorView& h, const TensorView& g_cumsum,
                         const TensorView& dv2, const TensorView& dO, const TensorView& dh, std::optional<float> scale, const Common& c) {
  const char* op = "chunk_bwd_dqkwg";
  trace::OpScope scope(op);
  Tok qt = tok_vec(q, c.layout, op, "q"), kt = tok_vec(k, c.layout, op, "k"), vt = tok_vec(v_new, c.layout, op, "v_new");
  Tok Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum"), d2 = tok_vec(dv2, c.layout, op, "dv2"), dOt = tok_vec(dO, c.layout, op, "dO");
  expect_like_q(k, q, op);
  const int64_t HV = vt.H, DK = qt.D, DV = vt.D;
  expect_value_heads({{&vt, "v_new"}, {&Gt, "g_cumsum"}, {&d2, "dv2"}, {&dOt, "dO"}}, qt.B, qt.T, HV, qt.H, op);
  expect_dim(d2, DV, op, "dv2");
  expect_dim(dOt, DV, op, "dO");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, qt.B, qt.T, st, op);
  const float* hp = chunk_states(h, s, HV, DK, DV, op, "h");
  const float* dhp = chunk_states(dh, s, HV, DK, DV, op, "dh");
  const float sc = scale_or_default(scale, DK);
  BwdDqkwg r;
  for (Tensor* x : {&r.dq, &r.dk, &r.dw}) *x = new_vec(c.layout, qt.packed, DType::f32, qt.B, qt.T, HV, DK);
  r.dg = new_scal(c.layout, qt.packed, DType::f32, qt.B, qt.T, HV);
  Tok dq = tok_vec(r.dq, c.layout, op, "dq"), dk = tok_vec(r.dk, c.layout, op, "dk"), dw = tok_vec(r.dw, c.layout, op, "dw");
  Tok dg = tok_scal(r.dg, c.layout, op, "dg");
  if (scope.active()) scope.args(v_new.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(double(qt.B * qt.T * HV) * (6.0 * DK * DV + 4.0 * kChunk * DK + 2.0 * kChunk * DV));
  if (cpu::force_ref()) {
    bwdref::dqkwg(q, k, v_new, hp, g_cumsum, dv2, dO, dhp, sc, r.dq, r.dk, r.dw, r.dg, c.layout, cu_of(s));
    return r;
  }
  const int64_t group = HV / qt.H;
  StageScratch scr(8, 3, 2, std::max(DK, DV), 0);
  for_chunk_heads(s, HV, [&](int tid, const ChunkSpan& sp, int64_t id, int64_t hv) {
    float *bq = scr.row(tid, 0), *bk = scr.row(tid, 1), *bv = scr.row(tid, 2), *b2 = scr.row(tid, 3), *bo = scr.row(tid, 4);
    float *rq = scr.row(tid, 5), *rk = scr.row(tid, 6), *rw = scr.row(tid, 7);
    float *E = scr.mat(tid, 0), *P = scr.mat(tid, 1), *QK = scr.mat(tid, 2), *G = scr.vec(tid, 0), *rg = scr.vec(tid, 1);
    load_rows(qt, sp, hv / group, bq, DK);
    load_rows(kt, sp, hv / group, bk, DK);
    load_rows(vt, sp, hv, bv, DV);
    load_rows(d2, sp, hv, b2, DV);
    load_rows(dOt, sp, hv, bo, DV);
    load_scal(Gt, sp, hv, G);
    decay_matrix(G, sp.L, E);
    const size_t off = size_t((id * HV + hv) * DK * DV);
    grams_chunk(bq, bk, sp.L, DK, QK, nullptr, false);
    dqkwg_chunk(BwdChunk{sp.L, DK, DV, sc, bq, bk, nullptr, bo, G, nullptr, E, QK}, bv, hp + off, dhp + off, b2, rq, rk, rw, rg, P);
    store_rows(rq, DK, dq, sp, hv);
    store_rows(rk, DK, dk, sp, hv);
    store_rows(rw, DK, dw, sp, hv);
    store_scal(rg, dg, sp, hv);
  });
  return r;
}

}  // namespace ot::gdn
