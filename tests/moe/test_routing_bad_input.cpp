// Bad inputs of the routing operators (init routing v1/v2, permute/unpermute, compute_expert_tokens,
// re_routing) that test_routing.cpp's BadInput does not cover. Each case checks the argument and the
// condition named, and is the only rule the call breaks.
#include "helpers.h"

namespace test_routing_bad_input {
using namespace ot;
using namespace ot::moe;
using namespace mt;

TEST(MoeRoutingBadInput, InitRoutingV1) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  Tensor ids = rand_ids(4, 2, 4, 1);
  Tensor row = moe_gating_top_k_softmax(randn(DType::f32, {4, 4}, 1), 2).row_idx;
  EXPECT_OT_ERROR_MSG(moe_init_routing(Tensor::zeros(DType::i32, {4, 8}), row, ids, 4), "x", "bf16, fp16 or fp32");
  EXPECT_OT_ERROR_MSG(moe_init_routing(randn(DType::f32, {32}, 1), row, ids, 4), "x", "2-D");
  EXPECT_OT_ERROR_MSG(moe_init_routing(x, Tensor::zeros(DType::i64, {4, 2}), ids, 4), "row_idx", "int32");
  EXPECT_OT_ERROR_MSG(moe_init_routing(x, ints({4, 1}, {0, 1, 2, 3}), ids, 4), "row_idx", "the shape of expert_idx");
  EXPECT_OT_ERROR_MSG(moe_init_routing(x, ints({4, 2}, {0, 1, 2, 3, 4, 5, 6, 8}), ids, 4), "row_idx", "ids in [0, 7]");
  EXPECT_OT_ERROR_MSG(moe_init_routing(x, row, ints({4, 2}, {0, 1, 1 << 24, 2, 0, 1, 0, 1}), 4), "expert_idx", "ids in [0, ");
  EXPECT_OT_ERROR_MSG(moe_init_routing(x, row, ints({8}, {0, 1, 2, 3, 0, 1, 2, 3}), 4), "expert_idx", "2-D");
}

TEST(MoeRoutingBadInput, InitRoutingV2) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  Tensor ids = rand_ids(4, 2, 4, 1);
  auto opts = [] {
    InitRoutingV2Options o;
    o.expert_num = 4;
    return o;
  };
  InitRoutingV2Options o = opts();
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(Tensor::zeros(DType::i32, {4, 8}), ids, o), "x", "bf16, fp16 or fp32");
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, rand_ids(3, 2, 4, 1), o), "expert_idx", "size 4 in dim 0");
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ints({4, 2}, {0, 1, -1, 2, 0, 1, 0, 1}), o), "expert_idx", "ids in [0, 4]");
  o.drop_pad_mode = 2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "drop_pad_mode", "0 or 1");
  o = opts(); o.expert_tokens_num_type = 3;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_tokens_num_type", "0, 1 or 2");
  o = opts(); o.row_idx_type = 2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "row_idx_type", "0 (gather) or 1 (scatter)");
  o = opts(); o.active_num = -2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "active_num", ">= -1");
  for (int64_t e : {int64_t(0), int64_t(10241), int64_t(-2)}) {
    o = opts(); o.expert_num = e;
    EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_num", "-1 or 1..10240");
  }
  // expert_num -1 (max id + 1) is allowed only dropless, without a range and without key_value.
  o = {}; o.drop_pad_mode = 1; o.expert_capacity = 2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_num", "given (>= 1)");
  o = {}; o.expert_tokens_num_type = 2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_num", "given (>= 1)");
  o = {}; o.active_expert_range[0] = 0; o.active_expert_range[1] = 2;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_num", "given (>= 1)");
  o = opts(); o.active_expert_range[0] = 1; o.active_expert_range[1] = 5;  // end > E
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "active_expert_range", "0 <= start < end <= expert_num = 4");
  o = opts(); o.active_expert_range[0] = 2; o.active_expert_range[1] = 2;  // empty
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "active_expert_range", "0 <= start < end");
  // Drop/pad: capacity in 1..N, gather index form only.
  o = opts(); o.drop_pad_mode = 1; o.expert_capacity = 5;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_capacity", "1 <= C <= N = 4");
  o.expert_capacity = -1;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "expert_capacity", "1 <= C <= N = 4");
  o.expert_capacity = 2; o.row_idx_type = 1;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "row_idx_type", "0 (gather) in drop/pad mode");
  // Scales and offsets (held here: the options only view them).
  Tensor s1 = floats(DType::f32, {1}, {2.0}), off_bf16 = Tensor::zeros(DType::bf16, {1}), off = floats(DType::f32, {1}, {0.0});
  Tensor tok3 = randn(DType::f32, {3}, 1), tok_bf16 = randn(DType::bf16, {4}, 1), smooth7 = randn(DType::f32, {1, 7}, 1);
  o = opts(); o.quant_mode = 0;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "scale", "[1] fp32 for static quant");
  o.scale = s1; o.offset = off_bf16;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "offset", "[1] fp32");
  o = opts(); o.offset = off;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "offset", "only with quant_mode 0");
  o = opts(); o.scale = tok3;  // per-token scale, N = 4
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "scale", "[N] = [4] per-token scale");
  o.scale = tok_bf16;
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "scale", "fp32");
  o = opts(); o.quant_mode = 1; o.scale = smooth7;  // smooth scale [1, H]
  EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "scale", "[1, H] or [end - start, H] = [4, 8]");
}

