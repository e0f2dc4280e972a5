// The spec's NumPy-reference rules (moe_ops.md 4.3 quantisation, 8.1 / 8.2 permute and unpermute)
// on small inputs worked out by hand, where test_routing.cpp has no hand-valued case.
#include "helpers.h"

namespace test_spec_examples {
using namespace ot;
using namespace ot::moe;
using namespace mt;

// 8.1: perm = stable_argsort(indices.flat); sorted_indices[perm[i]] = i; permuted[i] = tokens[perm[i] // K]
// for i < rows (num_out_tokens > 0: min(v, T*K); < 0: T*K + v, at least 0).
// indices [[1, 0], [0, 2], [1, 1]]: perm = [1, 2, 0, 4, 5, 3].
TEST(MoeSpecExamples, TokenPermuteNumOutTokens) {
  Tensor x = floats(DType::f32, {3, 1}, {10, 11, 12});
  Tensor idx = ints({3, 2}, {1, 0, 0, 2, 1, 1});
  TokenPermuteResult all = moe_token_permute(x, idx);
  EXPECT_EQ(values(all.sorted_indices), (std::vector<double>{2, 0, 1, 5, 3, 4}));
  EXPECT_EQ(values(all.permuted_tokens), (std::vector<double>{10, 11, 10, 12, 12, 11}));
  for (int64_t n : {int64_t(4), int64_t(-2)}) {
    TokenPermuteResult p = moe_token_permute(x, idx, n);
    EXPECT_EQ(values(p.sorted_indices), (std::vector<double>{2, 0, 1, 5, 3, 4})) << n;  // positions >= rows kept
    EXPECT_EQ(values(p.permuted_tokens), (std::vector<double>{10, 11, 10, 12})) << n;
  }
  EXPECT_EQ(moe_token_permute(x, idx, 9).permuted_tokens.size(0), 6);
  EXPECT_EQ(moe_token_permute(x, idx, -7).permuted_tokens.size(0), 0);
}

// 8.2: out[t] = sum_k valid ? permuted[d] * probs[t, k] : 0 with d = sorted_indices[t*K + k],
// valid = 0 <= d < P and probs != 0 (vllm-ascend passes -1 with prob 0 for other ranks' experts).
TEST(MoeSpecExamples, TokenUnpermuteSkipsDroppedRows) {
  Tensor permuted = floats(DType::f32, {4, 1}, {10, 11, 10, 12});  // P = 4 of 6 rows kept
  Tensor probs = floats(DType::f32, {3, 2}, {0.5, 0.25, 1, 2, 4, 8});
  // t0: 10*0.5 + 10*0.25; t1: 11*1 + (d 5 >= P); t2: 12*4 + (d 4 >= P)
  Tensor u = moe_token_unpermute(permuted, ints({6}, {2, 0, 1, 5, 3, 4}), probs);
  EXPECT_EQ(values(u), (std::vector<double>{7.5, 11, 48}));
  // -1 entries with prob 0: t0 10*0.5; t1 11*1 + 10*2; t2 12*4.
  Tensor probs0 = floats(DType::f32, {3, 2}, {0.5, 0, 1, 2, 4, 0});
  Tensor u0 = moe_token_unpermute(permuted, ints({6}, {2, -1, 1, 0, 3, -1}), probs0);
  EXPECT_EQ(values(u0), (std::vector<double>{5, 31, 48}));
  expect_same(u0, ref::moe_token_unpermute(permuted, ints({6}, {2, -1, 1, 0, 3, -1}), probs0), "reference");
}

// 4.3 quant_mode 0: q = clip(rint(x * scale + offset), -128, 127), ties to even; no expanded_scale.
TEST(MoeSpecExamples, InitRoutingStaticQuant) {
  Tensor x = floats(DType::f32, {1, 5}, {1, -2, 0.25, 20, -20});
  InitRoutingV2Options o;
  o.expert_num = 1; o.quant_mode = 0;
  Tensor scale = floats(DType::f32, {1}, {10}), offset = floats(DType::f32, {1}, {0.5});  // viewed by o
  o.scale = scale;
  o.offset = offset;
  InitRoutingV2Result r = moe_init_routing_v2(x, ints({1, 1}, {0}), o);
  ASSERT_EQ(r.expanded_x.dtype(), DType::i8);
  // 10.5 -> 10, -19.5 -> -20, 3 -> 3, 200.5 -> 127, -199.5 -> -128
  EXPECT_EQ(values(r.expanded_x), (std::vector<double>{10, -20, 3, 127, -128}));
  EXPECT_FALSE(r.expanded_scale.defined());
  expect_same(r.expanded_x, ref::moe_init_routing_v2(x, ints({1, 1}, {0}), o).expanded_x, "reference");
  // Non-finite x: +-Inf saturate, NaN quantises to 0 (the rule in src/moe/common.h quant_i8), both paths.
  Tensor bad = floats(DType::f32, {1, 3}, {HUGE_VAL, -HUGE_VAL, 1});
  bad.ptr<float>()[2] = std::nanf("");
  InitRoutingV2Result nf = moe_init_routing_v2(bad, ints({1, 1}, {0}), o);
  EXPECT_EQ(values(nf.expanded_x), (std::vector<double>{127, -128, 0}));
  expect_same(nf.expanded_x, ref::moe_init_routing_v2(bad, ints({1, 1}, {0}), o).expanded_x, "reference, non-finite");
}

// 4.3 quant_mode 1: xs = x * smooth; d = max|xs| / 127; q = round_half_even(xs / d); expanded_scale = d.
TEST(MoeSpecExamples, InitRoutingDynamicQuant) {
  Tensor x = floats(DType::f32, {1, 4}, {1, -3, 0.5, 4});
  InitRoutingV2Options o;
  o.expert_num = 1; o.quant_mode = 1;
  InitRoutingV2Result r = moe_init_routing_v2(x, ints({1, 1}, {0}), o);
  // d = 4/127; x/d = 31.75, -95.25, 15.875, 127
  EXPECT_EQ(values(r.expanded_x), (std::vector<double>{32, -95, 16, 127}));
  EXPECT_FLOAT_EQ(r.expanded_scale.ptr<float>()[0], 4.f / 127.f);
  // A smooth scale [1, H] multiplies first: xs = {2, -3, 1, 2}, d = 3/127, xs/d = 84.67, -127, 42.33, 84.67
  Tensor smooth = floats(DType::f32, {1, 4}, {2, 1, 2, 0.5});  // viewed by o
  o.scale = smooth;
  InitRoutingV2Result s = moe_init_routing_v2(x, ints({1, 1}, {0}), o);
  EXPECT_EQ(values(s.expanded_x), (std::vector<double>{85, -127, 42, 85}));
  EXPECT_FLOAT_EQ(s.expanded_scale.ptr<float>()[0], 3.f / 127.f);
  // An all-zero row: scale 0, q 0.
  o.scale = {};
  InitRoutingV2Result z = moe_init_routing_v2(Tensor::zeros(DType::f32, {1, 4}), ints({1, 1}, {0}), o);
  EXPECT_EQ(values(z.expanded_x), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(z.expanded_scale.ptr<float>()[0], 0.f);
}

}  // namespace test_spec_examples
