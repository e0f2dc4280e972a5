// Plain fp64 references of the GDN forward (spec sections 3 and 5, appendix C): loops written to
// be obviously correct, not fast.
#include "src/ref/gdn_ref.h"

#include <cmath>
#include <vector>

#include "src/ref/gdn_ref_views.h"

namespace ot::gdn::refimpl {

using std::vector;

namespace {
// Visit every chunk with its global index.
template <class F> void each_chunk(const Sequences& s, F&& f) {
  for (size_t id = 0; id < s.chunks.size(); ++id) f(s.chunks[id], int64_t(id));
}
double dot_rows(const Tokens& a, int64_t b, int64_t ta, int64_t ha, const Tokens& c, int64_t tc, int64_t hc) {
  double acc = 0;
  for (int64_t d = 0; d < a.D; ++d) acc += a.get(b, ta, ha, d) * c.get(b, tc, hc, d);
  return acc;
}
}  // namespace

void cumsum(const TensorView& g_, const TensorView& G_, Layout l, const std::vector<int64_t>& cu, bool reverse, float scale) {
  const Tokens g = scal(g_, l), G = scal(G_, l);
  const Sequences s(g.B, g.T, cu);
  each_chunk(s, [&](const Chunk& sp, int64_t) {
    for (int64_t h = 0; h < g.H; ++h) {
      for (int64_t i = 0; i < sp.L; ++i) {
        double acc = 0;
        int64_t from = reverse ? i : 0, to = reverse ? sp.L : i + 1;
        for (int64_t j = from; j < to; ++j) acc += g.get(sp.b, sp.t0 + j, h, 0);
        G.set(sp.b, sp.t0 + i, h, 0, double(scale) * acc);
      }
    }
  });
}

void l2norm(const TensorView& x, const TensorView& y, const TensorView& rstd, float eps) {
  int64_t D = x.sizes[x.ndim - 1], rows = D ? x.numel() / D : 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += get_as_double(x, r * D + d) * get_as_double(x, r * D + d);
    double inv = 1.0 / std::sqrt(ss + double(eps));
    for (int64_t d = 0; d < D; ++d) set_from_double(y, r * D + d, get_as_double(x, r * D + d) * inv);
    set_from_double(rstd, r, inv);
  }
}

void kkt(const TensorView& k_, const TensorView& G_, const TensorView& beta_, const TensorView& M_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens k = vec(k_, l), G = scal(G_, l), beta = scal(beta_, l), M = vec(M_, l);
  const Sequences s(k.B, k.T, cu);
  int64_t group = G.H / k.H;
  each_chunk(s, [&](const Chunk& sp, int64_t) {
    for (int64_t h = 0; h < G.H; ++h)
      for (int64_t i = 0; i < sp.L; ++i)
        for (int64_t j = 0; j < kChunk; ++j) {
          double m = 0;
          if (j < i) {
            double e = std::exp(G.get(sp.b, sp.t0 + i, h, 0) - G.get(sp.b, sp.t0 + j, h, 0));
            m = beta.get(sp.b, sp.t0 + i, h, 0) * dot_rows(k, sp.b, sp.t0 + i, h / group, k, sp.t0 + j, h / group) * e;
          }
          M.set(sp.b, sp.t0 + i, h, j, m);
        }
  });
}

void solve_tril(const TensorView& M_, const TensorView& A_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens M = vec(M_, l), A = vec(A_, l);
  const Sequences s(M.B, M.T, cu);
  each_chunk(s, [&](const Chunk& sp, int64_t) {
    for (int64_t h = 0; h < M.H; ++h) {
      // Column by column: (I + M) a_j = e_j by forward substitution.
      vector<double> a(size_t(sp.L * sp.L), 0.0);
      for (int64_t j = 0; j < sp.L; ++j)
        for (int64_t i = 0; i < sp.L; ++i) {
          double r = i == j ? 1.0 : 0.0;
          for (int64_t m = 0; m < i; ++m) r -= M.get(sp.b, sp.t0 + i, h, m) * a[size_t(m * sp.L + j)];
          a[size_t(i * sp.L + j)] = r;
        }
      for (int64_t i = 0; i < sp.L; ++i)
        for (int64_t j = 0; j < kChunk; ++j) A.set(sp.b, sp.t0 + i, h, j, j < sp.L ? a[size_t(i * sp.L + j)] : 0.0);
    }
  });
}

