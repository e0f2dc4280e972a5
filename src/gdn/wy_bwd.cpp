// prepare_wy_repr_bwd (spec 6.4): backward through W = A diag(beta e^G) K, U = A diag(beta) V and
// A = (I + M)^-1; split (_da: dP, _full: dk, dv, dbeta, dg) and fused. One task per (chunk, value head).
#include <cmath>
#include <cstring>

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

namespace {

struct WyArgs {
  Tok k, v, beta, A, dw, du, G, dP;
  int64_t HV = 0, DK = 0, DV = 0, group = 1;
  SeqInfo st;
  const SeqInfo* s = nullptr;
};

WyArgs check(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw, const TensorView& du,
             const TensorView& g_cumsum, const TensorView* dP, const Common& c, const char* op) {
  WyArgs a;
  a.k = tok_vec(k, c.layout, op, "k"), a.v = tok_vec(v, c.layout, op, "v"), a.beta = tok_scal(beta, c.layout, op, "beta");
  a.A = tok_vec(A, c.layout, op, "A"), a.dw = tok_vec(dw, c.layout, op, "dw"), a.du = tok_vec(du, c.layout, op, "du");
  a.G = tok_scal(g_cumsum, c.layout, op, "g_cumsum");
  a.HV = a.v.H, a.DK = a.k.D, a.DV = a.v.D;
  expect_value_heads({{&a.v, "v"}, {&a.beta, "beta"}, {&a.A, "A"}, {&a.dw, "dw"}, {&a.du, "du"}, {&a.G, "g_cumsum"}}, a.k.B, a.k.T, a.HV,
                     a.k.H, op);
  a.group = a.HV / a.k.H;
  expect_dim(a.A, kChunk, op, "A");
  expect_dim(a.dw, a.DK, op, "dw");
  expect_dim(a.du, a.DV, op, "du");
  if (dP) {
    a.dP = tok_vec(*dP, c.layout, op, "dP");
    expect_value_heads({{&a.dP, "dP"}}, a.k.B, a.k.T, a.HV, a.k.H, op);
    expect_dim(a.dP, kChunk, op, "dP");
  }
  a.s = &resolve_seq(c, a.k.B, a.k.T, a.st, op);
  return a;
}

WyBwd alloc_full(const WyArgs& a, const Common& c) {
  WyBwd r;
  r.dk = new_vec(c.layout, a.k.packed, DType::f32, a.k.B, a.k.T, a.HV, a.DK);
  r.dv = new_vec(c.layout, a.k.packed, DType::f32, a.k.B, a.k.T, a.HV, a.DV);
  r.dbeta = new_scal(c.layout, a.k.packed, DType::f32, a.k.B, a.k.T, a.HV);
  r.dg = new_scal(c.layout, a.k.packed, DType::f32, a.k.B, a.k.T, a.HV);
  return r;
}

// The chunk loop shared by the three operators: `da` computes dP, `full` consumes it (from the
// tensor when !da).
void run(const WyArgs& a, bool da, bool full, const Tok& dP_out, const WyBwd* r, const Common& c, const char* op) {
  const int64_t HV = a.HV, DK = a.DK, DV = a.DV;
  Tok dk, dv, db, dg;
  if (full) {
    dk = tok_vec(r->dk, c.layout, op, "dk"), dv = tok_vec(r->dv, c.layout, op, "dv");
    db = tok_scal(r->dbeta, c.layout, op, "dbeta"), dg = tok_scal(r->dg, c.layout, op, "dg");
  }
  StageScratch scr(11, 6, 5, std::max(DK, DV), 0);
  for_chunk_heads(*a.s, HV, [&](int tid, const ChunkSpan& sp, int64_t, int64_t hv) {
    float *bk = scr.row(tid, 0), *bv = scr.row(tid, 1), *bw = scr.row(tid, 2), *bu = scr.row(tid, 3), *t = scr.row(tid, 4);
    float *X = scr.row(tid, 5), *Y = scr.row(tid, 6), *rk = scr.row(tid, 7), *rv = scr.row(tid, 8);
    float *E = scr.mat(tid, 0), *A = scr.mat(tid, 1), *P = scr.mat(tid, 2), *T1 = scr.mat(tid, 3), *T2 = scr.mat(tid, 4), *Gram = scr.mat(tid, 5);
    float *G = scr.vec(tid, 0), *beta = scr.vec(tid, 1), *rb = scr.vec(tid, 2), *rg = scr.vec(tid, 3);
    const int64_t L = sp.L;
    load_rows(a.k, sp, hv / a.group, bk, DK);
    load_rows(a.v, sp, hv, bv, DV);
    load_rows(a.dw, sp, hv, bw, DK);
    load_rows(a.du, sp, hv, bu, DV);
    load_rows(a.A, sp, hv, A, kChunk);
    load_scal(a.G, sp, hv, G);
    load_scal(a.beta, sp, hv, beta);
    decay_matrix(G, L, E);
    BwdChunk bc{L, DK, DV, 1.f, nullptr, bk, bv, nullptr, G, beta, E};
    if (full) {
      grams_chunk(nullptr, bk, L, DK, nullptr, Gram, false);
      bc.KK = Gram;
    }
    if (da) {
      wy_bwd_da_chunk(bc, A, bw, bu, P, T1, T2, t);
      if (dP_out.defined()) store_rows(P, kChunk, dP_out, sp, hv);
    } else {
      load_rows(a.dP, sp, hv, P, kChunk);
      for (int64_t x = 0; x < L; ++x)  // only the strictly lower part is dP
        for (int64_t y = x; y < kChunk; ++y) P[x * kChunk + y] = 0.f;
    }
    if (!full) return;
    wy_bwd_full_chunk(bc, A, P, bw, bu, rk, rv, rb, rg, X, Y, t);
    store_rows(rk, DK, dk, sp, hv);
    store_rows(rv, DV, dv, sp, hv);
    store_scal(rb, db, sp, hv);
    store_scal(rg, dg, sp, hv);
  });
}

double flops(const WyArgs& a, bool da, bool full) {
  const double C = kChunk, T = double(a.k.B * a.k.T * a.HV);
  return T * ((da ? 2 * C * a.DK + 2 * C * a.DV + 4 * C * C : 0) + (full ? 8 * C * a.DK + 2 * C * a.DV : 0));
}

}  // namespace

