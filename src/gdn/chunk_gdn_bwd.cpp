// chunk_gated_delta_rule_bwd (spec 6): the whole chunked backward fused per (sequence, key head).
// A task owns one sequence and one key head with its HV/HK value heads (the group), and
//   1. walks the chunks forward recomputing W, U (from the saved A), h[c] and v_new for every value
//      head of the group (spec 6, first two lines), keeping h, W and v_new of the sequence in
//      per-thread fp32 scratch (skipped when the forward saved h and v_new: W is then formed per
//      chunk in the reverse scan), then
//   2. walks them backward: per chunk, loads and normalises q and k once, forms the key head's Gram
//      products Q K^T and K K^T once, and for each value head runs dv_local, dv2 and the dH update
//      (dhu), dqkwg, the WY backward (da + full) and the reverse chunk-local cumsum for dg; dq and
//      dk are summed over the group in the chunk's fp32 rows, and the l2norm backward and their
//      stores follow at once.
// No two tasks write the same element, so no reduction pass or atomics are needed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/chunk_bwd_kernels.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gdn/gdn_bwd_common.h"

namespace ot::gdn {
using namespace detail;

namespace {

constexpr int64_t C = kChunk;

// Per-thread scratch: chunk rows, chunk matrices, and the sequence-long buffers of the group's
// value heads (per head: one state, nc chunk states h, nc chunks of W and v_new).
struct Bufs {
  float *q, *k, *v, *dO, *u, *dv2, *dqc, *dkc, *dw, *dk2, *dvc, *X, *Y, *t, *dq, *dk, *Wc, *vnc;  // C x D
  float *E, *A, *M, *P, *dP, *T1, *T2, *QK, *KK;                                      // C x C
  float *G, *beta, *rq, *rk, *dG1, *dG2, *db, *dg;                                    // C
  float *S, *h, *W, *vnew;  // group-long: S [grp][DK x DV] (the state, then dH), h, W, v_new [grp][nc][..]
};

class Scratch {
 public:
  // saved: the forward's h and v_new are given (no sequence-long h, W, v_new).
  Scratch(int64_t DK, int64_t DV, int64_t Lmax, int64_t grp, bool saved) : DK_(DK), DV_(DV), grp_(grp) {
    D_ = std::max(DK, DV);
    nc_ = saved ? 0 : (Lmax + C - 1) / C;
    rows_ = plan_.add<float>(size_t(18 * C * D_), true);
    mats_ = plan_.add<float>(size_t(9 * C * C), true);
    vecs_ = plan_.add<float>(size_t(8 * C), true);
    seq_ = plan_.add<float>(size_t(grp * (DK * DV + nc_ * DK * DV + nc_ * C * (DK + DV))), true);
    ws_ = std::make_unique<Workspace>(plan_);
  }
  Bufs get(int tid) const {
    Bufs b;
    float* r = ws_->get(rows_, tid);
    float** rows[] = {&b.q, &b.k, &b.v, &b.dO, &b.u, &b.dv2, &b.dqc, &b.dkc, &b.dw, &b.dk2, &b.dvc, &b.X, &b.Y, &b.t, &b.dq, &b.dk, &b.Wc, &b.vnc};
    for (size_t i = 0; i < std::size(rows); ++i) *rows[i] = r + i * size_t(C * D_);
    float* m = ws_->get(mats_, tid);
    float** mats[] = {&b.E, &b.A, &b.M, &b.P, &b.dP, &b.T1, &b.T2, &b.QK, &b.KK};
    for (size_t i = 0; i < std::size(mats); ++i) *mats[i] = m + i * size_t(C * C);
    float* v = ws_->get(vecs_, tid);
    float** vecs[] = {&b.G, &b.beta, &b.rq, &b.rk, &b.dG1, &b.dG2, &b.db, &b.dg};
    for (size_t i = 0; i < std::size(vecs); ++i) *vecs[i] = v + i * size_t(C);
    b.S = ws_->get(seq_, tid);
    b.h = b.S + grp_ * DK_ * DV_;
    b.W = b.h + grp_ * nc_ * DK_ * DV_;
    b.vnew = b.W + grp_ * nc_ * C * DK_;
    return b;
  }
  int64_t nc() const { return nc_; }

