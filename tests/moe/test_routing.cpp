// Init routing v1/v2, expert token counts, re-routing, permute/unpermute: fast vs reference,
// hand-computed cases (the spec's NumPy-reference semantics), capacity, ranges, quant, errors.
#include "helpers.h"
#include "src/core/knobs.h"
#include "ot/quant.h"

namespace test_routing {
using namespace ot;
using namespace ot::moe;
using namespace mt;

static void same_v2(const InitRoutingV2Result& a, const InitRoutingV2Result& b) {
  expect_same(a.expanded_x, b.expanded_x, "expanded_x");
  expect_same(a.expanded_row_idx, b.expanded_row_idx, "expanded_row_idx");
  expect_same(a.expert_tokens, b.expert_tokens, "expert_tokens");
  EXPECT_EQ(a.expanded_scale.defined(), b.expanded_scale.defined());
  if (b.expanded_scale.defined()) expect_same(a.expanded_scale, b.expanded_scale, "expanded_scale");
  EXPECT_EQ(a.dropped, b.dropped);
  EXPECT_EQ(a.available, b.available);
}

TEST(MoeInitRouting, V1HandCase) {
  // x rows are their token id; ids [[2,0],[0,1],[2,1]] sorted stably: (0,k1)->0 (1,k0)->1 (1,k1)->2 (2,k1)->3 (0,k0)->4 (2,k0)->5.
  Tensor x = floats(DType::f32, {3, 2}, {0, 0, 1, 1, 2, 2});
  Tensor ids = ints({3, 2}, {2, 0, 0, 1, 2, 1});
  Tensor row = moe_gating_top_k_softmax(randn(DType::f32, {3, 4}, 1), 2).row_idx;  // k-major k*N+n
  InitRoutingResult r = moe_init_routing(x, row, ids, 3);
  EXPECT_EQ(values(r.expanded_expert_idx), (std::vector<double>{0, 0, 1, 1, 2, 2}));
  // expanded_row_idx indexed by c = k*N + n: c0=(0,k0)->4, c1=(1,k0)->1, c2=(2,k0)->5, c3=(0,k1)->0, c4=(1,k1)->2, c5=(2,k1)->3
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{4, 1, 5, 0, 2, 3}));
  EXPECT_EQ(values(r.expanded_x), (std::vector<double>{0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 2, 2}));
  InitRoutingResult r1 = moe_init_routing(x, row, ids, 1);  // active_num counts tokens: 1*K rows
  EXPECT_EQ(r1.expanded_x.size(0), 2);
}

TEST(MoeInitRouting, V1MatchesReference) {
  for (DType t : float_types())
    for (int64_t T : {0, 1, 7, 513}) {
      Tensor x = randn(t, {T, 12}, uint32_t(T));
      Tensor ids = rand_ids(T, 3, 8, uint32_t(T + 1));
      Tensor row = moe_gating_top_k_softmax(randn(DType::f32, {T, 8}, 2), 3).row_idx;
      for (int64_t active : {int64_t(0), T / 2, T}) {
        InitRoutingResult f = moe_init_routing(x, row, ids, active), r = ref::moe_init_routing(x, row, ids, active);
        expect_same(f.expanded_x, r.expanded_x, "x");
        expect_same(f.expanded_row_idx, r.expanded_row_idx, "row");
        expect_same(f.expanded_expert_idx, r.expanded_expert_idx, "expert");
      }
    }
}

TEST(MoeInitRouting, V2HandCaseCountsAndIndexForms) {
  Tensor x = floats(DType::f32, {3, 2}, {0, 0, 1, 1, 2, 2});
  Tensor ids = ints({3, 2}, {2, 0, 0, 1, 2, 1});
  InitRoutingV2Options o;
  o.expert_num = 3;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);  // gather form, cumsum
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{4, 0, 1, 2, 5, 3}));  // token-major j -> dst
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(values(r.expanded_x), (std::vector<double>{0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 2, 2}));
  o.expert_tokens_num_type = 1;
  o.row_idx_type = 1;
  r = moe_init_routing_v2(x, ids, o);
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{1, 2, 3, 5, 0, 4}));  // dst -> src j
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{2, 2, 2}));
  // key_value over the range [1, 3): only experts 1 and 2; expert 0's pairs are excluded (-1).
  o = {};
  o.expert_num = 4; o.expert_tokens_num_type = 2; o.active_expert_range[0] = 1; o.active_expert_range[1] = 3;
  r = moe_init_routing_v2(x, ids, o);
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{1, 2, 2, 2, 0, 0, 0, 0}));
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{2, -1, -1, 0, 3, 1}));
  EXPECT_EQ(r.available, 4);
  // Drop/pad with capacity 1: the later token of each expert is dropped, empty slots are zero.
  o = {};
  o.expert_num = 3; o.drop_pad_mode = 1; o.expert_capacity = 1;
  r = moe_init_routing_v2(x, ids, o);
  EXPECT_EQ(r.expanded_x.shape(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{2, 0, -1, 1, -1, -1}));
  EXPECT_EQ(values(r.expanded_x), (std::vector<double>{0, 0, 1, 1, 0, 0}));  // e0: token 0, e1: token 1, e2: token 0
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{2, 2, 2}));  // before capacity
  EXPECT_EQ(r.dropped, 3);
}

