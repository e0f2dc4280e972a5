// chunk_bwd_dv_local (spec 6.1): the intra-chunk part of dL/dv_new, one task per (chunk, value head).
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

Tensor chunk_bwd_dv_local(const TensorView& q, const TensorView& k, const TensorView& g_cumsum, const TensorView& dO,
                          std::optional<float> scale, const Common& c) {
  const char* op = "chunk_bwd_dv_local";
  trace::OpScope scope(op);
  Tok qt = tok_vec(q, c.layout, op, "q"), kt = tok_vec(k, c.layout, op, "k"), Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  Tok dOt = tok_vec(dO, c.layout, op, "dO");
  expect_like_q(k, q, op);
  const int64_t HV = dOt.H, DK = qt.D, DV = dOt.D;
  expect_value_heads({{&dOt, "dO"}, {&Gt, "g_cumsum"}}, qt.B, qt.T, HV, qt.H, op);
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, qt.B, qt.T, st, op);
  const float sc = scale_or_default(scale, DK);
  Tensor out = new_vec(c.layout, qt.packed, DType::f32, qt.B, qt.T, HV, DV);
  Tok ot = tok_vec(out, c.layout, op, "dv_local");
  if (scope.active()) scope.args(dO.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(2.0 * double(qt.B * qt.T * HV) * kChunk * (DK + DV));
  if (cpu::force_ref()) {
    bwdref::dv_local(q, k, g_cumsum, dO, sc, out, c.layout, cu_of(s));
    return out;
  }
  const int64_t group = HV / qt.H;
  StageScratch scr(4, 3, 1, std::max(DK, DV), 0);
  for_chunk_heads(s, HV, [&](int tid, const ChunkSpan& sp, int64_t, int64_t hv) {
    float *bq = scr.row(tid, 0), *bk = scr.row(tid, 1), *bo = scr.row(tid, 2), *res = scr.row(tid, 3);
    float *E = scr.mat(tid, 0), *P = scr.mat(tid, 1), *QK = scr.mat(tid, 2), *G = scr.vec(tid, 0);
    load_rows(qt, sp, hv / group, bq, DK);
    load_rows(kt, sp, hv / group, bk, DK);
    load_rows(dOt, sp, hv, bo, DV);
    load_scal(Gt, sp, hv, G);
    decay_matrix(G, sp.L, E);
    grams_chunk(bq, bk, sp.L, DK, QK, nullptr, false);
    dv_local_chunk(BwdChunk{sp.L, DK, DV, sc, bq, bk, nullptr, bo, G, nullptr, E, QK}, res, P);
    store_rows(res, DV, ot, sp, hv);
  });
  return out;
}

}  // namespace ot::gdn
