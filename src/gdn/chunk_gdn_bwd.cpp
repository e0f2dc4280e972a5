// chunk_gated_delta_rule_bwd (spec 6): the whole chunked backward fused per (sequence, key head).
// A task owns one sequence and one key head; for each of the key head's value heads it
//   1. walks the chunks forward recomputing W, U (from the saved A), h[c] and v_new (spec 6, first
//      two lines), keeping h, W and v_new of the sequence in per-thread fp32 scratch, then
//   2. walks them backward: dv_local, dv2 and the dH update (dhu), dqkwg, the WY backward (da +
//      full), the reverse chunk-local cumsum for dg,
// accumulating dq, dk over the group in fp32, then applies the l2norm backward once per key head.
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

// Per-thread scratch: chunk rows, chunk matrices, and the sequence-long buffers of one value head.
struct Bufs {
  float *q, *k, *v, *dO, *u, *dv2, *dqc, *dkc, *dw, *dk2, *dvc, *X, *Y, *t;  // C x D
  float *E, *A, *M, *P, *dP, *T1, *T2, *Gram;                               // C x C
  float *G, *beta, *rq, *rk, *dG1, *dG2, *db, *dg;                          // C
  float *S, *dH;                                                           // DK x DV
  float *h, *W, *vnew, *dq, *dk;                                           // sequence long
};

class Scratch {
 public:
  Scratch(int64_t DK, int64_t DV, int64_t Lmax) : DK_(DK), DV_(DV), Lmax_(Lmax) {
    D_ = std::max(DK, DV);
    nc_ = (Lmax + C - 1) / C;
    rows_ = plan_.add<float>(size_t(14 * C * D_), true);
    mats_ = plan_.add<float>(size_t(8 * C * C), true);
    vecs_ = plan_.add<float>(size_t(8 * C), true);
    states_ = plan_.add<float>(size_t(2 * DK * DV), true);
    seq_ = plan_.add<float>(size_t(nc_ * DK * DV + nc_ * C * (3 * DK + DV)), true);
    ws_ = std::make_unique<Workspace>(plan_);
  }
  Bufs get(int tid) const {
    Bufs b;
    float* r = ws_->get(rows_, tid);
    float** rows[] = {&b.q, &b.k, &b.v, &b.dO, &b.u, &b.dv2, &b.dqc, &b.dkc, &b.dw, &b.dk2, &b.dvc, &b.X, &b.Y, &b.t};
    for (size_t i = 0; i < std::size(rows); ++i) *rows[i] = r + i * size_t(C * D_);
    float* m = ws_->get(mats_, tid);
    float** mats[] = {&b.E, &b.A, &b.M, &b.P, &b.dP, &b.T1, &b.T2, &b.Gram};
    for (size_t i = 0; i < std::size(mats); ++i) *mats[i] = m + i * size_t(C * C);
    float* v = ws_->get(vecs_, tid);
    float** vecs[] = {&b.G, &b.beta, &b.rq, &b.rk, &b.dG1, &b.dG2, &b.db, &b.dg};
    for (size_t i = 0; i < std::size(vecs); ++i) *vecs[i] = v + i * size_t(C);
    b.S = ws_->get(states_, tid);
    b.dH = b.S + DK_ * DV_;
    b.h = ws_->get(seq_, tid);
    b.W = b.h + nc_ * DK_ * DV_;
    b.vnew = b.W + nc_ * C * DK_;
    b.dq = b.vnew + nc_ * C * DV_;
    b.dk = b.dq + nc_ * C * DK_;
    return b;
  }