TEST(MoeInitRouting, V2MatchesReferenceEverywhere) {
  for (DType t : float_types())
    for (int64_t T : {0, 1, 7, 513}) {
      const int64_t E = 8, K = 2, H = 16;
      Tensor x = randn(t, {T, H}, uint32_t(T + 3));
      Tensor ids = rand_ids(T, K, E - 1, uint32_t(T + 4));  // expert 7 never chosen: an empty expert
      if (T > 2) ids.ptr<int32_t>()[1] = int32_t(E);         // a finished pair (id == E) is skipped
      Tensor smooth = randn(DType::f32, {4, H}, 11, 0.5f);
      Tensor tok_scale = randn(DType::f32, {T}, 12);
      for (int quant : {-1, 0, 1})
        for (int type : {0, 1, 2})
          for (int range : {0, 1})
            for (int64_t active : {int64_t(-1), T}) {
              InitRoutingV2Options o;
              o.expert_num = E; o.quant_mode = quant; o.expert_tokens_num_type = type; o.active_num = active;
              if (range) { o.active_expert_range[0] = 2; o.active_expert_range[1] = 6; }
              Tensor st = floats(DType::f32, {1}, {3.0});
              if (quant == 0) o.scale = st;
              if (quant == 1 && range) o.scale = smooth;
              if (quant == -1) o.scale = tok_scale;
              o.row_idx_type = type == 1 && quant == -1 ? 1 : 0;
              same_v2(moe_init_routing_v2(x, ids, o), ref::moe_init_routing_v2(x, ids, o));
            }
      for (int quant : {-1, 1})
        if (T > 0) {
          InitRoutingV2Options o;
          o.expert_num = E; o.drop_pad_mode = 1; o.expert_capacity = std::max<int64_t>(1, T / 8); o.quant_mode = quant;
          InitRoutingV2Result f = moe_init_routing_v2(x, ids, o);
          same_v2(f, ref::moe_init_routing_v2(x, ids, o));
          if (T == 513) {
            EXPECT_GT(f.dropped, 0);  // capacity overflow reported, not an error
          }
        }
    }
}

TEST(MoeInitRouting, DynamicQuantRoundTrips) {
  Tensor x = randn(DType::bf16, {9, 64}, 4);
  Tensor ids = rand_ids(9, 2, 4, 5);
  InitRoutingV2Options o;
  o.expert_num = 4; o.quant_mode = 1;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);
  InitRoutingV2Options po;
  po.expert_num = 4;
  InitRoutingV2Result plain = moe_init_routing_v2(x, ids, po);
  EXPECT_EQ(r.expanded_x.dtype(), DType::i8);
  EXPECT_EQ(ref::moe_init_routing_v2(x, ids, o).expanded_x.dtype(), DType::i8);
  for (int64_t i = 0; i < 18; ++i) {
    float d = r.expanded_scale.ptr<float>()[i];
    for (int64_t h = 0; h < 64; ++h) {
      float q = float(r.expanded_x.ptr<int8_t>()[i * 64 + h]);
      EXPECT_NEAR(q * d, get_as_double(plain.expanded_x, i * 64 + h), 0.51 * d + 1e-6);
    }
  }
}

