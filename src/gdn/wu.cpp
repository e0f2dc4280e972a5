// recompute_w_u_fwd (spec 5.5): W = A diag(beta e^G) K, U = A diag(beta) V per chunk.
#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

WU recompute_w_u_fwd(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& g_cumsum,
                     const Common& c) {
  const char* op = "recompute_w_u_fwd";
  trace::OpScope scope(op);
  Tok kt = tok_vec(k, c.layout, op, "k"), vt = tok_vec(v, c.layout, op, "v"), bt = tok_scal(beta, c.layout, op, "beta");
  Tok At = tok_vec(A, c.layout, op, "A"), Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  int64_t HV = vt.H, DK = kt.D, DV = vt.D;
  expect_value_heads({{&vt, "v"}, {&bt, "beta"}, {&At, "A"}, {&Gt, "g_cumsum"}}, kt.B, kt.T, HV, kt.H, op);
  expect_dim(At, kChunk, op, "A");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, kt.B, kt.T, st, op);
  int64_t group = HV / kt.H;
  WU r{new_vec(c.layout, kt.packed, DType::f32, kt.B, kt.T, HV, DK), new_vec(c.layout, kt.packed, DType::f32, kt.B, kt.T, HV, DV)};
  Tok wt = tok_vec(r.w, c.layout, op, "w"), ut = tok_vec(r.u, c.layout, op, "u");
  if (scope.active()) scope.args(v.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(2.0 * double(kt.B * kt.T * HV) * kChunk * (DK + DV));
  if (cpu::force_ref()) {
    refimpl::wu(k, v, beta, A, g_cumsum, r.w, r.u, c.layout, cu_of(s));
    return r;
  }
  ChunkScratch scr(DK, DV);
  for_chunk_heads(s, HV, [&](int tid, const ChunkSpan& sp, int64_t, int64_t h) {
    ChunkBufs w = scr.get(tid);
    load_rows(kt, sp, h / group, w.k, DK);
    load_rows(vt, sp, h, w.v, DV);
    load_rows(At, sp, h, w.A, kChunk);
    load_scal(Gt, sp, h, w.G);
    load_scal(bt, sp, h, w.beta);
    wu_chunk(w.A, kChunk, w.k, DK, w.v, DV, w.beta, w.G, sp.L, DK, DV, w.w, DK, w.u, DV, w.t);
    store_rows(w.w, DK, wt, sp, h);
    store_rows(w.u, DV, ut, sp, h);
  });
  return r;
}

}  // namespace ot::gdn