void wu(const TensorView& k_, const TensorView& v_, const TensorView& beta_, const TensorView& A_, const TensorView& G_, const TensorView& w_,
        const TensorView& u_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens k = vec(k_, l), v = vec(v_, l), beta = scal(beta_, l), A = vec(A_, l), G = scal(G_, l), w = vec(w_, l), u = vec(u_, l);
  const Sequences s(k.B, k.T, cu);
  int64_t group = v.H / k.H;
  each_chunk(s, [&](const Chunk& sp, int64_t) {
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t i = 0; i < sp.L; ++i) {
        for (int64_t d = 0; d < k.D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += A.get(sp.b, sp.t0 + i, h, j) * beta.get(sp.b, sp.t0 + j, h, 0) * std::exp(G.get(sp.b, sp.t0 + j, h, 0)) *
                   k.get(sp.b, sp.t0 + j, h / group, d);
          w.set(sp.b, sp.t0 + i, h, d, acc);
        }
        for (int64_t d = 0; d < v.D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += A.get(sp.b, sp.t0 + i, h, j) * beta.get(sp.b, sp.t0 + j, h, 0) * v.get(sp.b, sp.t0 + j, h, d);
          u.set(sp.b, sp.t0 + i, h, d, acc);
        }
      }
  });
}

void fwd_h(const TensorView& k_, const TensorView& w_, const TensorView& u_, const TensorView& G_, const TensorView& S0_, float* h,
           const TensorView& vnew_, const TensorView& fin_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens k = vec(k_, l), w = vec(w_, l), u = vec(u_, l), G = scal(G_, l), vnew = vec(vnew_, l);
  const State S0(S0_), fin(fin_);
  const Sequences s(k.B, k.T, cu);
  int64_t HV = u.H, DK = k.D, DV = u.D, group = HV / k.H;
  vector<double> S(size_t(DK * DV)), dn(static_cast<size_t>(kChunk * DV));
  for (int64_t n = 0; n < s.num_seqs(); ++n)
    for (int64_t hv = 0; hv < HV; ++hv) {
      for (int64_t i = 0; i < DK * DV; ++i) S[size_t(i)] = S0.defined() ? S0.get(n, hv, i) : 0.0;
      int64_t nc = s.first_chunk[size_t(n + 1)] - s.first_chunk[size_t(n)];
      for (int64_t c = 0; c < nc; ++c) {
        const Chunk& sp = s.chunks[size_t(s.first_chunk[size_t(n)] + c)];
        if (h)
          for (int64_t i = 0; i < DK * DV; ++i) h[((s.first_chunk[size_t(n)] + c) * HV + hv) * DK * DV + i] = float(S[size_t(i)]);
        for (int64_t i = 0; i < sp.L; ++i)
          for (int64_t e = 0; e < DV; ++e) {
            double acc = u.get(sp.b, sp.t0 + i, hv, e);
            for (int64_t d = 0; d < DK; ++d) acc -= w.get(sp.b, sp.t0 + i, hv, d) * S[size_t(d * DV + e)];
            dn[size_t(i * DV + e)] = acc;
            vnew.set(sp.b, sp.t0 + i, hv, e, acc);
          }
        double gl = G.get(sp.b, sp.t0 + sp.L - 1, hv, 0);
        for (int64_t d = 0; d < DK; ++d)
          for (int64_t e = 0; e < DV; ++e) {
            double acc = std::exp(gl) * S[size_t(d * DV + e)];
            for (int64_t i = 0; i < sp.L; ++i)
              acc += std::exp(gl - G.get(sp.b, sp.t0 + i, hv, 0)) * k.get(sp.b, sp.t0 + i, hv / group, d) * dn[size_t(i * DV + e)];
            S[size_t(d * DV + e)] = acc;
          }
      }
      if (fin.defined())
        for (int64_t i = 0; i < DK * DV; ++i) fin.set(n, hv, i, S[size_t(i)]);
    }
}

