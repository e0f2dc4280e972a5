// The NaN / Inf policy of the MoE operators (docs/robustness.md): routers reject non-finite
// scores naming x (or bias); the data-movement and matmul operators pass values through as IEEE
// arithmetic makes them, without an error.
#include <cmath>

#include "helpers.h"

namespace test_nan_policy {
using namespace ot;
using namespace ot::moe;
using namespace mt;

namespace {
const double kBad[] = {std::nan(""), HUGE_VAL, -HUGE_VAL};
}

TEST(NanPolicy, RoutersRejectNonFiniteScores) {
  for (DType t : float_types())
    for (double bad : kBad) {
      Tensor x = randn(t, {3, 8}, 1);
      set_from_double(x, 13, bad);
      EXPECT_OT_ERROR_MSG(moe_gating_top_k_softmax(x, 2), "x", "finite router scores");
      EXPECT_OT_ERROR_MSG(moe_gating_top_k_softmax_v2(x, 2, {}, 1), "x", "finite router scores");
      GatingTopKOptions o;
      o.k = 2;
      o.norm_type = 1;
      EXPECT_OT_ERROR_MSG(moe_gating_top_k(x, o), "x", "finite router scores");
      Tensor bias = Tensor::zeros(DType::f32, {8});
      set_from_double(bias, 5, bad);
      o.bias = bias;
      EXPECT_OT_ERROR_MSG(moe_gating_top_k(randn(t, {3, 8}, 2), o), "bias", "finite router scores");
    }
  GatingTopKOptions o;
  o.k = 2;
  o.routed_scaling_factor = float(HUGE_VAL);
  EXPECT_OT_ERROR(moe_gating_top_k(randn(DType::f32, {3, 8}, 1), o), "routed_scaling_factor");
}

TEST(NanPolicy, DataMovementPassesValuesThrough) {
  // init routing copies rows bit for bit, NaN payloads included; finalize and grouped matmul
  // propagate NaN / Inf through their sums.
  Tensor x = randn(DType::f32, {4, 8}, 1);
  set_from_double(x, 9, std::nan(""));   // token 1
  set_from_double(x, 16, HUGE_VAL);      // token 2
  Tensor ids = rand_ids(4, 2, 4, 1);
  InitRoutingV2Options o;
  o.expert_num = 4;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);
  int nan_rows = 0, inf_rows = 0;
  for (int64_t i = 0; i < r.expanded_x.size(0); ++i) {
    nan_rows += std::isnan(get_as_double(r.expanded_x, i * 8 + 1));
    inf_rows += std::isinf(get_as_double(r.expanded_x, i * 8 + 0));
  }
  EXPECT_EQ(nan_rows, 2);  // token 1's two rows
  EXPECT_EQ(inf_rows, 2);
  Tensor gl = ints({1}, {4});
  Tensor w = randn(DType::f32, {1, 8, 3}, 2);
  Tensor y = grouped_matmul(x, w, gl, GroupListType::cumsum);
  EXPECT_TRUE(std::isnan(get_as_double(y, 3)));  // row 1
  EXPECT_TRUE(std::isfinite(get_as_double(y, 0)));
}

TEST(NanPolicy, DynamicQuantOfANonFiniteRow) {
  // quant_mode 1: a row with NaN / Inf quantises to zeros with a NaN scale (no error, no UB).
  Tensor x = randn(DType::f32, {2, 8}, 1);
  set_from_double(x, 3, HUGE_VAL);
  InitRoutingV2Options o;
  o.expert_num = 2;
  o.quant_mode = 1;
  InitRoutingV2Result r = moe_init_routing_v2(x, ints({2, 1}, {0, 1}), o);
  ASSERT_EQ(r.expanded_x.dtype(), DType::i8);
  EXPECT_TRUE(std::isnan(get_as_double(r.expanded_scale, 0)));
  for (int64_t h = 0; h < 8; ++h) EXPECT_EQ(get_as_double(r.expanded_x, h), 0.0);
  EXPECT_TRUE(std::isfinite(get_as_double(r.expanded_scale, 1)));
}

}  // namespace test_nan_policy