// The shared dynamic int8 row quantiser (ot/numeric.h): ties to even, saturation, zero rows, and a
// NaN or Inf row -> scale NaN, codes 0, in init routing's fast path and reference alike.
TEST(MoeInitRouting, DynamicQuantTiesAndNonFiniteRows) {
  int8_t q[4];
  const float ties[4] = {127, 0.5f, 1.5f, -2.5f};  // d = 1
  EXPECT_EQ(quantize_row_i8_dynamic(ties, 4, q), 1.f);
  EXPECT_EQ(std::vector<int>(q, q + 4), (std::vector<int>{127, 0, 2, -2}));
  const float zero[4] = {0, -0.f, 0, 0};
  EXPECT_EQ(quantize_row_i8_dynamic(zero, 4, q), 0.f);
  EXPECT_EQ(std::vector<int>(q, q + 4), (std::vector<int>{0, 0, 0, 0}));
  for (float bad : {std::nanf(""), HUGE_VALF, -HUGE_VALF}) {
    const float row[4] = {1, bad, -2, 3};
    std::fill(q, q + 4, int8_t(7));
    EXPECT_TRUE(std::isnan(quantize_row_i8_dynamic(row, 4, q))) << bad;
    EXPECT_EQ(std::vector<int>(q, q + 4), (std::vector<int>{0, 0, 0, 0})) << bad;
  }
  // Through init routing v2 (quant_mode 1): token 1 holds a NaN, token 2 an Inf.
  Tensor x = randn(DType::f32, {4, 16}, 7);
  x.ptr<float>()[16 + 3] = std::nanf("");
  x.ptr<float>()[32 + 5] = HUGE_VALF;
  Tensor ids = ints({4, 1}, {0, 1, 0, 1});
  InitRoutingV2Options o;
  o.expert_num = 2; o.quant_mode = 1;
  InitRoutingV2Result f = moe_init_routing_v2(x, ids, o), r = ref::moe_init_routing_v2(x, ids, o);
  expect_same(f.expanded_x, r.expanded_x, "codes");
  const int32_t* dst = f.expanded_row_idx.ptr<int32_t>();
  for (int64_t t = 0; t < 4; ++t) {
    float fs = f.expanded_scale.ptr<float>()[dst[t]], rs = r.expanded_scale.ptr<float>()[dst[t]];
    EXPECT_EQ(std::isnan(fs), t == 1 || t == 2) << t;
    EXPECT_TRUE(fs == rs || (std::isnan(fs) && std::isnan(rs))) << t;
    for (int64_t h = 0; h < 16 && (t == 1 || t == 2); ++h) EXPECT_EQ(f.expanded_x.ptr<int8_t>()[dst[t] * 16 + h], 0) << t;
  }
}

TEST(MoeInitRouting, AllTokensOnOneExpert) {
  Tensor x = randn(DType::f32, {513, 8}, 1);
  std::vector<int32_t> v(513, 3);
  Tensor ids = ints({513, 1}, v);
  InitRoutingV2Options o;
  o.expert_num = 4; o.expert_tokens_num_type = 1;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{0, 0, 0, 513}));
  expect_same(r.expanded_x, x, "identity order");
}

TEST(MoeComputeExpertTokens, SpecExampleAndReference) {
  EXPECT_EQ(values(moe_compute_expert_tokens(ints({6}, {0, 0, 0, 1, 1, 2}), 3)), (std::vector<double>{3, 5, 6}));
  EXPECT_EQ(values(moe_compute_expert_tokens(ints({4}, {1, 1, 3, 3}), 5)), (std::vector<double>{0, 2, 2, 4, 4}));
  Tensor s = ints({5}, {0, 2, 2, 4, 6});
  expect_same(moe_compute_expert_tokens(s, 8), ref::moe_compute_expert_tokens(s, 8), "cumsum");
  EXPECT_EQ(values(moe_compute_expert_tokens(Tensor::empty(DType::i32, {0}), 2)), (std::vector<double>{0, 0}));
}

TEST(MoeReRouting, HandCaseAndReference) {
  // 2 ranks x 2 local experts, counts [[1,2],[2,0]]: rows r0e0 | r0e1 r0e1 | r1e0 r1e0 -> e0: r0, r1 r1; e1: r0 r0
  Tensor tokens = floats(DType::f32, {5, 1}, {10, 11, 12, 13, 14});
  Tensor cnt = ints({2, 2}, {1, 2, 2, 0});
  Tensor sc = floats(DType::f32, {5}, {0, 1, 2, 3, 4});
  ReRoutingResult r = moe_re_routing(tokens, cnt, sc);
  EXPECT_EQ(values(r.permute_tokens), (std::vector<double>{10, 13, 14, 11, 12}));
  EXPECT_EQ(values(r.permute_token_idx), (std::vector<double>{0, 3, 4, 1, 2}));
  EXPECT_EQ(values(r.permute_per_token_scales), (std::vector<double>{0, 3, 4, 1, 2}));
  EXPECT_EQ(values(r.expert_token_num), (std::vector<double>{3, 2}));
  Tensor big = randn(DType::bf16, {60, 8}, 3);
  Tensor c2 = ints({3, 4}, {5, 0, 7, 3, 2, 9, 0, 4, 10, 5, 5, 10});
  ReRoutingResult f = moe_re_routing(big, c2), g = ref::moe_re_routing(big, c2);
  expect_same(f.permute_tokens, g.permute_tokens, "tokens");
  expect_same(f.permute_token_idx, g.permute_token_idx, "idx");
  EXPECT_OT_ERROR(moe_re_routing(big, ints({1, 2}, {30, 29})), "expert_token_num_per_rank");
}

