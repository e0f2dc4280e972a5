// The drop/pad pipeline of spec 4.3 + 6 + 7 (init routing with capacity -> grouped matmul ->
// finalize) against a hand-derived expectation, and the routing plan's capacity figures by hand.
#include "helpers.h"

namespace test_routing_pipeline {
using namespace ot;
using namespace ot::moe;
using namespace mt;

// 6 tokens, K = 2, E = 3, capacity C = 2. Pairs in token-major order j = n*K + k:
//   e0: tokens 0, 1 kept; 2, 4 dropped    e1: tokens 0, 2 kept; 3, 5 dropped
//   e2: tokens 1, 3 kept; 4, 5 dropped    -> 6 dropped, tokens 4 and 5 keep nothing.
// Finalize (mode 3, row layout; mode 1, column layout) reads a zero row for a dropped pair but still
// adds its expert's bias (spec 7).
TEST(MoeRoutingPipeline, DropPadInitGroupedMatmulFinalize) {
  const int64_t N = 6, K = 2, E = 3, C = 2, H = 4, O = 5;
  const std::vector<int32_t> id{0, 1, 0, 2, 0, 1, 1, 2, 0, 2, 2, 1};
  Tensor x = randn(DType::f32, {N, H}, 1), w = randn(DType::f32, {E, H, O}, 2, 0.5f);
  Tensor ids = ints({N, K}, id);
  InitRoutingV2Options o;
  o.expert_num = E; o.drop_pad_mode = 1; o.expert_capacity = C;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);
  // Slot e*C + s, -1 when dropped (worked out above).
  EXPECT_EQ(values(r.expanded_row_idx), (std::vector<double>{0, 2, 1, 4, -1, 3, -1, 5, -1, -1, -1, -1}));
  EXPECT_EQ(values(r.expert_tokens), (std::vector<double>{4, 4, 4}));  // before capacity
  EXPECT_EQ(r.dropped, 6);
  ASSERT_EQ(r.expanded_x.shape(), (std::vector<int64_t>{E, C, H}));
  // Grouped matmul over the [E*C, H] slots, C rows per expert (padding rows are zeros).
  TensorView slots(r.expanded_x.view().data, DType::f32, {E * C, H});
  Tensor gl = ints({E}, {int32_t(C), int32_t(C), int32_t(C)});
  Tensor y = grouped_matmul(slots, w, gl, GroupListType::count);
  TensorView y3(y.view().data, DType::f32, {E, C, O});
  Tensor scales = randn(DType::f32, {N, K}, 3), bias = randn(DType::f32, {E, O}, 4);
  // Expected: out[n] = sum over pairs of scale * (kept ? x[n] @ W[e] : 0) + scale * bias[e].
  std::vector<int64_t> seen(size_t(E), 0);
  std::vector<double> want(size_t(N * O), 0.0), want_nb(size_t(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      int64_t e = id[size_t(n * K + k)];
      bool kept = seen[size_t(e)]++ < C;
      double s = get_as_double(scales, n * K + k);
      for (int64_t c = 0; c < O; ++c) {
        double v = 0;
        for (int64_t h = 0; kept && h < H; ++h) v += get_as_double(x, n * H + h) * get_as_double(w, (e * H + h) * O + c);
        want_nb[size_t(n * O + c)] += s * v;
        want[size_t(n * O + c)] += s * (v + get_as_double(bias, e * O + c));
      }
    }
  Tensor out = moe_finalize_routing_v2(y3, r.expanded_row_idx, {}, {}, bias, scales, ids, 3);
  Tensor out_nb = moe_finalize_routing_v2(y3, r.expanded_row_idx, {}, {}, {}, scales, {}, 3);
  // Column layout (mode 1): the same pairs indexed k*N + n.
  std::vector<int32_t> col(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) col[size_t(k * N + n)] = r.expanded_row_idx.ptr<int32_t>()[n * K + k];
  Tensor out_col = moe_finalize_routing_v2(y3, ints({N * K}, col), {}, {}, bias, scales, ids, 1);
  for (int64_t i = 0; i < N * O; ++i) {
    EXPECT_NEAR(get_as_double(out, i), want[size_t(i)], 1e-4) << i;
    EXPECT_NEAR(get_as_double(out_nb, i), want_nb[size_t(i)], 1e-4) << i;
    EXPECT_NEAR(get_as_double(out_col, i), want[size_t(i)], 1e-4) << i;
  }
  for (int64_t i = 4 * O; i < N * O; ++i) EXPECT_EQ(get_as_double(out_nb, i), 0.0) << "tokens 4, 5 lost every pair";
  // The reference composition agrees.
  InitRoutingV2Result rr = ref::moe_init_routing_v2(x, ids, o);
  Tensor yr = ref::grouped_matmul(TensorView(rr.expanded_x.view().data, DType::f32, {E * C, H}), w, gl, GroupListType::count);
  Tensor outr = ref::moe_finalize_routing_v2(TensorView(yr.view().data, DType::f32, {E, C, O}), rr.expanded_row_idx, {}, {}, bias, scales, ids, 3);
  EXPECT_LE(nerr(out, outr), 1e-5);
}

// moe_routing_plan's capacity figures worked out by hand. ids (T 4, K 2, E 4; 4 = finished):
//   t0 [0, 1]  t1 [1, 2]  t2 [1, 0]  t3 [1, 4];  weights = flat index + 1.
// Counts e0 2 (t0, t2), e1 4 (t0, t1, t2, t3), e2 1 (t1), e3 0; the finished pair is not counted.
TEST(MoeRoutingPipeline, RoutingPlanCapacityByHand) {
  Tensor ids = ints({4, 2}, {0, 1, 1, 2, 1, 0, 1, 4});
  Tensor w = floats(DType::f32, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const int64_t cap = moe_capacity(4, 2, 4, 1.0);  // ceil(4 * 2 / 4 * 1.0) = 2
  ASSERT_EQ(cap, 2);
  RoutingPlan p = moe_routing_plan(ids, w, 4, cap);
  EXPECT_EQ(p.counts, (std::vector<int64_t>{2, 4, 1, 0}));
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 2, 4, 5, 5}));  // e1 keeps t0, t1; drops t2, t3
  EXPECT_EQ(p.dropped, 2);
  EXPECT_EQ(p.token, (std::vector<int32_t>{0, 2, 0, 1, 1}));
  EXPECT_EQ(p.slot, (std::vector<int32_t>{0, 5, 1, 2, 3}));
  EXPECT_EQ(p.weight, (std::vector<float>{1, 6, 2, 3, 4}));
  // Experts [1, 3) only (an EP shard), capacity 1: e1 keeps t0 (drops 3), e2 keeps t1.
  RoutingPlan q = moe_routing_plan(ids, w, 4, 1, 1, 3);
  EXPECT_EQ(q.first_expert, 1);
  EXPECT_EQ(q.counts, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(q.offsets, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(q.token, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(q.slot, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(q.dropped, 3);
  // Dropless and capacity 0 (everything dropped, counted).
  RoutingPlan d = moe_routing_plan(ids, w, 4);
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 2, 6, 7, 7}));
  EXPECT_EQ(d.dropped, 0);
  RoutingPlan z = moe_routing_plan(ids, w, 4, 0);
  EXPECT_EQ(z.offsets, (std::vector<int64_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(z.dropped, 7);
  // Megatron capacities: ceil(T * K / E * f), raised to min_capacity.
  EXPECT_EQ(moe_capacity(4, 2, 4, 1.25), 3);     // ceil(2.5)
  EXPECT_EQ(moe_capacity(0, 2, 4, 1.0), 0);
  EXPECT_EQ(moe_capacity(0, 2, 4, 1.0, 1), 1);
  EXPECT_EQ(moe_capacity(7, 1, 8, 2.0), 2);      // ceil(1.75)
  EXPECT_OT_ERROR_MSG(moe_routing_plan(ids, w, 4, -2), "expert_capacity", "-1 (dropless) or >= 0");
  EXPECT_OT_ERROR_MSG(moe_routing_plan(ids, w, 4, 1, 3, 2), "expert_range", "0 <= begin <= end <= E = 4");
  EXPECT_OT_ERROR_MSG(moe_routing_plan(ids, floats(DType::f32, {4, 1}, {1, 2, 3, 4}), 4), "topk_weights", "the shape of topk_ids");
  EXPECT_OT_ERROR_MSG(moe_routing_plan(ids, w, 0), "num_experts", ">= 1");
  EXPECT_OT_ERROR_MSG(moe_routing_plan(Tensor::zeros(DType::i64, {4, 2}), w, 4), "topk_ids", "int32");
}

}  // namespace test_routing_pipeline