Tensor prepare_wy_repr_bwd_da(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw,
                              const TensorView& du, const TensorView& g_cumsum, const Common& c) {
  const char* op = "prepare_wy_repr_bwd_da";
  trace::OpScope scope(op);
  WyArgs a = check(k, v, beta, A, dw, du, g_cumsum, nullptr, c, op);
  Tensor dP = new_vec(c.layout, a.k.packed, DType::f32, a.k.B, a.k.T, a.HV, kChunk, true);
  Tok dPt = tok_vec(dP, c.layout, op, "dP");
  if (scope.active()) scope.args(v.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(flops(a, true, false));
  if (cpu::force_ref()) bwdref::wy_da(k, v, beta, A, dw, du, g_cumsum, dP, c.layout, cu_of(*a.s));
  else run(a, true, false, dPt, nullptr, c, op);
  return dP;
}

WyBwd prepare_wy_repr_bwd_full(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dP,
                               const TensorView& dw, const TensorView& du, const TensorView& g_cumsum, const Common& c) {
  const char* op = "prepare_wy_repr_bwd_full";
  trace::OpScope scope(op);
  WyArgs a = check(k, v, beta, A, dw, du, g_cumsum, &dP, c, op);
  WyBwd r = alloc_full(a, c);
  if (scope.active()) scope.args(v.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  scope.flops(flops(a, false, true));
  if (cpu::force_ref()) {
    bwdref::wy_full(k, v, beta, A, dP, dw, du, g_cumsum, r.dk, r.dv, r.dbeta, r.dg, c.layout, cu_of(*a.s));
    return r;
  }
  run(a, false, true, Tok{}, &r, c, op);
  return r;
}

WyBwd prepare_wy_repr_bwd(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw,
                          const TensorView& du, const TensorView& g_cumsum, const Common& c) {
  const char* op = "prepare_wy_repr_bwd";
  trace::OpScope scope(op);
  WyArgs a = check(k, v, beta, A, dw, du, g_cumsum, nullptr, c, op);
  if (cpu::force_ref()) {  // the reference of the split pair
    Tensor dP = prepare_wy_repr_bwd_da(k, v, beta, A, dw, du, g_cumsum, c);
    return prepare_wy_repr_bwd_full(k, v, beta, A, dP, dw, du, g_cumsum, c);
  }
  WyBwd r = alloc_full(a, c);
  if (scope.active()) scope.args(v.shape_str()).kernel("fast");
  scope.flops(flops(a, true, true));
  run(a, true, true, Tok{}, &r, c, op);
  return r;
}

}  // namespace ot::gdn
