// chunk_gated_delta_rule_fwd_h (spec 5.6): the sequential inter-chunk state scan, one task per
// (sequence, value head); states fp32 throughout.
#include <cstring>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

FwdH chunk_gated_delta_rule_fwd_h(const TensorView& k, const TensorView& w, const TensorView& u, const TensorView& g_cumsum,
                                  const TensorView& initial_state, bool output_final_state, const Common& c) {
  const char* op = "chunk_gated_delta_rule_fwd_h";
  trace::OpScope scope(op);
  Tok kt = tok_vec(k, c.layout, op, "k"), wt = tok_vec(w, c.layout, op, "w"), ut = tok_vec(u, c.layout, op, "u");
  Tok Gt = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  int64_t HV = ut.H, DK = kt.D, DV = ut.D;
  expect_value_heads({{&wt, "w"}, {&ut, "u"}, {&Gt, "g_cumsum"}}, kt.B, kt.T, HV, kt.H, op);
  expect_dim(wt, DK, op, "w");
  SeqInfo st;
  const SeqInfo& s = resolve_seq(c, kt.B, kt.T, st, op);
  int64_t N = s.num_seqs(), group = HV / kt.H;
  if (initial_state.defined()) expect_state(initial_state, N, HV, DK, DV, false, op, "initial_state");
  FwdH r;
  r.h = new_chunk_states(s, HV, DK, DV);
  r.v_new = new_vec(c.layout, ut.packed, DType::f32, kt.B, kt.T, HV, DV);
  if (output_final_state) r.final_state = Tensor::empty(DType::f32, {N, HV, DK, DV});
  Tok vn = tok_vec(r.v_new, c.layout, op, "v_new");
  StateRef S0 = state_ref(initial_state), fin = state_ref(r.final_state);
  if (scope.active()) scope.args(u.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(4.0 * double(kt.B * kt.T * HV) * DK * DV);
  if (cpu::force_ref()) {
    refimpl::fwd_h(k, w, u, g_cumsum, initial_state, r.h.ptr<float>(), r.v_new, r.final_state, c.layout, cu_of(s));
    return r;
  }
  ChunkScratch scr(DK, DV);
  float* h = r.h.ptr<float>();
  parallel_for_dynamic(N * HV, 1, [&](int64_t i0, int64_t i1) {
    ChunkBufs b = scr.get(thread_id());
    for (int64_t i = i0; i < i1; ++i) {
      int64_t n = i / HV, hv = i % HV;
      for (int64_t d = 0; d < DK; ++d)
        for (int64_t e = 0; e < DV; ++e) b.S[d * DV + e] = S0.defined() ? S0.f32(n, hv)[d * DV + e] : 0.f;
      int64_t nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
      for (int64_t cc = 0; cc < nc; ++cc) {
        ChunkSpan sp = chunk_span(s, n, cc);
        std::memcpy(h + (s.chunk_id(n, cc) * HV + hv) * DK * DV, b.S, sizeof(float) * size_t(DK * DV));
        load_rows(kt, sp, hv / group, b.k, DK);
        load_rows(wt, sp, hv, b.w, DK);
        load_rows(ut, sp, hv, b.u, DV);
        load_scal(Gt, sp, hv, b.G);
        vnew_chunk(b.w, DK, b.u, DV, b.S, sp.L, DK, DV, b.u, DV);
        store_rows(b.u, DV, vn, sp, hv);
        state_update_chunk(b.S, b.k, DK, b.u, DV, b.G, sp.L, DK, DV, b.t);
      }
      if (fin.defined()) std::memcpy(fin.f32(n, hv), b.S, sizeof(float) * size_t(DK * DV));
    }
  });
  return r;
}

}  // namespace ot::gdn
