// chunk_scaled_dot_kkt_fwd (spec 5.3): M = strict(diag(beta) K K^T o exp(G_i - G_j)) per chunk.
#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

Tensor chunk_scaled_dot_kkt_fwd(const TensorView& k, const TensorView& g_cumsum, const TensorView& beta, const Common& c) {
  const char* op = "chunk_scaled_dot_kkt_fwd";
  trace::OpScope scope(op);
  Tok kt = tok_vec(k, c.layout, op, "k"), Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum"), bt = tok_scal(beta, c.layout, op, "beta");
  expect_bt(Gt, kt.B, kt.T, op, "g_cumsum");
  expect_bt(bt, kt.B, kt.T, op, "beta");
  expect_heads(bt, Gt.H, op, "beta");
  expect_groups(Gt.H, kt.H, op);
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, kt.B, kt.T, st, op);
  int64_t HV = Gt.H, group = HV / kt.H, DK = kt.D;
  Tensor out = new_vec(c.layout, kt.packed, DType::f32, kt.B, kt.T, HV, kChunk, true);
  Tok Mt = tok_vec(out, c.layout, op, "M");
  if (scope.active()) scope.args(k.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(2.0 * double(kt.B * kt.T * HV) * kChunk * DK);
  if (cpu::force_ref()) {
    refimpl::kkt(k, g_cumsum, beta, out, c.layout, cu_of(s));
    return out;
  }
  ChunkScratch scr(DK, 1);
  for_chunk_heads(s, HV, [&](int tid, const ChunkSpan& sp, int64_t, int64_t h) {
    ChunkBufs w = scr.get(tid);
    load_rows(kt, sp, h / group, w.k, DK);
    load_scal(Gt, sp, h, w.G);
    load_scal(bt, sp, h, w.beta);
    decay_matrix(w.G, sp.L, w.E);
    kkt_chunk(w.k, DK, sp.L, DK, w.beta, w.E, w.M);
    store_rows(w.M, kChunk, Mt, sp, h);
  });
  return out;
}

}  // namespace ot::gdn