void fwd_o(const TensorView& q_, const TensorView& k_, const TensorView& vnew_, const float* h, const TensorView& G_, double scale,
           const TensorView& o_, Layout l, const std::vector<int64_t>& cu) {
  const Tokens q = vec(q_, l), k = vec(k_, l), vnew = vec(vnew_, l), G = scal(G_, l), o = vec(o_, l);
  const Sequences s(q.B, q.T, cu);
  int64_t HV = vnew.H, DK = q.D, DV = vnew.D, group = HV / q.H;
  each_chunk(s, [&](const Chunk& sp, int64_t id) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      const float* S = h + (id * HV + hv) * DK * DV;
      for (int64_t i = 0; i < sp.L; ++i) {
        double gi = G.get(sp.b, sp.t0 + i, hv, 0);
        for (int64_t e = 0; e < DV; ++e) {
          double inter = 0, intra = 0;
          for (int64_t d = 0; d < DK; ++d) inter += q.get(sp.b, sp.t0 + i, hv / group, d) * double(S[d * DV + e]);
          for (int64_t j = 0; j <= i; ++j)
            intra += std::exp(gi - G.get(sp.b, sp.t0 + j, hv, 0)) * dot_rows(q, sp.b, sp.t0 + i, hv / group, k, sp.t0 + j, hv / group) *
                     vnew.get(sp.b, sp.t0 + j, hv, e);
          o.set(sp.b, sp.t0 + i, hv, e, scale * (std::exp(gi) * inter + intra));
        }
      }
    }
  });
}

void recurrence(const TensorView& q_, const TensorView& k_, const TensorView& v_, const TensorView& g_, const TensorView& beta_,
                const TensorView& S0_, bool l2norm, double scale, const TensorView& o_, const TensorView& fin_, Layout l,
                const std::vector<int64_t>& cu, const std::vector<int64_t>* commit) {
  const Tokens q = vec(q_, l), k = vec(k_, l), v = vec(v_, l), g = scal(g_, l), beta = scal(beta_, l), o = vec(o_, l);
  const State S0(S0_), fin(fin_);
  const Sequences s(q.B, q.T, cu);
  int64_t HV = v.H, DK = q.D, DV = v.D, group = HV / q.H;
  vector<double> S(size_t(DK * DV)), qv(static_cast<size_t>(DK)), kv(static_cast<size_t>(DK)), ks(static_cast<size_t>(DV));
  auto load = [&](const Tokens& x, int64_t b, int64_t t, int64_t hk, vector<double>& dst) {
    double ss = 0;
    for (int64_t d = 0; d < DK; ++d) ss += (dst[size_t(d)] = x.get(b, t, hk, d)) * dst[size_t(d)];
    if (l2norm)
      for (int64_t d = 0; d < DK; ++d) dst[size_t(d)] /= std::sqrt(ss + 1e-6);
  };
  auto save = [&](int64_t n, int64_t hv) {
    if (!fin.defined()) return;
    for (int64_t i = 0; i < DK * DV; ++i) fin.set(n, hv, i, S[size_t(i)]);
  };
  for (int64_t n = 0; n < s.num_seqs(); ++n)
    for (int64_t hv = 0; hv < HV; ++hv) {
      int64_t b = s.row[size_t(n)], bos = s.bos[size_t(n)], L = s.len[size_t(n)], hk = hv / group;
      int64_t keep = commit ? (*commit)[size_t(n)] : L;
      for (int64_t i = 0; i < DK * DV; ++i) {
        double x = 0;
        if (S0.defined()) x = S0.get(n, hv, i);
        S[size_t(i)] = x;
      }
      if (keep == 0) save(n, hv);
      for (int64_t t = bos; t < bos + L; ++t) {
        load(q, b, t, hk, qv);
        load(k, b, t, hk, kv);
        double a = g.defined() ? std::exp(g.get(b, t, hv, 0)) : 1.0, bt = beta.defined() ? beta.get(b, t, hv, 0) : 1.0;
        for (auto& x : S) x *= a;
        for (int64_t e = 0; e < DV; ++e) {
          double acc = 0;
          for (int64_t d = 0; d < DK; ++d) acc += S[size_t(d * DV + e)] * kv[size_t(d)];
          ks[size_t(e)] = bt * (v.get(b, t, hv, e) - acc);
        }
        for (int64_t d = 0; d < DK; ++d)
          for (int64_t e = 0; e < DV; ++e) S[size_t(d * DV + e)] += kv[size_t(d)] * ks[size_t(e)];
        for (int64_t e = 0; e < DV; ++e) {
          double acc = 0;
          for (int64_t d = 0; d < DK; ++d) acc += S[size_t(d * DV + e)] * qv[size_t(d)];
          o.set(b, t, hv, e, scale * acc);
        }
        if (t - bos + 1 == keep) save(n, hv);
      }
    }
}

}  // namespace ot::gdn::refimpl
