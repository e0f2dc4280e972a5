// fp64 ground truth of the GDN backward: the token recurrence (spec section 3) and its reverse mode.
//
// Forward, per token t (q, k already l2-normalised when asked):
//   Sh = a S_{t-1} (a = e^g),  p = Sh^T k,  d = beta (v - p),  S_t = Sh + k d^T,  o = s S_t^T q
// Reverse, with dS = dL/dS_t (seeded by dST):
//   dS += s q dO^T;  dq = s S_t dO;  dk = dS d;  dd = dS^T k
//   dbeta = dd.(v - p);  dv = beta dd;  dp = -beta dd
//   dSh = dS + k dp^T;  dk += Sh dp;  dg = a <dSh, S_{t-1}>;  dS_{t-1} = a dSh
// States are checkpointed every kSeg tokens and recomputed one segment at a time, so memory stays
// at kSeg states whatever L is.
#include "src/ref/gdn_bwd_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/ref/gdn_ref_views.h"

namespace ot::gdn::bwdref {

using std::vector;

namespace {

constexpr int64_t kSeg = 64;
constexpr double kEps = 1e-6;  // inside the square root, as the forward's l2norm

// Normalised rows (or a copy) and their 1/norm.
void prep_rows(const double* x, int64_t L, int64_t D, bool l2, vector<double>& y, vector<double>& r) {
  y.assign(x, x + L * D);
  r.assign(static_cast<size_t>(L), 1.0);
  if (!l2) return;
  for (int64_t t = 0; t < L; ++t) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += x[t * D + d] * x[t * D + d];
    r[size_t(t)] = 1.0 / std::sqrt(ss + kEps);
    for (int64_t d = 0; d < D; ++d) y[size_t(t * D + d)] *= r[size_t(t)];
  }
}

// One token of the recurrence: S (in: S_{t-1}, out: S_t); p and d receive Sh^T k and the delta.
void step(double* S, const double* k, const double* v, double beta, double a, int64_t K, int64_t V, double* p, double* d) {
  for (int64_t i = 0; i < K * V; ++i) S[i] *= a;
  for (int64_t e = 0; e < V; ++e) p[e] = 0;
  for (int64_t i = 0; i < K; ++i)
    for (int64_t e = 0; e < V; ++e) p[e] += S[i * V + e] * k[i];
  for (int64_t e = 0; e < V; ++e) d[e] = beta * (v[e] - p[e]);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t e = 0; e < V; ++e) S[i * V + e] += k[i] * d[e];
}

}  // namespace

void head_fwd(const Head& x, double* o, double* ST) {
  const int64_t L = x.L, K = x.K, V = x.V;
  vector<double> q, k, rq, rk, S(size_t(K * V), 0.0), p(size_t(V), 0.0), d(size_t(V), 0.0);
  prep_rows(x.q, L, K, x.l2norm, q, rq);
  prep_rows(x.k, L, K, x.l2norm, k, rk);
  if (x.S0) std::copy(x.S0, x.S0 + K * V, S.begin());
  for (int64_t t = 0; t < L; ++t) {
    step(S.data(), &k[size_t(t * K)], x.v + t * V, x.beta[t], std::exp(x.g[t]), K, V, p.data(), d.data());
    if (!o) continue;
    for (int64_t e = 0; e < V; ++e) {
      double acc = 0;
      for (int64_t i = 0; i < K; ++i) acc += S[size_t(i * V + e)] * q[size_t(t * K + i)];
      o[t * V + e] = x.scale * acc;
    }
  }
  if (ST) std::copy(S.begin(), S.end(), ST);
}

