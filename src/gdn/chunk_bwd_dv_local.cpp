// chunk_bwd_dv_local (spec 6.1): the intra-chunk part of dL/dv_new, one task per (chunk, value head).
#include <cmath>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_bwd_kernels.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/gdn_bwd_common.h"
#include "src/gdn/gdn_bwd_ref.h"

namespace ot::gdn {
using namespace detail;

Tensor chunk_bwd_dv_local(const TensorView& q, const TensorView& k, const TensorView& g_cumsum, const TensorView& dO,
                          std::optional<float> scale, const Common& c) {
  const char* op = "chunk_bwd_dv_local";
  trace::OpScope scope(op);
  Tok qt = tok_vec(q, c.layout, op, "q"), kt = tok_vec(k, c.layout, op, "k"), Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  Tok dOt = tok_vec(dO, c.layout, op, "dO");
  OT_CHECK(k.shape() == q.shape(), op, "k", ::ot::detail::cat("the shape of q ", q.shape_str()), k.shape_str());
  const int64_t HV = dOt.H, DK = qt.D, DV = dOt.D;
  expect_bt(dOt, qt.B, qt.T, op, "dO");
  expect_groups(HV, qt.H, op);
  expect_bt(Gt, qt.B, qt.T, op, "g_cumsum");
  expect_heads(Gt, HV, op, "g_cumsum");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, qt.B, qt.T, st, op);
  const float sc = scale ? *scale : 1.f / std::sqrt(float(DK));
  Tensor out = new_vec(c.layout, qt.packed, DType::f32, qt.B, qt.T, HV, DV);
  Tok ot = tok_vec(out, c.layout, op, "dv_local");
  scope.args(dO.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast").flops(2.0 * double(qt.B * qt.T * HV) * kChunk * (DK + DV));
  if (cpu::force_ref()) {
    bwdref::dv_local(qt, kt, Gt, dOt, sc, ot, s);
    return out;
  }
  const int64_t group = HV / qt.H;
  StageScratch scr(4, 2, 1, std::max(DK, DV), 0);
  parallel_for_dynamic(s.num_chunks() * HV, 0, [&](int64_t i0, int64_t i1) {
    const int tid = thread_id();
    float *bq = scr.row(tid, 0), *bk = scr.row(tid, 1), *bo = scr.row(tid, 2), *res = scr.row(tid, 3);
    float *E = scr.mat(tid, 0), *P = scr.mat(tid, 1), *G = scr.vec(tid, 0);
    for (int64_t i = i0; i < i1; ++i) {
      ChunkSpan sp = chunk_span_global(s, i / HV);
      const int64_t hv = i % HV;
      load_rows(qt, sp.b, sp.t0, sp.L, hv / group, bq, DK);
      load_rows(kt, sp.b, sp.t0, sp.L, hv / group, bk, DK);
      load_rows(dOt, sp.b, sp.t0, sp.L, hv, bo, DV);
      load_scal(Gt, sp.b, sp.t0, sp.L, hv, G);
      decay_matrix(G, sp.L, E);
      dv_local_chunk(BwdChunk{sp.L, DK, DV, sc, bq, bk, nullptr, bo, G, nullptr, E}, res, P);
      store_rows(res, DV, ot, sp.b, sp.t0, sp.L, hv);
    }
  });
  return out;
}

}  // namespace ot::gdn
