// Routers: fast path vs reference over shapes and dtypes, hand-computed cases, ties, masks, errors.
#include "helpers.h"

#include "ot/cpu.h"

using namespace ot;
using namespace ot::moe;
using namespace mt;

static void expect_router_match(const GatingResult& f, const GatingResult& r, DType t) {
  expect_same(f.expert_idx, r.expert_idx, "expert_idx");
  EXPECT_LE(nerr(f.y, r.y), tol(t));
  if (r.row_idx.defined()) {
    expect_same(f.row_idx, r.row_idx, "row_idx");
  }
  if (r.scores.defined()) {
    EXPECT_LE(nerr(f.scores, r.scores), 1e-5);
  }
}

TEST(MoeRouter, SoftmaxV1MatchesReference) {
  for (DType t : float_types()) {
    for (int64_t T : {0, 1, 7, 513}) {
      for (int64_t k : {1, 2, 8}) {
        Tensor x = randn(t, {T, 8}, uint32_t(T * 10 + k), 2.f);
        Tensor fin = Tensor::zeros(DType::u8, {T});
        for (int64_t i = 0; i < T; i += 3) fin.ptr<uint8_t>()[i] = 1;
        expect_router_match(moe_gating_top_k_softmax(x, k, fin), ref::moe_gating_top_k_softmax(x, k, fin), t);
      }
    }
  }
}

TEST(MoeRouter, SoftmaxV1HandCase) {
  // softmax([0, ln 3, ln 2, ln 2]) = [1/8, 3/8, 2/8, 2/8]: the tie between experts 2 and 3 goes to 2.
  Tensor x = floats(DType::f32, {2, 4}, {0, std::log(3.0), std::log(2.0), std::log(2.0), 1, 1, 1, 1});
  Tensor fin = Tensor::zeros(DType::u8, {2});
  fin.ptr<uint8_t>()[1] = 1;
  GatingResult g = moe_gating_top_k_softmax(x, 2, fin);
  EXPECT_EQ(values(g.expert_idx), (std::vector<double>{1, 2, 4, 4}));  // finished row: ids = E
  EXPECT_NEAR(g.y.ptr<float>()[0], 3.0 / 8, 1e-6);
  EXPECT_NEAR(g.y.ptr<float>()[1], 2.0 / 8, 1e-6);
  EXPECT_NEAR(g.y.ptr<float>()[2], 0.25, 1e-6);
  EXPECT_EQ(values(g.row_idx), (std::vector<double>{0, 2, 1, 3}));  // k-major: s*R + r
}

TEST(MoeRouter, ThreeDimInputAndKEqualsE) {
  Tensor x = randn(DType::bf16, {2, 3, 6}, 5);
  GatingResult g = moe_gating_top_k_softmax(x, 6);
  EXPECT_EQ(g.y.shape(), (std::vector<int64_t>{2, 3, 6}));
  expect_router_match(g, ref::moe_gating_top_k_softmax(x, 6), DType::bf16);
  double s = 0;
  for (int j = 0; j < 6; ++j) s += get_as_double(g.y, j);
  EXPECT_NEAR(s, 1.0, 2e-2);
}