void head_bwd(const Head& x, const double* dO, const double* dST, double* dq_out, double* dk_out, double* dv, double* dbeta,
              double* dg, double* dS0) {
  const int64_t L = x.L, K = x.K, V = x.V, KV = K * V, nseg = (L + kSeg - 1) / kSeg;
  vector<double> q, k, rq, rk;
  prep_rows(x.q, L, K, x.l2norm, q, rq);
  prep_rows(x.k, L, K, x.l2norm, k, rk);

  // Forward: the state before the first token of every segment.
  vector<double> ckpt(size_t(std::max<int64_t>(nseg, 1) * KV), 0.0), S(size_t(KV), 0.0), p(size_t(V), 0.0), d(size_t(V), 0.0);
  if (x.S0) std::copy(x.S0, x.S0 + KV, S.begin());
  for (int64_t t = 0; t < L; ++t) {
    if (t % kSeg == 0) std::copy(S.begin(), S.end(), ckpt.begin() + (t / kSeg) * KV);
    step(S.data(), &k[size_t(t * K)], x.v + t * V, x.beta[t], std::exp(x.g[t]), K, V, p.data(), d.data());
  }

  vector<double> dS(size_t(KV), 0.0), seg(size_t((kSeg + 1) * KV), 0.0), P(size_t(kSeg * V), 0.0), D(size_t(kSeg * V), 0.0);
  vector<double> dqn(size_t(L * K), 0.0), dkn(size_t(L * K), 0.0), dd(size_t(V), 0.0), dp(size_t(V), 0.0);
  if (dST) std::copy(dST, dST + KV, dS.begin());
  for (int64_t m = nseg - 1; m >= 0; --m) {
    int64_t t0 = m * kSeg, t1 = std::min(L, t0 + kSeg);
    // seg[j] = state after token t0 + j - 1 (seg[0] = state before the segment).
    std::copy(ckpt.begin() + m * KV, ckpt.begin() + (m + 1) * KV, seg.begin());
    for (int64_t t = t0; t < t1; ++t) {
      double* Sn = &seg[size_t((t - t0 + 1) * KV)];
      std::copy(Sn - KV, Sn, Sn);
      step(Sn, &k[size_t(t * K)], x.v + t * V, x.beta[t], std::exp(x.g[t]), K, V, &P[size_t((t - t0) * V)], &D[size_t((t - t0) * V)]);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const double* Sprev = &seg[size_t((t - t0) * KV)];
      const double* St = &seg[size_t((t - t0 + 1) * KV)];
      const double *kt = &k[size_t(t * K)], *qt = &q[size_t(t * K)], *dot = dO + t * V, *vt = x.v + t * V;
      const double *pt = &P[size_t((t - t0) * V)], *delta = &D[size_t((t - t0) * V)];
      double a = std::exp(x.g[t]), bt = x.beta[t];
      // o_t = s S_t^T q_t
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0;
        for (int64_t e = 0; e < V; ++e) {
          dS[size_t(i * V + e)] += x.scale * qt[i] * dot[e];
          acc += St[i * V + e] * dot[e];
        }
        dqn[size_t(t * K + i)] += x.scale * acc;
      }
      // S_t = Sh + k d^T
      for (int64_t e = 0; e < V; ++e) dd[size_t(e)] = 0;
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0;
        for (int64_t e = 0; e < V; ++e) {
          acc += dS[size_t(i * V + e)] * delta[e];
          dd[size_t(e)] += dS[size_t(i * V + e)] * kt[i];
        }
        dkn[size_t(t * K + i)] += acc;
      }
      // d = beta (v - p), p = Sh^T k
      double db = 0;
      for (int64_t e = 0; e < V; ++e) {
        db += dd[size_t(e)] * (vt[e] - pt[e]);
        if (dv) dv[t * V + e] = bt * dd[size_t(e)];
        dp[size_t(e)] = -bt * dd[size_t(e)];
      }
      if (dbeta) dbeta[t] = db;
      double da = 0;
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0;
        for (int64_t e = 0; e < V; ++e) {
          double sh = a * Sprev[i * V + e];
          double dsh = dS[size_t(i * V + e)] + kt[i] * dp[size_t(e)];
          acc += sh * dp[size_t(e)];
          da += dsh * Sprev[i * V + e];
          dS[size_t(i * V + e)] = a * dsh;  // Sh = a S_{t-1}
        }
        dkn[size_t(t * K + i)] += acc;
      }
      if (dg) dg[t] = a * da;
    }
  }
  if (dS0) std::copy(dS.begin(), dS.end(), dS0);
  // l2norm backward: dx = r (dy - (dy . y) y); identity without it.
  auto back = [&](const vector<double>& y, const vector<double>& r, const vector<double>& dy, double* dx) {
    for (int64_t t = 0; t < L; ++t) {
      double c = 0;
      if (x.l2norm)
        for (int64_t i = 0; i < K; ++i) c += dy[size_t(t * K + i)] * y[size_t(t * K + i)];
      for (int64_t i = 0; i < K; ++i) dx[t * K + i] += r[size_t(t)] * (dy[size_t(t * K + i)] - c * y[size_t(t * K + i)]);
    }
  };
  if (dq_out) back(q, rq, dqn, dq_out);
  if (dk_out) back(k, rk, dkn, dk_out);
}

}  // namespace ot::gdn::bwdref

