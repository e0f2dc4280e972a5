// chunk_fwd_o (spec 5.7): O = s diag(e^G) Q h + s (causal(E) o Q K^T) v_new per chunk.
#include <cmath>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

Tensor chunk_fwd_o(const TensorView& q, const TensorView& k, const TensorView& v_new, const TensorView& h, const TensorView& g_cumsum,
                   std::optional<float> scale, const Common& c) {
  const char* op = "chunk_fwd_o";
  trace::OpScope scope(op);
  Tok qt = tok_vec(q, c.layout, op, "q"), kt = tok_vec(k, c.layout, op, "k"), vt = tok_vec(v_new, c.layout, op, "v_new");
  Tok Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  int64_t HV = vt.H, DK = qt.D, DV = vt.D;
  expect_bt(kt, qt.B, qt.T, op, "k");
  expect_heads(kt, qt.H, op, "k");
  expect_dim(kt, DK, op, "k");
  expect_value_heads({{&vt, "v_new"}, {&Gt, "g_cumsum"}}, qt.B, qt.T, HV, qt.H, op);
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, qt.B, qt.T, st, op);
  OT_CHECK(h.defined() && h.dtype == DType::f32 && h.is_contiguous() && h.numel() == s.num_chunks() * HV * DK * DV && h.ndim == 5, op, "h",
           ::ot::detail::cat("contiguous fp32 [.., ", s.num_chunks(), " chunks, ", HV, ", ", DK, ", ", DV, "]"), h.shape_str());
  float sc = scale_or_default(scale, DK);
  Tensor out = new_vec(c.layout, vt.packed, q.dtype, qt.B, qt.T, HV, DV);
  Tok ot = tok_vec(out, c.layout, op, "o");
  int64_t group = HV / qt.H;
  const float* hp = h.ptr<float>();
  if (scope.active()) scope.args(q.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  if (cpu::force_ref()) {
    refimpl::fwd_o(q, k, v_new, hp, g_cumsum, sc, out, c.layout, cu_of(s));
    return out;
  }
  ChunkScratch scr(DK, DV);
  for_chunk_heads(s, HV, [&](int tid, const ChunkSpan& sp, int64_t id, int64_t hv) {
    ChunkBufs b = scr.get(tid);
    load_rows(qt, sp, hv / group, b.q, DK);
    load_rows(kt, sp, hv / group, b.k, DK);
    load_rows(vt, sp, hv, b.u, DV);
    load_scal(Gt, sp, hv, b.G);
    decay_matrix(b.G, sp.L, b.E);
    out_chunk(b.q, DK, b.k, DK, b.u, DV, hp + (id * HV + hv) * DK * DV, b.E, b.G, sc, sp.L, DK, DV, b.o, DV, b.t, b.M);
    store_rows(b.o, DV, ot, sp, hv);
  });
  return out;
}

}  // namespace ot::gdn
