// Backward of the routers (v1, v2 renorm 0/1, gating_top_k softmax/sigmoid with renorm and routed
// scaling, top-k renormalisation) and of the aux / z losses: the reference against finite
// differences of fp64 forwards with the selection held fixed, the fast path against the reference,
// finished rows, allowed masks, k = 1 and k = E, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "moe/moe_bwd_test_util.h"
#include "ot/error.h"
#include "ot/moe_bwd.h"

namespace test_router_backward {
using namespace ot;
using namespace ot::moe;
using namespace ot::moe::bwdtest;

namespace {

// Top-k ids by descending key (lower id first on ties) of row t.
std::vector<int64_t> topk_ids(const std::vector<double>& key, int64_t T, int64_t E, int64_t K) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> o(static_cast<size_t>(E));
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return key[size_t(t * E + a)] > key[size_t(t * E + b)]; });
    ids.insert(ids.end(), o.begin(), o.begin() + K);
  }
  return ids;
}
std::vector<double> softmax64(const std::vector<double>& x, int64_t t, int64_t E, const std::vector<uint8_t>* allowed = nullptr) {
  std::vector<double> p(static_cast<size_t>(E));
  double m = -1e300, s = 0;
  auto ok = [&](int64_t e) { return !allowed || (*allowed)[size_t(t * E + e)]; };
  for (int64_t e = 0; e < E; ++e) if (ok(e)) m = std::max(m, x[size_t(t * E + e)]);
  for (int64_t e = 0; e < E; ++e) s += (p[size_t(e)] = ok(e) ? std::exp(x[size_t(t * E + e)] - m) : 0.0);
  for (auto& v : p) v /= s;
  return p;
}

TEST(RouterBackward, SoftmaxV1V2) {
  const int64_t T = 5, E = 6;
  for (int64_t K : {int64_t(1), int64_t(3), E}) {
    for (int renorm : {0, 1}) {
      SCOPED_TRACE("K " + std::to_string(K) + " renorm " + std::to_string(renorm));
      Tensor x = randn(DType::f32, {T, E}, 1), dy = randn(DType::f32, {T, K}, 2);
      auto xv = to_vec(x), gv = to_vec(dy);
      std::vector<uint8_t> allowed(size_t(T * E), 1);
      allowed[1] = allowed[2] = 0;  // token 0 may not use experts 1 and 2
      auto key = xv;
      for (size_t i = 0; i < key.size(); ++i) if (!allowed[i]) key[i] = -1e300;
      bool use_mask = K < E - 1;
      auto ids = topk_ids(key, T, E, K);
      if (K < E) for (int64_t k = 0; k < K; ++k) ids[size_t(3 * K + k)] = E;  // token 3 finished
      Tensor idt = ints(DType::i32, {T, K}, ids);
      Tensor al = Tensor::empty(DType::u8, {T, E});
      std::copy(allowed.begin(), allowed.end(), al.ptr<uint8_t>());
      auto loss = [&] {
        double s = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (ids[size_t(t * K)] == E) continue;
          if (renorm == 0) {
            auto p = softmax64(xv, t, E, use_mask ? &allowed : nullptr);
            for (int64_t k = 0; k < K; ++k) s += gv[size_t(t * K + k)] * p[size_t(ids[size_t(t * K + k)])];
          } else {
            double z = 0;
            for (int64_t k = 0; k < K; ++k) z += std::exp(xv[size_t(t * E + ids[size_t(t * K + k)])]);
            for (int64_t k = 0; k < K; ++k) s += gv[size_t(t * K + k)] * std::exp(xv[size_t(t * E + ids[size_t(t * K + k)])]) / z;
          }
        }
        return s;
      };
      TensorView alv = use_mask ? TensorView(al) : TensorView();
      auto r = ref::moe_gating_top_k_softmax_v2_backward(dy, x, idt, renorm, alv);
      EXPECT_LT(rel_err(to_vec(r), fd_grad(xv, loss)), 1e-6);
      EXPECT_LT(rel_err(moe_gating_top_k_softmax_v2_backward(dy, x, idt, renorm, alv), r), 1e-6);
      if (renorm == 0) { EXPECT_LT(rel_err(moe_gating_top_k_softmax_backward(dy, x, idt, alv), r), 1e-6); }
      Tensor xb = randn(DType::bf16, {T, E}, 3), dyb = randn(DType::bf16, {T, K}, 4);
      EXPECT_LT(rel_err(moe_gating_top_k_softmax_v2_backward(dyb, xb, idt, renorm, alv), ref::moe_gating_top_k_softmax_v2_backward(dyb, xb, idt, renorm, alv)), 1e-5);
      if (K < E) { for (int64_t e = 0; e < E; ++e) { EXPECT_EQ(r.ptr<float>()[3 * E + e], 0.f); } }  // finished row
    }
  }
}