// ---- tensor-level reference: every (sequence, value head) through head_bwd --------------------


namespace ot::gdn::bwdref {

using std::vector;

void recurrence_bwd(const TensorView& q_, const TensorView& k_, const TensorView& v_, const TensorView& g_, const TensorView& beta_,
                    const TensorView& dO_, const TensorView& S0_, const TensorView& dht_, double scale, bool l2norm, const TensorView& dq_,
                    const TensorView& dk_, const TensorView& dv_, const TensorView& dg_, const TensorView& dbeta_, const TensorView& dh0_, Layout l,
                    const std::vector<int64_t>& cu) {
  using namespace refimpl;
  const Tokens q = vec(q_, l), k = vec(k_, l), v = vec(v_, l), g = scal(g_, l), beta = scal(beta_, l), dO = vec(dO_, l);
  const Tokens dq = vec(dq_, l), dk = vec(dk_, l), dv = vec(dv_, l), dg = scal(dg_, l), db = scal(dbeta_, l);
  const State S0s(S0_), dht(dht_), dh0(dh0_);
  const Sequences s(q.B, q.T, cu);
  const int64_t K = q.D, V = v.D, HK = q.H, G = v.H / q.H;
  for (int64_t n = 0; n < s.num_seqs(); ++n) {
    const int64_t b = s.row[size_t(n)], bos = s.bos[size_t(n)], L = s.len[size_t(n)];
    for (int64_t hk = 0; hk < HK; ++hk) {
      vector<double> qv(size_t(L * K)), kv(size_t(L * K)), dqv(size_t(L * K), 0.0), dkv(size_t(L * K), 0.0);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < K; ++d) qv[size_t(t * K + d)] = q.get(b, bos + t, hk, d), kv[size_t(t * K + d)] = k.get(b, bos + t, hk, d);
      for (int64_t hv = hk * G; hv < (hk + 1) * G; ++hv) {
        vector<double> vv(size_t(L * V)), dov(size_t(L * V)), bv(static_cast<size_t>(L), 1.0), gv(static_cast<size_t>(L), 0.0), S0(size_t(K * V)), dST(size_t(K * V));
        vector<double> dvv(size_t(L * V)), dbv(static_cast<size_t>(L)), dgv(static_cast<size_t>(L)), dS0(size_t(K * V));
        for (int64_t t = 0; t < L; ++t) {
          for (int64_t e = 0; e < V; ++e) vv[size_t(t * V + e)] = v.get(b, bos + t, hv, e), dov[size_t(t * V + e)] = dO.get(b, bos + t, hv, e);
          if (beta.defined()) bv[size_t(t)] = beta.get(b, bos + t, hv, 0);
          if (g.defined()) gv[size_t(t)] = g.get(b, bos + t, hv, 0);
        }
        for (int64_t i = 0; i < K * V; ++i) {
          if (S0s.defined()) S0[size_t(i)] = S0s.get(n, hv, i);
          if (dht.defined()) dST[size_t(i)] = dht.get(n, hv, i);
        }
        Head h;
        h.L = L, h.K = K, h.V = V, h.q = qv.data(), h.k = kv.data(), h.v = vv.data(), h.beta = bv.data(), h.g = gv.data();
        h.S0 = S0s.defined() ? S0.data() : nullptr;
        h.scale = scale, h.l2norm = l2norm;
        head_bwd(h, dov.data(), dht.defined() ? dST.data() : nullptr, dqv.data(), dkv.data(), dvv.data(), dbv.data(), dgv.data(), dS0.data());
        for (int64_t t = 0; t < L; ++t) {
          for (int64_t e = 0; e < V; ++e) dv.set(b, bos + t, hv, e, dvv[size_t(t * V + e)]);
          db.set(b, bos + t, hv, 0, dbv[size_t(t)]);
          dg.set(b, bos + t, hv, 0, dgv[size_t(t)]);
        }
        if (dh0.defined())
          for (int64_t i = 0; i < K * V; ++i) dh0.set(n, hv, i, dS0[size_t(i)]);
      }
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < K; ++d) dq.set(b, bos + t, hk, d, dqv[size_t(t * K + d)]), dk.set(b, bos + t, hk, d, dkv[size_t(t * K + d)]);
    }
  }
}

}  // namespace ot::gdn::bwdref