TEST(MoeTokenPermute, RoundTripAndReference) {
  for (DType t : float_types())
    for (int64_t T : {0, 1, 7, 513}) {
      const int64_t K = 2, H = 8;
      Tensor x = randn(t, {T, H}, uint32_t(T + 5));
      Tensor ids = rand_ids(T, K, 6, uint32_t(T + 6));
      for (int64_t n : {int64_t(0), T, -T / 2}) {
        TokenPermuteResult f = moe_token_permute(x, ids, n), r = ref::moe_token_permute(x, ids, n);
        expect_same(f.permuted_tokens, r.permuted_tokens, "permuted");
        expect_same(f.sorted_indices, r.sorted_indices, "sorted");
        Tensor probs = randn(DType::f32, {T, K}, 8);
        Tensor u = moe_token_unpermute(f.permuted_tokens, f.sorted_indices, probs);
        EXPECT_LE(nerr(u, ref::moe_token_unpermute(f.permuted_tokens, f.sorted_indices, probs)), tol(t));
        if (n == 0) {  // all rows kept: unpermute(permute(x)) = x * sum_k probs
          Tensor want = Tensor::empty(t, {T, H});
          for (int64_t i = 0; i < T * H; ++i)
            set_from_double(want, i, get_as_double(x, i) * (get_as_double(probs, i / H * K) + get_as_double(probs, i / H * K + 1)));
          EXPECT_LE(nerr(u, want), tol(t));
        }
      }
    }
}

// Rows of 1000 elements (128-lane blocks + a tail; 2000-byte bf16 rows are copied with memcpy) and
// outputs of 1056-element rows past the streaming bound (lowered to 4 MiB: non-temporal stores of
// 2112 / 4224 bytes, whole lines but not whole 256-byte chunks), for the copies in token order and
// the combine's prefetch distance.
TEST(MoeTokenPermute, LargeRowsMatchReference) {
  struct Shape { int64_t T, K, H, stream_min_kib; };  // the default bound, then the lowered one
  for (DType t : {DType::bf16, DType::f32})
    for (Shape s : {Shape{513, 8, 1000, 16 << 10}, Shape{256, 8, 1056, 4 << 10}}) {
      knobs::ScopedKnob stream_from("moe.stream_min_kib", s.stream_min_kib);
      Tensor x = randn(t, {s.T, s.H}, uint32_t(s.T + 7));
      Tensor ids = rand_ids(s.T, s.K, 16, uint32_t(s.T + 8));
      for (int64_t n : {int64_t(0), -s.T}) {  // all rows, and the first T*(K-1) kept
        TokenPermuteResult f = moe_token_permute(x, ids, n), r = ref::moe_token_permute(x, ids, n);
        expect_same(f.permuted_tokens, r.permuted_tokens, "permuted");
        expect_same(f.sorted_indices, r.sorted_indices, "sorted");
      }
      Tensor pad_idx = rand_ids(s.K, s.T, s.T, uint32_t(s.T + 9));  // [E = K, C = T] token ids
      expect_same(moe_token_permute(x, pad_idx, 0, true).permuted_tokens, ref::moe_token_permute(x, pad_idx, 0, true).permuted_tokens,
                  "padded");
      InitRoutingV2Options o;
      o.expert_num = 16;
      same_v2(moe_init_routing_v2(x, ids, o), ref::moe_init_routing_v2(x, ids, o));
      o.active_num = s.T * s.K / 2;
      same_v2(moe_init_routing_v2(x, ids, o), ref::moe_init_routing_v2(x, ids, o));
      Tensor row = moe_gating_top_k_softmax(randn(DType::f32, {s.T, 16}, 10), s.K).row_idx;
      for (int64_t active : {s.T, s.T / 3}) {
        InitRoutingResult f = moe_init_routing(x, row, ids, active), r = ref::moe_init_routing(x, row, ids, active);
        expect_same(f.expanded_x, r.expanded_x, "v1 x");
        expect_same(f.expanded_row_idx, r.expanded_row_idx, "v1 row");
      }
    }
  // Unpermute with an output >= 16 MiB (8000 x 1056 bf16), K 2, a zero prob (the row is skipped).
  for (DType t : {DType::bf16, DType::f32}) {
    const int64_t T = 8000, K = 2, H = 1056;
    Tensor x = randn(t, {T, H}, 11);
    Tensor ids = rand_ids(T, K, 16, 12);
    TokenPermuteResult pr = moe_token_permute(x, ids);
    Tensor probs = randn(DType::f32, {T, K}, 13);
    probs.ptr<float>()[5] = 0.f;
    Tensor u = moe_token_unpermute(pr.permuted_tokens, pr.sorted_indices, probs);
    EXPECT_LE(nerr(u, ref::moe_token_unpermute(pr.permuted_tokens, pr.sorted_indices, probs)), tol(t));
  }
}

