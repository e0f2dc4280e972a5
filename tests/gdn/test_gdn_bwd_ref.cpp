// The fp64 ground truth of the GDN backward (hand-written reverse mode of the token recurrence)
// against central finite differences of loss = sum(o * dO) + sum(S_T * dST).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "src/ref/gdn_bwd_ref.h"

namespace test_gdn_bwd_ref {
namespace {

using ot::gdn::bwdref::Head;
using std::vector;

struct Problem {
  int64_t L, K, V;
  int G;  // value heads sharing the one key head
  bool l2norm, with_s0, with_dst;
  vector<double> q, k, dO, dST;
  vector<vector<double>> v, beta, g, S0;  // per value head
};

Problem make(int64_t L, int64_t K, int64_t V, int G, bool l2, bool s0, bool dst, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n01;
  std::uniform_real_distribution<double> u01(0, 1);
  Problem p{L, K, V, G, l2, s0, dst, {}, {}, {}, {}, {}, {}, {}, {}};
  auto fill = [&](vector<double>& x, size_t n, double s) {
    x.resize(n);
    for (auto& e : x) e = s * n01(rng);
  };
  double kscale = l2 ? 1.0 : 1.0 / std::sqrt(double(K));  // keep I + M well conditioned
  fill(p.q, size_t(L * K), kscale);
  fill(p.k, size_t(L * K), kscale);
  fill(p.dO, size_t(G * L * V), 1.0);
  if (dst) fill(p.dST, size_t(G * K * V), 1.0);
  p.v.resize(size_t(G));
  p.beta.resize(size_t(G));
  p.g.resize(size_t(G));
  p.S0.resize(size_t(G));
  for (int h = 0; h < G; ++h) {
    fill(p.v[size_t(h)], size_t(L * V), 1.0);
    p.beta[size_t(h)].resize(size_t(L));
    p.g[size_t(h)].resize(size_t(L));
    for (int64_t t = 0; t < L; ++t) {
      p.beta[size_t(h)][size_t(t)] = u01(rng);
      p.g[size_t(h)][size_t(t)] = t % 7 == 3 ? 0.0 : -2.0 * u01(rng);  // exact zeros included
    }
    if (s0) fill(p.S0[size_t(h)], size_t(K * V), 1.0);
  }
  return p;
}

Head head_of(const Problem& p, int h) {
  Head x;
  x.L = p.L, x.K = p.K, x.V = p.V;
  x.q = p.q.data(), x.k = p.k.data(), x.v = p.v[size_t(h)].data();
  x.beta = p.beta[size_t(h)].data(), x.g = p.g[size_t(h)].data();
  x.S0 = p.with_s0 ? p.S0[size_t(h)].data() : nullptr;
  x.scale = 1.0 / std::sqrt(double(p.K));
  x.l2norm = p.l2norm;
  return x;
}

double loss(const Problem& p) {
  double l = 0;
  vector<double> o(size_t(p.L * p.V)), ST(size_t(p.K * p.V));
  for (int h = 0; h < p.G; ++h) {
    ot::gdn::bwdref::head_fwd(head_of(p, h), o.data(), ST.data());
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * p.dO[size_t(h) * o.size() + i];
    if (p.with_dst)
      for (size_t i = 0; i < ST.size(); ++i) l += ST[i] * p.dST[size_t(h) * ST.size() + i];
  }
  return l;
}

// Central difference of the loss w.r.t. x[i] (x is a member of p).
double fd(Problem& p, vector<double>& x, size_t i) {
  const double eps = 1e-6, x0 = x[i];
  x[i] = x0 + eps;
  double lp = loss(p);
  x[i] = x0 - eps;
  double lm = loss(p);
  x[i] = x0;
  return (lp - lm) / (2 * eps);
}

void expect_grad(Problem& p, vector<double>& x, const vector<double>& analytic, const char* name) {
  ASSERT_EQ(x.size(), analytic.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double f = fd(p, x, i), a = analytic[i];
    worst = std::max(worst, std::fabs(f - a) / std::max(1.0, std::fabs(a)));
  }
  EXPECT_LT(worst, 1e-6) << name;
}

class RefFd : public ::testing::TestWithParam<std::tuple<int, bool, bool, bool>> {};

TEST_P(RefFd, GradientsMatchFiniteDifferences) {
  auto [G, l2, s0, dst] = GetParam();
  // L = 70 crosses the reference's 64-token checkpoint segment; K != V.
  Problem p = make(70, 4, 3, G, l2, s0, dst, 1234u + unsigned(G));
  const int64_t L = p.L, K = p.K, V = p.V;
  vector<double> dq(size_t(L * K), 0.0), dk(size_t(L * K), 0.0);
  auto per_head = [&](int64_t n) { return vector<vector<double>>(size_t(G), vector<double>(size_t(n), 0.0)); };
  auto dv = per_head(L * V), db = per_head(L), dg = per_head(L), dS0 = per_head(K * V);
  for (int h = 0; h < G; ++h)
    ot::gdn::bwdref::head_bwd(head_of(p, h), p.dO.data() + h * L * V, dst ? p.dST.data() + h * K * V : nullptr, dq.data(), dk.data(),
                              dv[size_t(h)].data(), db[size_t(h)].data(), dg[size_t(h)].data(), dS0[size_t(h)].data());
  expect_grad(p, p.q, dq, "dq");
  expect_grad(p, p.k, dk, "dk");
  for (int h = 0; h < G; ++h) {
    expect_grad(p, p.v[size_t(h)], dv[size_t(h)], "dv");
    expect_grad(p, p.beta[size_t(h)], db[size_t(h)], "dbeta");
    expect_grad(p, p.g[size_t(h)], dg[size_t(h)], "dg");
    if (s0) expect_grad(p, p.S0[size_t(h)], dS0[size_t(h)], "dh0");
  }
}

INSTANTIATE_TEST_SUITE_P(GdnBwdRef, RefFd,
                         ::testing::Values(std::make_tuple(1, false, false, false), std::make_tuple(1, true, true, true),
                                           std::make_tuple(2, true, false, true), std::make_tuple(2, false, true, false)));

}  // namespace

}  // namespace test_gdn_bwd_ref