 private:
  int64_t DK_, DV_, Lmax_, D_, nc_;
  WorkspacePlan plan_;
  Slot<float> rows_, mats_, vecs_, states_, seq_;
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
  Scratch scr(DK, DV, Lmax);
  // Longest sequences first so ragged batches balance under the dynamic schedule.
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return s.len[size_t(x)] > s.len[size_t(y)]; });

  parallel_for_dynamic(N * HK, 1, [&](int64_t i0, int64_t i1) {
    Bufs b = scr.get(thread_id());
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t n = order[size_t(task / HK)], hk = task % HK, nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
      const int64_t len = s.len[size_t(n)];
      std::memset(b.dq, 0, sizeof(float) * size_t(len * DK));
      std::memset(b.dk, 0, sizeof(float) * size_t(len * DK));
      // Loads one chunk's q/k (normalised when asked), v, gates, beta, decay matrix and A.
      auto load = [&](const ChunkSpan& sp, int64_t hv, bool want_q, BwdChunk& bc) {
        const int64_t L = sp.L;
        if (want_q) load_rows(a.q, sp.b, sp.t0, L, hk, b.q, DK);
        load_rows(a.k, sp.b, sp.t0, L, hk, b.k, DK);
        if (l2) {
          if (want_q) l2norm_rows(b.q, DK, L, DK, 1e-6f, b.rq);
          l2norm_rows(b.k, DK, L, DK, 1e-6f, b.rk);
        }
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
        bc = BwdChunk{L, DK, DV, a.scale, b.q, b.k, b.v, b.dO, b.G, b.beta, b.E};
      };
      for (int64_t hv = hk * grp; hv < (hk + 1) * grp; ++hv) {
        // 1. Forward recompute: W, U, h[c], v_new.
        if (a.S0.defined()) std::memcpy(b.S, a.S0.f32(n, hv), sizeof(float) * size_t(DK * DV));
        else std::memset(b.S, 0, sizeof(float) * size_t(DK * DV));
        for (int64_t c = 0; c < nc; ++c) {
          ChunkSpan sp = chunk_span(s, n, c);
          BwdChunk bc;
          load(sp, hv, false, bc);
          float *W = b.W + c * C * DK, *vn = b.vnew + c * C * DV;
          wu_chunk(b.A, C, b.k, DK, b.v, DV, b.beta, b.G, sp.L, DK, DV, W, DK, b.u, DV, b.t);
          std::memcpy(b.h + c * DK * DV, b.S, sizeof(float) * size_t(DK * DV));
          vnew_chunk(W, DK, b.u, DV, b.S, sp.L, DK, DV, vn, DV);
          state_update_chunk(b.S, b.k, DK, vn, DV, b.G, sp.L, DK, DV, b.t);
        }
        // 2. Reverse scan.
        if (a.dht.defined()) std::memcpy(b.dH, a.dht.f32(n, hv), sizeof(float) * size_t(DK * DV));
        else std::memset(b.dH, 0, sizeof(float) * size_t(DK * DV));
        for (int64_t c = nc - 1; c >= 0; --c) {
          ChunkSpan sp = chunk_span(s, n, c);
          const int64_t L = sp.L;
          BwdChunk bc;
          load(sp, hv, true, bc);
          load_rows(a.dO, sp.b, sp.t0, L, hv, b.dO, DV);
          const float *W = b.W + c * C * DK, *vn = b.vnew + c * C * DV, *hc = b.h + c * DK * DV;
          dv_local_chunk(bc, b.dv2, b.P);
          dv2_chunk(bc, b.dH, b.dv2, b.dv2, b.t);
          dqkwg_chunk(bc, vn, hc, b.dH, b.dv2, b.dqc, b.dkc, b.dw, b.dG1, b.P, b.T1);
          dh_update_chunk(bc, b.dH, W, b.dv2, b.t);
          wy_bwd_da_chunk(bc, b.A, b.dw, b.dv2, b.dP, b.T1, b.T2, b.t);
          wy_bwd_full_chunk(bc, b.A, b.dP, b.dw, b.dv2, b.dk2, b.dvc, b.db, b.dG2, b.Gram, b.X, b.Y, b.t);
          float *dq = b.dq + c * C * DK, *dk = b.dk + c * C * DK;
          for (int64_t i = 0; i < L * DK; ++i) dq[i] += b.dqc[i], dk[i] += b.dkc[i] + b.dk2[i];
          for (int64_t i = 0; i < L; ++i) b.dG1[i] += b.dG2[i];
          cumsum_chunk(b.dG1, L, b.dg, true, 1.f);
          store_rows(b.dvc, DV, dvt, sp.b, sp.t0, L, hv);
          store_scal(b.db, dbt, sp.b, sp.t0, L, hv);
          store_scal(b.dg, dgt, sp.b, sp.t0, L, hv);
        }
        if (dh0.defined()) std::memcpy(dh0.f32(n, hv), b.dH,  // dht itself for an empty sequence
                                        sizeof(float) * size_t(DK * DV));
      }
      // 3. l2norm backward of the group-summed gradients, and the stores.
      for (int64_t c = 0; c < nc; ++c) {
        ChunkSpan sp = chunk_span(s, n, c);
        float *dq = b.dq + c * C * DK, *dk = b.dk + c * C * DK;
        if (l2) {
          load_rows(a.q, sp.b, sp.t0, sp.L, hk, b.q, DK);
          load_rows(a.k, sp.b, sp.t0, sp.L, hk, b.k, DK);
          l2norm_rows(b.q, DK, sp.L, DK, 1e-6f, b.rq);
          l2norm_rows(b.k, DK, sp.L, DK, 1e-6f, b.rk);
          l2norm_bwd_rows(b.q, b.rq, dq, sp.L, DK);
          l2norm_bwd_rows(b.k, b.rk, dk, sp.L, DK);
        }
        store_rows(dq, DK, dqt, sp.b, sp.t0, sp.L, hk);
        store_rows(dk, DK, dkt, sp.b, sp.t0, sp.L, hk);
      }
    }
  });
  return r;
}

}  // namespace ot::gdn