TEST(MoeRouter, SoftmaxV2Renorm) {
  for (DType t : float_types())
    for (int renorm : {0, 1}) {
      Tensor x = randn(t, {65, 16}, 7 + renorm);
      expect_router_match(moe_gating_top_k_softmax_v2(x, 4, {}, renorm, true), ref::moe_gating_top_k_softmax_v2(x, 4, {}, renorm, true), t);
    }
  // renorm 1: softmax over the k selected logits only (Mixtral).
  Tensor x = floats(DType::f32, {1, 4}, {0, 2, 1, -5});
  GatingResult g = moe_gating_top_k_softmax_v2(x, 2, {}, 1, true);
  EXPECT_EQ(values(g.expert_idx), (std::vector<double>{1, 2}));
  EXPECT_NEAR(g.y.ptr<float>()[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_FALSE(g.scores.defined());
  GatingResult g0 = moe_gating_top_k_softmax_v2(x, 2, {}, 0, true);
  EXPECT_TRUE(g0.scores.defined());
  EXPECT_NEAR(g0.scores.ptr<float>()[3], std::exp(-5.0) / (1 + std::exp(2.0) + std::exp(1.0) + std::exp(-5.0)), 1e-6);
}

TEST(MoeRouter, GatingTopKMatchesReference) {
  for (DType t : float_types())
    for (int norm : {0, 1})
      for (int mode : {0, 1})
        for (int64_t groups : {1, 4}) {
          GatingTopKOptions o;
          o.k = 4; o.norm_type = norm; o.group_select_mode = mode; o.group_count = groups; o.k_group = groups > 1 ? 2 : 1;
          o.routed_scaling_factor = 2.5f; o.out_flag = true;
          Tensor bias = randn(DType::f32, {16}, 3, 0.1f);
          o.bias = bias;
          Tensor x = randn(t, {37, 16}, uint32_t(norm * 8 + mode * 4 + groups));
          expect_router_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t);
        }
}

TEST(MoeRouter, GatingTopKBiasSelectsOnlyAndGroupsLimit) {
  // sigmoid(0) = 0.5 everywhere; the bias alone decides the choice, the weights stay unbiased.
  Tensor x = Tensor::zeros(DType::f32, {1, 8});
  Tensor bias = floats(DType::f32, {8}, {0, 0, 0, 0, 0, 0.3, 0, 0.2});
  GatingTopKOptions o;
  o.k = 2; o.norm_type = 1; o.bias = bias; o.routed_scaling_factor = 3.f;
  GatingResult g = moe_gating_top_k(x, o);
  EXPECT_EQ(values(g.expert_idx), (std::vector<double>{5, 7}));
  EXPECT_NEAR(g.y.ptr<float>()[0], 1.5, 1e-6);  // 0.5 / (0.5 + 0.5) * 3
  // Groups of 2: group scores (max) are {0.5, 0.5, 0.8, 0.7}; keep 1 group -> experts 4, 5.
  o.group_count = 4; o.k_group = 1;
  g = moe_gating_top_k(x, o);
  EXPECT_EQ(values(g.expert_idx), (std::vector<double>{5, 4}));
  // Softmax path: no renormalisation, only the scaling factor.
  GatingTopKOptions s;
  s.k = 1; s.routed_scaling_factor = 2.f;
  g = moe_gating_top_k(floats(DType::f32, {1, 2}, {0, 0}), s);
  EXPECT_EQ(values(g.expert_idx), (std::vector<double>{0}));  // tie -> lower id
  EXPECT_NEAR(g.y.ptr<float>()[0], 1.0, 1e-6);
}

TEST(MoeRouter, AllowedMaskRestrictsChoice) {
  Tensor x = randn(DType::bf16, {33, 8}, 9);
  Tensor allowed = Tensor::zeros(DType::u8, {33, 8});
  for (int64_t t = 0; t < 33; ++t)
    for (int64_t e = 0; e < 8; ++e) allowed.ptr<uint8_t>()[t * 8 + e] = (t % 2 == 0) == (e < 4);  // "image" tokens -> experts 0..3
  GatingResult f = moe_gating_top_k_softmax(x, 2, {}, allowed);
  expect_router_match(f, ref::moe_gating_top_k_softmax(x, 2, {}, allowed), DType::bf16);
  for (int64_t t = 0; t < 33; ++t)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(f.expert_idx.ptr<int32_t>()[t * 2 + j] < 4, t % 2 == 0);
  expect_router_match(moe_gating_top_k_softmax_v2(x, 2, {}, 1, false, allowed), ref::moe_gating_top_k_softmax_v2(x, 2, {}, 1, false, allowed),
                      DType::bf16);
  GatingTopKOptions o;
  o.k = 3; o.norm_type = 1; o.allowed = allowed;
  expect_router_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::bf16);
}

TEST(MoeRouter, ForceRefRoutesToReference) {
  Tensor x = randn(DType::f32, {5, 8}, 1);
  cpu::ScopedForceRef on(true);
  expect_router_match(moe_gating_top_k_softmax(x, 2), ref::moe_gating_top_k_softmax(x, 2), DType::f32);
}

TEST(MoeRouter, BadInput) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 9), "k");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 0), "k");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(randn(DType::f32, {2, 2000}, 1), 1025), "k");
  Tensor bad = Tensor::copy_of(x);
  bad.ptr<float>()[5] = NAN;
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(bad, 2), "x");
  bad.ptr<float>()[5] = INFINITY;
  EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(bad, 2), "x");
  EXPECT_OT_ERROR(moe_gating_top_k(bad, GatingTopKOptions{}), "x");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 2, Tensor::zeros(DType::u8, {3})), "finished");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 2, Tensor::zeros(DType::i32, {4})), "finished");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 2, {}, Tensor::zeros(DType::u8, {4, 8})), "allowed");  // no allowed expert
  EXPECT_OT_ERROR(moe_gating_top_k_softmax(Tensor::zeros(DType::i32, {4, 8}), 2), "x");
  EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(x, 2, {}, 2), "renorm");
  GatingTopKOptions o;
  o.k = 2; o.group_count = 3;
  EXPECT_OT_ERROR(moe_gating_top_k(x, o), "group_count");
  o.group_count = 4; o.k_group = 5;
  EXPECT_OT_ERROR(moe_gating_top_k(x, o), "k_group");
  o.k_group = 1; o.k = 3;
  EXPECT_OT_ERROR(moe_gating_top_k(x, o), "k");
  o.k = 2; o.bias = randn(DType::f32, {7}, 1);
  EXPECT_OT_ERROR(moe_gating_top_k(x, o), "bias");
  o.bias = {}; o.norm_type = 2;
  EXPECT_OT_ERROR(moe_gating_top_k(x, o), "norm_type");
}
