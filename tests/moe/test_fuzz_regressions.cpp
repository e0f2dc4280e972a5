// Regression tests of the bugs the fuzz targets (fuzz/) found: one test per bug, named after it,
// with the input the fuzzer produced reduced to the rule it broke.
#include "helpers.h"

namespace test_fuzz_regressions {
using namespace ot;
using namespace ot::moe;
using namespace mt;

// fuzz_init_routing: active_expert_range {0, -1} passed the range check (start < max(end, 1)) and
// the kernel sized its count vector by end - start = -1 (std::length_error instead of an ot::Error).
TEST(FuzzRegressions, InitRoutingV2NegativeRangeEnd) {
  Tensor x = randn(DType::f32, {4, 8}, 1);
  Tensor ids = rand_ids(4, 2, 4, 1);
  for (int64_t end : {-1, -5}) {
    InitRoutingV2Options o;
    o.expert_num = 4;
    o.active_expert_range[0] = 0;
    o.active_expert_range[1] = end;
    EXPECT_OT_ERROR_MSG(moe_init_routing_v2(x, ids, o), "active_expert_range", "0 <= start < end <= expert_num = 4");
    EXPECT_OT_ERROR_MSG(ref::moe_init_routing_v2(x, ids, o), "active_expert_range", "0 <= start < end <= expert_num = 4");
  }
  // An empty token batch with a derived expert count (E = 0) is still fine.
  InitRoutingV2Options o;
  InitRoutingV2Result r = moe_init_routing_v2(randn(DType::f32, {0, 8}, 1), Tensor::zeros(DType::i32, {0, 2}), o);
  EXPECT_EQ(r.expert_tokens.numel(), 0);
}

// fuzz_permute: moe_token_unpermute in padded mode took restore_rows = INT64_MAX as the output's
// row count; the size product overflowed int64 in the output allocation (UBSan) instead of an error.
TEST(FuzzRegressions, UnpermutePaddedHugeRestoreRows) {
  Tensor permuted = randn(DType::f32, {2, 4}, 1);
  Tensor sorted = ints({2}, {0, 1});
  for (int64_t rows : {INT64_MAX, int64_t(1) << 40})
    EXPECT_OT_ERROR_MSG(moe_token_unpermute(permuted, sorted, {}, true, rows), "restore_rows", "at most 2^40 bytes");
  EXPECT_EQ(moe_token_unpermute(permuted, sorted, {}, true, 3).size(0), 3);
}

}  // namespace test_fuzz_regressions