// ---- fp64 references of the backward stages: the spec 6.1-6.4 formulas as plain loops ----------

namespace ot::gdn::bwdref {

namespace {
using refimpl::Chunk;
using refimpl::Sequences;
using refimpl::State;
using refimpl::Tokens;
using refimpl::scal;
using refimpl::vec;
using Mat = vector<double>;  // row-major, explicit widths at the call sites

// Rows [L][D] of head h of chunk sp, in fp64.
Mat rows(const Tokens& x, const Chunk& sp, int64_t h) {
  Mat m(size_t(sp.L * x.D));
  for (int64_t i = 0; i < sp.L; ++i)
    for (int64_t d = 0; d < x.D; ++d) m[size_t(i * x.D + d)] = x.get(sp.b, sp.t0 + i, h, d);
  return m;
}
double dotr(const Mat& a, int64_t i, const Mat& b, int64_t j, int64_t D) {
  double s = 0;
  for (int64_t d = 0; d < D; ++d) s += a[size_t(i * D + d)] * b[size_t(j * D + d)];
  return s;
}
// Calls fn(sp, hv, hk) for every chunk and value head.
template <class F> void each_chunk(const Sequences& seq, int64_t HV, int64_t group, F fn) {
  for (size_t id = 0; id < seq.chunks.size(); ++id)
    for (int64_t hv = 0; hv < HV; ++hv) fn(seq.chunks[id], int64_t(id), hv, hv / group);
}
}  // namespace

void dv_local(const TensorView& q_, const TensorView& k_, const TensorView& G_, const TensorView& dO_, double s, const TensorView& out_, Layout l,
              const std::vector<int64_t>& cu) {
  const Tokens q = vec(q_, l), k = vec(k_, l), G = scal(G_, l), dO = vec(dO_, l), out = vec(out_, l);
  const Sequences seq(q.B, q.T, cu);
  const int64_t K = q.D, V = dO.D;
  each_chunk(seq, dO.H, dO.H / q.H, [&](const Chunk& sp, int64_t, int64_t hv, int64_t hk) {
    Mat Q = rows(q, sp, hk), Kc = rows(k, sp, hk), D = rows(dO, sp, hv), g = rows(G, sp, hv);
    for (int64_t i = 0; i < sp.L; ++i)
      for (int64_t e = 0; e < V; ++e) {
        double acc = 0;
        for (int64_t j = i; j < sp.L; ++j) acc += s * std::exp(g[size_t(j)] - g[size_t(i)]) * dotr(Kc, i, Q, j, K) * D[size_t(j * V + e)];
        out.set(sp.b, sp.t0 + i, hv, e, acc);
      }
  });
}

void dhu(const TensorView& q_, const TensorView& k_, const TensorView& w_, const TensorView& G_, const TensorView& dht_, const TensorView& dO_,
         const TensorView& dvl_, double s, float* dh, const TensorView& dh0_, const TensorView& dv2_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens q = vec(q_, l), k = vec(k_, l), w = vec(w_, l), G = scal(G_, l), dO = vec(dO_, l), dvl = vec(dvl_, l), dv2 = vec(dv2_, l);
  const State dht(dht_), dh0(dh0_);
  const Sequences seq(q.B, q.T, cu);
  const int64_t K = q.D, V = dO.D, HV = dO.H, group = HV / q.H;
  for (int64_t n = 0; n < seq.num_seqs(); ++n)
    for (int64_t hv = 0; hv < HV; ++hv) {
      Mat dH(size_t(K * V), 0.0);
      if (dht.defined())
        for (int64_t i = 0; i < K * V; ++i) dH[size_t(i)] = dht.get(n, hv, i);
      int64_t nc = seq.first_chunk[size_t(n + 1)] - seq.first_chunk[size_t(n)];
      for (int64_t c = nc - 1; c >= 0; --c) {
        const Chunk& sp = seq.chunks[size_t(seq.first_chunk[size_t(n)] + c)];
        const int64_t L = sp.L;
        for (int64_t i = 0; i < K * V; ++i) dh[((seq.first_chunk[size_t(n)] + c) * HV + hv) * K * V + i] = float(dH[size_t(i)]);
        Mat Q = rows(q, sp, hv / group), Kc = rows(k, sp, hv / group), W = rows(w, sp, hv), D = rows(dO, sp, hv), g = rows(G, sp, hv);
        Mat dl = rows(dvl, sp, hv), d2(size_t(L * V));
        double gl = g[size_t(L - 1)];
        for (int64_t i = 0; i < L; ++i)
          for (int64_t e = 0; e < V; ++e) {
            double acc = 0;
            for (int64_t d = 0; d < K; ++d) acc += Kc[size_t(i * K + d)] * dH[size_t(d * V + e)];
            d2[size_t(i * V + e)] = std::exp(gl - g[size_t(i)]) * acc + dl[size_t(i * V + e)];
            dv2.set(sp.b, sp.t0 + i, hv, e, d2[size_t(i * V + e)]);
          }
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) {
            double acc = std::exp(gl) * dH[size_t(d * V + e)];
            for (int64_t i = 0; i < L; ++i)
              acc += s * std::exp(g[size_t(i)]) * Q[size_t(i * K + d)] * D[size_t(i * V + e)] - W[size_t(i * K + d)] * d2[size_t(i * V + e)];
            dH[size_t(d * V + e)] = acc;
          }
      }
      if (dh0.defined())
        for (int64_t i = 0; i < K * V; ++i) dh0.set(n, hv, i, dH[size_t(i)]);
    }
}