TEST(RouterBackward, GatingTopKAndRenorm) {
  const int64_t T = 4, E = 8, K = 3;
  for (int norm_type : {0, 1})
    for (int renorm : {0, 1}) {
      SCOPED_TRACE("norm_type " + std::to_string(norm_type) + " renorm " + std::to_string(renorm));
      const float rsf = 2.5f, eps = 1e-3f;  // a visible eps so its place in the formula is tested
      Tensor x = randn(DType::f32, {T, E}, 5), dy = randn(DType::f32, {T, K}, 6), bias = randn(DType::f32, {E}, 7);
      auto xv = to_vec(x), gv = to_vec(dy), bv = to_vec(bias);
      auto scores_of = [&](const std::vector<double>& xs) {
        std::vector<double> s(xs.size());
        for (int64_t t = 0; t < T; ++t) {
          auto p = softmax64(xs, t, E);
          for (int64_t e = 0; e < E; ++e) s[size_t(t * E + e)] = norm_type ? 1 / (1 + std::exp(-xs[size_t(t * E + e)])) : p[size_t(e)];
        }
        return s;
      };
      auto s0 = scores_of(xv), key = s0;
      for (int64_t t = 0; t < T; ++t) for (int64_t e = 0; e < E; ++e) key[size_t(t * E + e)] += bv[size_t(e)];  // selection only
      auto ids = topk_ids(key, T, E, K);
      auto loss = [&] {
        auto s = scores_of(xv);
        double L = 0;
        for (int64_t t = 0; t < T; ++t) {
          double S = 0;
          for (int64_t k = 0; k < K; ++k) S += s[size_t(t * E + ids[size_t(t * K + k)])];
          for (int64_t k = 0; k < K; ++k) {
            double v = s[size_t(t * E + ids[size_t(t * K + k)])];
            if (norm_type == 1 || renorm == 1) v /= S + eps;
            L += gv[size_t(t * K + k)] * rsf * v;
          }
        }
        return L;
      };
      Tensor sc = from_vec(DType::f32, {T, E}, s0), idt = ints(DType::i32, {T, K}, ids);
      auto r = ref::moe_gating_top_k_backward(dy, sc, idt, renorm, norm_type, rsf, eps);
      EXPECT_LT(rel_err(to_vec(r), fd_grad(xv, loss)), 1e-5);
      EXPECT_LT(rel_err(moe_gating_top_k_backward(dy, sc, idt, renorm, norm_type, rsf, eps), r), 1e-6);
    }
  // Renormalised weights w = y / sum(y).
  Tensor y = randn(DType::f32, {T, K}, 8, 0.1), dw = randn(DType::f32, {T, K}, 9);
  for (int64_t i = 0; i < T * K; ++i) y.ptr<float>()[i] = std::fabs(y.ptr<float>()[i]) + 0.05f;
  auto yv = to_vec(y), gv = to_vec(dw);
  auto loss = [&] {
    double L = 0;
    for (int64_t t = 0; t < T; ++t) {
      double S = 0;
      for (int64_t k = 0; k < K; ++k) S += yv[size_t(t * K + k)];
      for (int64_t k = 0; k < K; ++k) L += gv[size_t(t * K + k)] * yv[size_t(t * K + k)] / S;
    }
    return L;
  };
  auto r = ref::topk_renorm_backward(dw, y);
  EXPECT_LT(rel_err(to_vec(r), fd_grad(yv, loss)), 1e-6);
  EXPECT_LT(rel_err(topk_renorm_backward(dw, y), r), 1e-6);
}