 private:
  int64_t DK_, DV_, grp_, D_, nc_;
  WorkspacePlan plan_;
  Slot<float> rows_, mats_, vecs_, seq_;
  std::unique_ptr<Workspace> ws_;
};

// The fp64 path: the raw gate is recovered from the chunk-local cumsum, then the token recurrence
// is differentiated exactly.
ChunkBwd bwd_ref(const BwdArgs& a, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                 const TensorView& dO, const ChunkBwdOptions& opt) {
  const SeqInfo& s = *a.seq;
  Tensor g = new_scal(opt.layout, a.q.packed, DType::f32, a.B, a.T, a.HV);
  Tok gt = tok_scal(g, opt.layout, "chunk_gated_delta_rule_bwd", "g");
  for (int64_t id = 0; id < s.num_chunks(); ++id) {
    ChunkSpan sp = chunk_span_global(s, id);
    for (int64_t h = 0; h < a.HV; ++h)
      for (int64_t i = 0; i < sp.L; ++i)
        gt.set(sp.b, sp.t0 + i, h, 0, a.g.get(sp.b, sp.t0 + i, h, 0) - (i ? a.g.get(sp.b, sp.t0 + i - 1, h, 0) : 0.0));
  }
  ChunkBwdOptions o = opt;
  o.seq = a.seq;
  return ref::recurrence_bwd(q, k, v, g, beta, dO, o);
}

}  // namespace

ChunkBwd chunk_gated_delta_rule_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g_cumsum,
                                    const TensorView& beta, const TensorView& dO, const ChunkBwdOptions& opt) {
  const char* op = "chunk_gated_delta_rule_bwd";
  trace::OpScope scope(op);
  BwdArgs a;
  check_bwd(a, q, k, v, g_cumsum, beta, dO, opt, true, op);
  const SeqInfo& s = *a.seq;
  const int64_t HV = a.HV, HK = a.HK, DK = a.DK, DV = a.DV, grp = a.group(), N = s.num_seqs();
  if (scope.active()) scope.args(shape_args(q, v, opt.layout)).kernel(cpu::force_ref() ? "ref" : gemm::kernel_name(DType::f32, DType::f32, C));
  scope.flops(bwd_flops(s, HV, DK, DV));
  if (cpu::force_ref()) return bwd_ref(a, q, k, v, beta, dO, opt);

  ChunkBwd r = alloc_bwd(a, q, v, beta, opt);
  const Layout l = opt.layout;
  Tok dqt = tok_vec(r.dq, l, op, "dq"), dkt = tok_vec(r.dk, l, op, "dk"), dvt = tok_vec(r.dv, l, op, "dv");
  Tok dgt = tok_scal(r.dg, l, op, "dg"), dbt = tok_scal(r.dbeta, l, op, "dbeta");
  StateRef dh0 = state_ref(r.dh0);
  const bool l2 = opt.use_qk_l2norm_in_kernel;
  int64_t Lmax = 1;
  for (int64_t n = 0; n < N; ++n) Lmax = std::max(Lmax, s.len[size_t(n)]);
  const bool saved = a.h != nullptr;
  const bool bf16 = opt.bf16_compute && q.dtype == DType::bf16;
  Scratch scr(DK, DV, Lmax, grp, saved);
  const int64_t NC = scr.nc();
  // Longest sequences first so ragged batches balance under the dynamic schedule.
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return s.len[size_t(x)] > s.len[size_t(y)]; });

  parallel_for_dynamic(N * HK, 1, [&](int64_t i0, int64_t i1) {
    Bufs b = scr.get(thread_id());
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t n = order[size_t(task / HK)], hk = task % HK, nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
      // The key head's rows of one chunk (normalised when asked).
      auto load_qk = [&](const ChunkSpan& sp, bool want_q) {
        if (want_q) load_rows(a.q, sp.b, sp.t0, sp.L, hk, b.q, DK);
        load_rows(a.k, sp.b, sp.t0, sp.L, hk, b.k, DK);
        if (l2) {
          if (want_q) l2norm_rows(b.q, DK, sp.L, DK, 1e-6f, b.rq);
          l2norm_rows(b.k, DK, sp.L, DK, 1e-6f, b.rk);
        }
      };
      // One value head's v, gates, beta, decay matrix and A of the chunk.
      auto load_head = [&](const ChunkSpan& sp, int64_t hv) {
        const int64_t L = sp.L;
        load_rows(a.v, sp.b, sp.t0, L, hv, b.v, DV);
        load_scal(a.g, sp.b, sp.t0, L, hv, b.G);
        load_scal(a.beta, sp.b, sp.t0, L, hv, b.beta);
        decay_matrix(b.G, L, b.E);
        if (a.A.defined()) {
          load_rows(a.A, sp.b, sp.t0, L, hv, b.A, C);
        } else {
          kkt_chunk(b.k, DK, L, DK, b.beta, b.E, b.M);
          solve_tril_chunk(b.M, C, L, b.A, C);
        }
      };
      // 1. Forward recompute: W, U, h[c], v_new of every value head of the group.
      for (int64_t j = 0; j < grp && !saved; ++j) {
        float* S = b.S + j * DK * DV;
        if (a.S0.defined()) std::memcpy(S, a.S0.f32(n, hk * grp + j), sizeof(float) * size_t(DK * DV));
        else std::memset(S, 0, sizeof(float) * size_t(DK * DV));
      }
      for (int64_t c = 0; c < nc && !saved; ++c) {
        ChunkSpan sp = chunk_span(s, n, c);
        load_qk(sp, false);
        for (int64_t j = 0; j < grp; ++j) {
          load_head(sp, hk * grp + j);
          float *S = b.S + j * DK * DV, *W = b.W + (j * NC + c) * C * DK, *vn = b.vnew + (j * NC + c) * C * DV;
          wu_chunk(b.A, C, b.k, DK, b.v, DV, b.beta, b.G, sp.L, DK, DV, W, DK, b.u, DV, b.t);
          std::memcpy(b.h + (j * NC + c) * DK * DV, S, sizeof(float) * size_t(DK * DV));
          vnew_chunk(W, DK, b.u, DV, S, sp.L, DK, DV, vn, DV);
          state_update_chunk(S, b.k, DK, vn, DV, b.G, sp.L, DK, DV, b.t);
        }
      }
      // 2. Reverse scan; b.S now holds each value head's dH.
      for (int64_t j = 0; j < grp; ++j) {
        float* dH = b.S + j * DK * DV;
        if (a.dht.defined()) std::memcpy(dH, a.dht.f32(n, hk * grp + j), sizeof(float) * size_t(DK * DV));
        else std::memset(dH, 0, sizeof(float) * size_t(DK * DV));
      }
      for (int64_t c = nc - 1; c >= 0; --c) {
        ChunkSpan sp = chunk_span(s, n, c);
        const int64_t L = sp.L;
        load_qk(sp, true);
        grams_chunk(b.q, b.k, L, DK, b.QK, b.KK, bf16);
        std::memset(b.dq, 0, sizeof(float) * size_t(L * DK));
        std::memset(b.dk, 0, sizeof(float) * size_t(L * DK));
        for (int64_t j = 0; j < grp; ++j) {
          const int64_t hv = hk * grp + j;
          load_head(sp, hv);
          load_rows(a.dO, sp.b, sp.t0, L, hv, b.dO, DV);
          BwdChunk bc{L, DK, DV, a.scale, b.q, b.k, b.v, b.dO, b.G, b.beta, b.E, b.QK, b.KK, bf16};
          float* dH = b.S + j * DK * DV;
          const float *W, *vn, *hc;
          if (saved) {
            w_chunk(bc, b.A, b.Wc, b.t);
            load_rows(a.v_new, sp.b, sp.t0, L, hv, b.vnc, DV);
            W = b.Wc, vn = b.vnc, hc = a.h + (s.chunk_id(n, c) * HV + hv) * DK * DV;
          } else {
            W = b.W + (j * NC + c) * C * DK, vn = b.vnew + (j * NC + c) * C * DV, hc = b.h + (j * NC + c) * DK * DV;
          }
          dv_local_chunk(bc, b.dv2, b.P);
          dv2_chunk(bc, dH, b.dv2, b.dv2, b.t);
          dqkwg_chunk(bc, vn, hc, dH, b.dv2, b.dqc, b.dkc, b.dw, b.dG1, b.P);
          dh_update_chunk(bc, dH, W, b.dv2, b.t);
          wy_bwd_da_chunk(bc, b.A, b.dw, b.dv2, b.dP, b.T1, b.T2, b.t);
          wy_bwd_full_chunk(bc, b.A, b.dP, b.dw, b.dv2, b.dk2, b.dvc, b.db, b.dG2, b.X, b.Y, b.t);
          for (int64_t i = 0; i < L * DK; ++i) b.dq[i] += b.dqc[i], b.dk[i] += b.dkc[i] + b.dk2[i];
          for (int64_t i = 0; i < L; ++i) b.dG1[i] += b.dG2[i];
          cumsum_chunk(b.dG1, L, b.dg, true, 1.f);
          store_rows(b.dvc, DV, dvt, sp.b, sp.t0, L, hv);
          store_scal(b.db, dbt, sp.b, sp.t0, L, hv);
          store_scal(b.dg, dgt, sp.b, sp.t0, L, hv);
        }
        // 3. The l2norm backward of the group-summed gradients (q, k and their norms still loaded).
        if (l2) {
          l2norm_bwd_rows(b.q, b.rq, b.dq, L, DK);
          l2norm_bwd_rows(b.k, b.rk, b.dk, L, DK);
        }
        store_rows(b.dq, DK, dqt, sp.b, sp.t0, L, hk);
        store_rows(b.dk, DK, dkt, sp.b, sp.t0, L, hk);
      }
      if (dh0.defined())  // dht itself for an empty sequence
        for (int64_t j = 0; j < grp; ++j) std::memcpy(dh0.f32(n, hk * grp + j), b.S + j * DK * DV, sizeof(float) * size_t(DK * DV));
    }
  });
  return r;
}

}  // namespace ot::gdn