void dqkwg(const TensorView& q_, const TensorView& k_, const TensorView& vnew_, const float* h, const TensorView& G_, const TensorView& dv2_,
           const TensorView& dO_, const float* dh, double s, const TensorView& dq_, const TensorView& dk_, const TensorView& dw_,
           const TensorView& dg_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens q = vec(q_, l), k = vec(k_, l), vnew = vec(vnew_, l), G = scal(G_, l), dv2 = vec(dv2_, l), dO = vec(dO_, l);
  const Tokens dq = vec(dq_, l), dk = vec(dk_, l), dw = vec(dw_, l), dg = scal(dg_, l);
  const Sequences seq(q.B, q.T, cu);
  const int64_t K = q.D, V = dO.D, HV = dO.H;
  each_chunk(seq, HV, HV / q.H, [&](const Chunk& sp, int64_t id, int64_t hv, int64_t hk) {
    const int64_t L = sp.L;
    Mat Q = rows(q, sp, hk), Kc = rows(k, sp, hk), Dn = rows(vnew, sp, hv), g = rows(G, sp, hv), d2 = rows(dv2, sp, hv), D = rows(dO, sp, hv);
    const float *S = h + (id * HV + hv) * K * V, *dH = dh + (id * HV + hv) * K * V;
    double gl = g[size_t(L - 1)], last = 0;
    Mat dS(size_t(L * L), 0.0), dQ(size_t(L * K)), dK(size_t(L * K));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) dS[size_t(i * L + j)] = s * std::exp(g[size_t(i)] - g[size_t(j)]) * dotr(D, i, Dn, j, V);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t d = 0; d < K; ++d) {
        double qi = 0, ki = 0, wi = 0;
        for (int64_t e = 0; e < V; ++e) {
          qi += S[d * V + e] * D[size_t(i * V + e)];
          ki += dH[d * V + e] * Dn[size_t(i * V + e)];
          wi -= S[d * V + e] * d2[size_t(i * V + e)];
        }
        ki *= std::exp(gl - g[size_t(i)]);
        last += Kc[size_t(i * K + d)] * ki;
        dQ[size_t(i * K + d)] = s * std::exp(g[size_t(i)]) * qi;
        dK[size_t(i * K + d)] = ki;
        dw.set(sp.b, sp.t0 + i, hv, d, wi);
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j)
        for (int64_t d = 0; d < K; ++d) {
          dQ[size_t(i * K + d)] += dS[size_t(i * L + j)] * Kc[size_t(j * K + d)];
          dK[size_t(j * K + d)] += dS[size_t(i * L + j)] * Q[size_t(i * K + d)];
        }
    double sh = 0;
    for (int64_t i = 0; i < K * V; ++i) sh += double(S[i]) * dH[i];
    for (int64_t i = 0; i < L; ++i) {
      double gi = dotr(Q, i, dQ, i, K) - dotr(Kc, i, dK, i, K) + (i == L - 1 ? std::exp(gl) * sh + last : 0.0);
      dg.set(sp.b, sp.t0 + i, hv, 0, gi);
      for (int64_t d = 0; d < K; ++d) dq.set(sp.b, sp.t0 + i, hv, d, dQ[size_t(i * K + d)]), dk.set(sp.b, sp.t0 + i, hv, d, dK[size_t(i * K + d)]);
    }
  });
}