TEST(LossBackward, AuxAndZ) {
  const int64_t T = 6, E = 5, K = 2;
  Tensor probs = randn(DType::f32, {T, E}, 10), logits = randn(DType::f32, {T, E}, 11, 3.0);
  Tensor counts = ints(DType::i64, {E}, {3, 0, 5, 2, 2});
  auto pv = to_vec(probs), lv = to_vec(logits);
  const float coeff = 0.7f;
  auto aux = [&] {
    double L = 0;
    for (int64_t i = 0; i < E; ++i) {
      double P = 0;
      for (int64_t t = 0; t < T; ++t) P += pv[size_t(t * E + i)];
      L += get_as_double(counts, i) * P;
    }
    return coeff * double(E) / (double(K) * T * T) * L;
  };
  auto ra = ref::moe_aux_loss_backward(probs, counts, K, coeff);
  EXPECT_LT(rel_err(to_vec(ra), fd_grad(pv, aux)), 1e-6);
  EXPECT_LT(rel_err(moe_aux_loss_backward(probs, counts, K, coeff), ra), 1e-6);
  EXPECT_LT(rel_err(moe_aux_loss_backward(probs, counts, K, coeff, 3.f), from_vec(DType::f32, {T, E}, [&] { auto v = to_vec(ra); for (auto& x : v) x *= 3; return v; }())), 1e-6);
  Tensor mask = Tensor::empty(DType::u8, {T});
  for (int64_t t = 0; t < T; ++t) mask.ptr<uint8_t>()[t] = t != 2;
  for (bool use_mask : {false, true}) {
    auto z = [&] {
      double L = 0;
      int n = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (use_mask && t == 2) continue;
        double m = -1e300, s = 0;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, lv[size_t(t * E + e)]);
        for (int64_t e = 0; e < E; ++e) s += std::exp(lv[size_t(t * E + e)] - m);
        L += (m + std::log(s)) * (m + std::log(s));
        ++n;
      }
      return coeff * L / n;
    };
    TensorView mv = use_mask ? TensorView(mask) : TensorView();
    auto rz = ref::moe_z_loss_backward(logits, coeff, mv);
    EXPECT_LT(rel_err(to_vec(rz), fd_grad(lv, z)), 1e-6);
    EXPECT_LT(rel_err(moe_z_loss_backward(logits, coeff, mv), rz), 1e-6);
  }
}

TEST(RouterBackwardErrors, BadInputNamesTheArgument) {
  Tensor x = randn(DType::f32, {3, 4}, 1), dy = randn(DType::f32, {3, 2}, 2);
  Tensor ids = ints(DType::i32, {3, 2}, {0, 1, 2, 3, 1, 0});
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(dy, x, ints(DType::i64, {3, 2}, {0, 1, 2, 3, 1, 0})); }), "expert_idx");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(dy, x, ints(DType::i32, {3, 2}, {0, 1, 2, 5, 1, 0})); }), "expert_idx");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(dy, x, ints(DType::i32, {3, 2}, {0, 4, 2, 3, 1, 0})); }), "expert_idx");  // half-finished row
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(randn(DType::f32, {2, 2}, 3), x, ids); }), "dy");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(dy, randn(DType::f32, {3}, 3), ids); }), "x");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_backward(dy, x, ids, randn(DType::f32, {3, 4}, 4)); }), "allowed");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_softmax_v2_backward(dy, x, ids, 2); }), "renorm");
  EXPECT_EQ(err_arg([&] { moe_gating_top_k_backward(dy, x, ids, 0, 2); }), "norm_type");
  EXPECT_EQ(err_arg([&] { topk_renorm_backward(randn(DType::f32, {3, 3}, 5), dy); }), "dw");
  EXPECT_EQ(err_arg([&] { moe_aux_loss_backward(x, ints(DType::i64, {3}, {1, 2, 3}), 2); }), "tokens_per_expert");
  EXPECT_EQ(err_arg([&] { moe_aux_loss_backward(x, ints(DType::i64, {4}, {1, 2, 3, 4}), 0); }), "k");
  EXPECT_EQ(err_arg([&] { moe_z_loss_backward(x, 1.f, ints(DType::i32, {3}, {1, 1, 1})); }), "mask");
}

}  // namespace

}  // namespace test_router_backward