TEST(MoeTokenPermute, PaddedMode) {
  Tensor x = floats(DType::f32, {3, 1}, {1, 2, 3});
  Tensor idx = ints({2, 2}, {0, 2, 1, 2});  // expert 0 keeps tokens 0, 2; expert 1 keeps 1, 2
  TokenPermuteResult p = moe_token_permute(x, idx, 0, true);
  EXPECT_EQ(values(p.permuted_tokens), (std::vector<double>{1, 3, 2, 3}));
  Tensor probs = floats(DType::f32, {2, 2}, {0.5, 0.25, 1, 0.75});
  Tensor u = moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs, true, 3);
  EXPECT_EQ(values(u), (std::vector<double>{0.5, 2, 3}));
  expect_same(u, ref::moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs, true, 3), "padded");
}

TEST(MoeRouting, BadInput) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  Tensor ids = rand_ids(4, 2, 4, 1);
  Tensor row = moe_gating_top_k_softmax(randn(DType::f32, {4, 4}, 1), 2).row_idx;
  Tensor ids64 = Tensor::zeros(DType::i64, {4, 2});
  EXPECT_OT_ERROR(moe_init_routing(x, row, ids64, 4), "expert_idx");
  EXPECT_OT_ERROR(moe_init_routing(x, row, ints({4, 2}, {0, 1, -1, 2, 0, 1, 0, 1}), 4), "expert_idx");
  EXPECT_OT_ERROR(moe_init_routing(x, ints({4, 2}, {0, 0, 1, 2, 3, 4, 5, 6}), ids, 4), "row_idx");
  EXPECT_OT_ERROR(moe_init_routing(x, row, ids, -1), "active_num");
  EXPECT_OT_ERROR(moe_init_routing(randn(DType::f32, {3, 8}, 1), row, ids, 4), "expert_idx");
  InitRoutingV2Options o;
  o.expert_num = 4;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids64, o), "expert_idx");
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ints({4, 2}, {0, 1, 5, 2, 0, 1, 0, 1}), o), "expert_idx");  // > E
  EXPECT_NO_THROW(moe_init_routing_v2(x, ints({4, 2}, {0, 1, 4, 2, 0, 1, 0, 1}), o));                // == E: finished
  o.drop_pad_mode = 1; o.expert_capacity = 0;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids, o), "expert_capacity");
  o.expert_capacity = 2; o.active_expert_range[0] = 1; o.active_expert_range[1] = 3;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids, o), "active_expert_range");
  o = {};
  o.expert_num = 4; o.active_expert_range[0] = 3; o.active_expert_range[1] = 2;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids, o), "active_expert_range");
  o = {};
  Tensor scale38 = randn(DType::f32, {3, 8}, 1);  // viewed by o
  o.expert_num = 4; o.quant_mode = 1; o.scale = scale38;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids, o), "scale");
  o = {};
  o.quant_mode = 2;
  EXPECT_OT_ERROR(moe_init_routing_v2(x, ids, o), "quant_mode");
  EXPECT_OT_ERROR(moe_compute_expert_tokens(ints({3}, {0, 2, 1}), 3), "sorted_experts");
  EXPECT_OT_ERROR(moe_compute_expert_tokens(ints({3}, {0, 1, 3}), 3), "sorted_experts");
  EXPECT_OT_ERROR(moe_token_permute(x, ids64), "indices");
  EXPECT_OT_ERROR(moe_token_permute(x, ints({4}, {0, 1, -2, 0})), "indices");
  EXPECT_OT_ERROR(moe_token_unpermute(x, ints({3}, {0, 1, 2}), randn(DType::f32, {2, 2}, 1)), "sorted_indices");
}

}  // namespace test_routing