TEST(MoeRoutingBadInput, TokenPermuteUnpermute) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  Tensor ids = rand_ids(4, 2, 4, 1);
  EXPECT_OT_ERROR_MSG(moe_token_permute(Tensor::zeros(DType::i32, {4, 8}), ids), "tokens", "bf16, fp16, fp32 or int8");
  EXPECT_OT_ERROR_MSG(moe_token_permute(randn(DType::f32, {32}, 1), ids), "tokens", "2-D");
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, rand_ids(3, 2, 4, 1)), "indices", "size 4 in dim 0");
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, Tensor::zeros(DType::i32, {4, 2, 1})), "indices", "[T, K] or [T]");
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, Tensor::zeros(DType::i32, {4, 1025})), "indices", "K <= 1024");
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, ints({4}, {0, 1, 1 << 24, 0})), "indices", "ids in [0, ");
  // Padded mode: [E, C] token ids in [0, T).
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, ints({2, 2}, {0, 4, 1, 2}), 0, true), "indices", "ids in [0, 3]");
  EXPECT_OT_ERROR_MSG(moe_token_permute(x, ints({4}, {0, 1, 2, 3}), 0, true), "indices", "2-D");
  Tensor p = randn(DType::f32, {8, 8}, 2);
  Tensor si = ints({8}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor probs = randn(DType::f32, {4, 2}, 3);
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(Tensor::zeros(DType::i8, {8, 8}), si, probs), "permuted_tokens", "bf16, fp16 or fp32");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, Tensor::zeros(DType::i64, {8}), probs), "sorted_indices", "int32");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, ints({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}), probs), "sorted_indices", "1-D");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, si, Tensor::zeros(DType::i32, {4, 2})), "probs", "bf16, fp16 or fp32");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, si, randn(DType::f32, {8}, 3)), "probs", "2-D");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, si, probs, false, 5), "restore_rows", "-1 or T = 4");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, si, probs, true, -1), "restore_rows", "the token count T");
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, si, probs, true, 4), "sorted_indices", "ids in [0, 3]");  // token 7 of 4
  EXPECT_OT_ERROR_MSG(moe_token_unpermute(p, ints({8}, {0, 1, 2, 3, 0, 1, 2, 3}), randn(DType::f32, {2, 3}, 1), true, 4), "probs",
                      "[E, C] with E*C = 8 elements");
}

TEST(MoeRoutingBadInput, ComputeExpertTokensAndReRouting) {
  EXPECT_OT_ERROR_MSG(moe_compute_expert_tokens(ints({3}, {0, 1, 2}), 0), "num_experts", "1..2048");
  EXPECT_OT_ERROR_MSG(moe_compute_expert_tokens(ints({3}, {0, 1, 2}), 2049), "num_experts", "1..2048");
  EXPECT_OT_ERROR_MSG(moe_compute_expert_tokens(ints({1, 3}, {0, 1, 2}), 3), "sorted_experts", "1-D");
  EXPECT_OT_ERROR_MSG(moe_compute_expert_tokens(Tensor::zeros(DType::i64, {3}), 3), "sorted_experts", "int32");
  EXPECT_OT_ERROR_MSG(moe_compute_expert_tokens(ints({3}, {-1, 0, 1}), 3), "sorted_experts", "ids in [0, 2]");
  Tensor t = randn(DType::f32, {6, 4}, 1);
  Tensor cnt = ints({2, 2}, {1, 2, 3, 0});
  EXPECT_OT_ERROR_MSG(moe_re_routing(Tensor::zeros(DType::i32, {6, 4}), cnt), "tokens", "bf16, fp16, fp32 or int8");
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, ints({4}, {1, 2, 3, 0})), "expert_token_num_per_rank", "2-D");
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, floats(DType::f32, {2, 2}, {1, 2, 3, 0})), "expert_token_num_per_rank", "int32 or int64");
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, ints({2, 2}, {1, 2, 4, -1})), "expert_token_num_per_rank", "counts >= 0");  // sums to 6
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, ints({2, 2}, {1, 2, 3, 1})), "expert_token_num_per_rank", "summing to the rows of tokens, A = 6");
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, cnt, randn(DType::f32, {5}, 1)), "per_token_scales", "[A] = [6]");
  EXPECT_OT_ERROR_MSG(moe_re_routing(t, cnt, randn(DType::bf16, {6}, 1)), "per_token_scales", "fp32");
}

}  // namespace test_routing_bad_input