namespace {
// dM = strict(-A^T dA A^T) with dA = strict(dW kbg^T + dU vb^T); also returns the chunk's operands.
struct Wy {
  Mat Kc, Vc, b, g, A, dW, dU, dM, E;
};
Wy wy_common(const Tokens& k, const Tokens& v, const Tokens& beta, const Tokens& A, const Tokens& dw, const Tokens& du, const Tokens& G, const Chunk& sp,
             int64_t hv, int64_t hk) {
  const int64_t L = sp.L, K = k.D, V = v.D;
  Wy w{rows(k, sp, hk), rows(v, sp, hv), rows(beta, sp, hv), rows(G, sp, hv), rows(A, sp, hv), rows(dw, sp, hv), rows(du, sp, hv), {}, {}};
  const int64_t C = A.D;
  Mat dA(size_t(L * L), 0.0), T(size_t(L * L), 0.0);
  w.dM.assign(size_t(L * L), 0.0);
  w.E.assign(size_t(L * L), 0.0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < i; ++j) {
      double kb = w.b[size_t(j)] * std::exp(w.g[size_t(j)]), acc = 0;
      for (int64_t d = 0; d < K; ++d) acc += w.dW[size_t(i * K + d)] * kb * w.Kc[size_t(j * K + d)];
      for (int64_t e = 0; e < V; ++e) acc += w.dU[size_t(i * V + e)] * w.b[size_t(j)] * w.Vc[size_t(j * V + e)];
      dA[size_t(i * L + j)] = acc;
      w.E[size_t(i * L + j)] = std::exp(w.g[size_t(i)] - w.g[size_t(j)]);
    }
  auto a = [&](int64_t i, int64_t j) { return w.A[size_t(i * C + j)]; };
  for (int64_t i = 0; i < L; ++i)  // T = A^T dA
    for (int64_t j = 0; j < L; ++j)
      for (int64_t m = 0; m < L; ++m) T[size_t(i * L + j)] += a(m, i) * dA[size_t(m * L + j)];
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < i; ++j)
      for (int64_t m = 0; m < L; ++m) w.dM[size_t(i * L + j)] -= T[size_t(i * L + m)] * a(j, m);
  return w;
}
}  // namespace

