// chunk_local_cumsum (spec 5.2): forward prefix sums for the forward pass, reverse suffix sums for
// turning dG into dg in the backward. One implementation for both directions.
#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

Tensor chunk_local_cumsum(const TensorView& g, bool reverse, float scale, const Common& c) {
  const char* op = "chunk_local_cumsum";
  trace::OpScope scope(op);
  Tok gt = tok_scal(g, c.layout, op, "g");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, gt.B, gt.T, st, op);
  Tensor out = new_scal(c.layout, gt.packed, DType::f32, gt.B, gt.T, gt.H);
  Tok ot = tok_scal(out, c.layout, op, "out");
  if (scope.active()) scope.args(g.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  if (cpu::force_ref()) {
    refimpl::cumsum(g, out, c.layout, cu_of(s), reverse, scale);
    return out;
  }
  parallel_for(s.num_chunks() * gt.H, [&](int64_t i0, int64_t i1) {
    float g1[kChunk], G1[kChunk];
    for (int64_t i = i0; i < i1; ++i) {
      ChunkSpan sp = chunk_span_global(s, i / gt.H);
      int64_t h = i % gt.H;
      load_scal(gt, sp.b, sp.t0, sp.L, h, g1);
      cumsum_chunk(g1, sp.L, G1, reverse, scale);
      store_scal(G1, ot, sp.b, sp.t0, sp.L, h);
    }
  });
  return out;
}

}  // namespace ot::gdn
