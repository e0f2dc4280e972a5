// Routers: fast path vs reference over shapes and dtypes, hand-computed cases, ties, masks, errors.
#include "helpers.h"

#include <algorithm>

#include "ot/cpu.h"
#include "ot/trace.h"

namespace test_router {
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

TEST(MoeRouter, GatingTopKBiasDtypesAndStrides) {
  // The bias is read in its own dtype and strides (here column 1 of an [E, 3] tensor whose other
  // columns would win the choice): fast path and reference vs the same values as contiguous fp32.
  for (int64_t E : {16, 64, 256}) {
    std::vector<double> b(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) b[size_t(e)] = double((e * 37) % E - E / 2) / 64;  // distinct, exact in bf16 / fp16
    Tensor ref_bias = floats(DType::f32, {E}, b);
    for (DType t : float_types())
      for (bool strided : {false, true}) {
        Tensor hold = Tensor::empty(t, {E, 3});
        for (int64_t e = 0; e < E; ++e)
          for (int64_t c = 0; c < 3; ++c) set_from_double(hold, e * 3 + c, c == 1 ? b[size_t(e)] : double(e) + 8);
        Tensor flat = floats(t, {E}, b);
        TensorView bias = strided ? hold.view().select(1, 1) : flat.view();
        ASSERT_EQ(bias.is_contiguous(), !strided);
        GatingTopKOptions o;
        o.k = 4; o.norm_type = 1; o.routed_scaling_factor = 2.f; o.bias = bias;
        // x = 0: every score is 0.5, the bias alone picks the experts (largest b first).
        Tensor zero = Tensor::zeros(DType::f32, {3, E});
        std::vector<int64_t> order(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return b[size_t(a)] > b[size_t(c)]; });
        GatingResult g = moe_gating_top_k(zero, o), gr = ref::moe_gating_top_k(zero, o);
        for (int64_t r = 0; r < 3; ++r)
          for (int64_t j = 0; j < 4; ++j) {
            EXPECT_EQ(g.expert_idx.ptr<int32_t>()[r * 4 + j], order[size_t(j)]) << dtype_name(t) << " strided " << strided << " E " << E;
            EXPECT_EQ(gr.expert_idx.ptr<int32_t>()[r * 4 + j], order[size_t(j)]) << dtype_name(t) << " strided " << strided << " E " << E;
          }
        Tensor x = randn(DType::f32, {37, E}, uint32_t(E), 0.5f);
        GatingTopKOptions want = o;
        want.bias = ref_bias;
        expect_router_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, want), DType::f32);
        expect_router_match(ref::moe_gating_top_k(x, o), ref::moe_gating_top_k(x, want), DType::f32);
      }
    // A non-finite bias is named, in any dtype and strides.
    Tensor nan_hold = Tensor::zeros(DType::bf16, {E, 2});
    set_from_double(nan_hold, 2 * (E - 1), NAN);
    GatingTopKOptions o;
    o.k = 2; o.bias = nan_hold.view().select(1, 0);
    EXPECT_OT_ERROR(moe_gating_top_k(randn(DType::f32, {2, E}, 1), o), "bias");
  }
}

// The ops build their trace strings only while tracing is on; on, each event still names its
// kernel and shapes (routers, permute, unpermute).
TEST(MoeRouter, TraceNamesKernelAndShapesWhenOn) {
  Tensor x = randn(DType::f32, {6, 16}, 4);
  trace::take_events();
  trace::set_timeline(true);
  GatingResult g = moe_gating_top_k_softmax(x, 2);
  GatingTopKOptions o;
  o.k = 2; o.norm_type = 1;
  moe_gating_top_k(x, o);
  Tensor tokens = randn(DType::bf16, {6, 32}, 5);
  TokenPermuteResult p = moe_token_permute(tokens, g.expert_idx);
  moe_token_unpermute(p.permuted_tokens, p.sorted_indices, g.y);
  trace::set_timeline(false);
  std::vector<trace::Event> ev = trace::take_events();
  ASSERT_EQ(ev.size(), 4u);
  const char* names[] = {"moe_gating_top_k_softmax", "moe_gating_top_k", "moe_token_permute", "moe_token_unpermute"};
  const char* shapes[] = {"[6, 16]", "[6, 16]", "[6, 32]", "[12, 32]"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ev[i].name, names[i]);
    EXPECT_FALSE(ev[i].kernel.empty()) << names[i];
    EXPECT_NE(ev[i].args.find(shapes[i]), std::string::npos) << names[i] << ": " << ev[i].args;
  }
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

}  // namespace test_router