void wy_da(const TensorView& k_, const TensorView& v_, const TensorView& beta_, const TensorView& A_, const TensorView& dw_, const TensorView& du_,
           const TensorView& G_, const TensorView& dP_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens k = vec(k_, l), v = vec(v_, l), beta = scal(beta_, l), A = vec(A_, l), dw = vec(dw_, l), du = vec(du_, l), G = scal(G_, l);
  const Tokens dP = vec(dP_, l);
  const Sequences seq(k.B, k.T, cu);
  each_chunk(seq, v.H, v.H / k.H, [&](const Chunk& sp, int64_t, int64_t hv, int64_t hk) {
    Wy w = wy_common(k, v, beta, A, dw, du, G, sp, hv, hk);
    for (int64_t i = 0; i < sp.L; ++i)
      for (int64_t j = 0; j < dP.D; ++j) dP.set(sp.b, sp.t0 + i, hv, j, j < i ? w.dM[size_t(i * sp.L + j)] * w.E[size_t(i * sp.L + j)] : 0.0);
  });
}

void wy_full(const TensorView& k_, const TensorView& v_, const TensorView& beta_, const TensorView& A_, const TensorView& dP_, const TensorView& dw_,
             const TensorView& du_, const TensorView& G_, const TensorView& dk_, const TensorView& dv_, const TensorView& dbeta_, const TensorView& dg_,
             Layout l, const std::vector<int64_t>& cu) {
  const Tokens k = vec(k_, l), v = vec(v_, l), beta = scal(beta_, l), A = vec(A_, l), dP = vec(dP_, l), dw = vec(dw_, l), du = vec(du_, l);
  const Tokens G = scal(G_, l), dk = vec(dk_, l), dv = vec(dv_, l), dbeta = scal(dbeta_, l), dg = scal(dg_, l);
  const Sequences seq(k.B, k.T, cu);
  const int64_t K = k.D, V = v.D;
  each_chunk(seq, v.H, v.H / k.H, [&](const Chunk& sp, int64_t, int64_t hv, int64_t hk) {
    const int64_t L = sp.L, C = A.D;
    Mat Kc = rows(k, sp, hk), Vc = rows(v, sp, hv), b = rows(beta, sp, hv), g = rows(G, sp, hv), Am = rows(A, sp, hv);
    Mat dW = rows(dw, sp, hv), dU = rows(du, sp, hv), P = rows(dP, sp, hv), X(size_t(L * K), 0.0), Y(size_t(L * V), 0.0);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t m = 0; m < L; ++m) {
        double am = Am[size_t(m * C + i)];
        for (int64_t d = 0; d < K; ++d) X[size_t(i * K + d)] += am * dW[size_t(m * K + d)];
        for (int64_t e = 0; e < V; ++e) Y[size_t(i * V + e)] += am * dU[size_t(m * V + e)];
      }
    auto p = [&](int64_t i, int64_t j) { return j < i ? P[size_t(i * C + j)] : 0.0; };
    for (int64_t j = 0; j < L; ++j) {
      double bj = b[size_t(j)], gj = std::exp(g[size_t(j)]), db = gj * dotr(X, j, Kc, j, K) + dotr(Y, j, Vc, j, V);
      double dG = bj * gj * dotr(X, j, Kc, j, K);
      for (int64_t d = 0; d < K; ++d) {
        double acc = bj * gj * X[size_t(j * K + d)];
        for (int64_t i = 0; i < L; ++i) acc += bj * p(j, i) * Kc[size_t(i * K + d)] + p(i, j) * b[size_t(i)] * Kc[size_t(i * K + d)];
        dk.set(sp.b, sp.t0 + j, hv, d, acc);
      }
      for (int64_t i = 0; i < L; ++i) {
        db += p(j, i) * dotr(Kc, j, Kc, i, K);
        dG += p(j, i) * bj * dotr(Kc, j, Kc, i, K) - p(i, j) * b[size_t(i)] * dotr(Kc, i, Kc, j, K);  // dM o M = dP o (beta_i k_i.k_j)
      }
      for (int64_t e = 0; e < V; ++e) dv.set(sp.b, sp.t0 + j, hv, e, bj * Y[size_t(j * V + e)]);
      dbeta.set(sp.b, sp.t0 + j, hv, 0, db);
      dg.set(sp.b, sp.t0 + j, hv, 0, dG);
    }
  });
}

}  // namespace ot::gdn::bwdref
