// solve_tril (spec 5.4): A = (I + M)^-1 per chunk by row-wise forward substitution.
#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

Tensor solve_tril(const TensorView& M, const Common& c) {
  const char* op = "solve_tril";
  trace::OpScope scope(op);
  Tok Mt = tok_vec(M, c.layout, op, "M");
  expect_dim(Mt, kChunk, op, "M");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, Mt.B, Mt.T, st, op);
  Tensor out = new_vec(c.layout, Mt.packed, DType::f32, Mt.B, Mt.T, Mt.H, kChunk, true);
  Tok At = tok_vec(out, c.layout, op, "A");
  if (scope.active()) scope.args(M.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  if (cpu::force_ref()) {
    refimpl::solve_tril(M, out, c.layout, cu_of(s));
    return out;
  }
  ChunkScratch scr(1, 1);
  for_chunk_heads(s, Mt.H, [&](int tid, const ChunkSpan& sp, int64_t, int64_t h) {
    ChunkBufs w = scr.get(tid);
    load_rows(Mt, sp, h, w.M, kChunk);
    solve_tril_chunk(w.M, kChunk, sp.L, w.A, kChunk);
    store_rows(w.A, kChunk, At, sp, h);
  });
  return out;
}

}  // namespace ot::gdn
