// Grouped matmul, finalize routing and moe_final_optimizer_mm: fast vs reference and errors.
#include "helpers.h"
#include "src/core/knobs.h"

namespace test_grouped {
using namespace ot;
using namespace ot::moe;
using namespace mt;

static Tensor i64s(const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  Tensor r = Tensor::empty(DType::i64, shape);
  for (size_t i = 0; i < v.size(); ++i) r.ptr<int64_t>()[i] = v[i];
  return r;
}

TEST(MoeGroupedMatmul, MatchesReferenceAllForms) {
  const int64_t K = 24, N = 16;
  for (DType t : float_types())
    for (gemm::Act act : {gemm::Act::none, gemm::Act::relu, gemm::Act::gelu, gemm::Act::silu, gemm::Act::swiglu}) {
      // 4 groups with counts {3, 0, 6, 4} (an empty group) = 13 rows.
      Tensor x = randn(t, {13, K}, 1);
      Tensor w = randn(t, {4, K, N}, 2, 0.2f);
      Tensor bias = randn(DType::f32, {4, N}, 3);
      Tensor cs = i64s({4}, {3, 3, 9, 13}), cnt = i64s({4}, {3, 0, 6, 4}), kv = i64s({3, 2}, {2, 3, 0, 6, 3, 4});
      for (auto [gl, type] : {std::pair{cs, GroupListType::cumsum}, {cnt, GroupListType::count}, {kv, GroupListType::key_value}}) {
        Tensor f = grouped_matmul(x, w, gl, type, bias, act), r = ref::grouped_matmul(x, w, gl, type, bias, act);
        EXPECT_EQ(f.shape(), (std::vector<int64_t>{13, act == gemm::Act::swiglu ? N / 2 : N}));
        EXPECT_LE(nerr(f, r), tol(t) * 2) << dtype_name(t) << " " << gemm::act_name(act) << " type " << int(type);
      }
    }
}

TEST(MoeGroupedMatmul, TorchLayoutViewAndPackedWeights) {
  Tensor x = randn(DType::bf16, {10, 32}, 4);
  Tensor wt = randn(DType::bf16, {3, 8, 32}, 5, 0.2f);  // torch [G, N, K]
  TensorView w(wt.view().data, DType::bf16, {3, 32, 8}, {8 * 32, 1, 32});  // its [G, K, N] transposed view
  Tensor gl = i64s({3}, {4, 4, 10});
  Tensor f = grouped_matmul(x, w, gl), r = ref::grouped_matmul(x, w, gl);
  EXPECT_LE(nerr(f, r), tol(DType::bf16));
  std::vector<gemm::PackedB> packs;
  for (int g = 0; g < 3; ++g) packs.push_back(gemm::prepack(wt.view().select(0, g), gemm::BLayout::NK));
  std::vector<const gemm::PackedB*> ptrs{&packs[0], &packs[1], &packs[2]};
  EXPECT_LE(nerr(grouped_matmul(x, ptrs, gl), r), tol(DType::bf16));
  Tensor empty = randn(DType::bf16, {0, 32}, 1);
  EXPECT_EQ(grouped_matmul(empty, w, i64s({3}, {0, 0, 0})).size(0), 0);
}

// M = 0, 1, 7, 513 rows over 3 groups (one of them empty when M > 0) in each group_list form.
TEST(MoeGroupedMatmul, MatchesReferenceOverRows) {
  const int64_t K = 40, N = 24;
  for (DType t : float_types())
    for (int64_t M : {0, 1, 7, 513}) {
      Tensor x = randn(t, {M, K}, uint32_t(M + 1));
      Tensor w = randn(t, {3, K, N}, 2, 0.2f);
      Tensor bias = randn(DType::f32, {3, N}, 3);
      int64_t a = M / 3, c = M - a;  // groups {a, 0, c}
      Tensor cs = i64s({3}, {a, a, M}), cnt = i64s({3}, {a, 0, c}), kv = i64s({2, 2}, {0, a, 2, c});
      for (auto [gl, type] : {std::pair{cs, GroupListType::cumsum}, {cnt, GroupListType::count}, {kv, GroupListType::key_value}}) {
        Tensor f = grouped_matmul(x, w, gl, type, bias, gemm::Act::silu), r = ref::grouped_matmul(x, w, gl, type, bias, gemm::Act::silu);
        ASSERT_EQ(f.shape(), (std::vector<int64_t>{M, N}));
        EXPECT_LE(nerr(f, r), tol(t) * 2) << dtype_name(t) << " M " << M << " type " << int(type);
      }
    }
}

// Each bad input checks the argument and the condition named, so a list that breaks two rules
// cannot pass on the other one (the old "not monotone" case {4, 3} also failed the sum check).
TEST(MoeGroupedMatmul, BadInput) {
  Tensor x = randn(DType::f32, {6, 8}, 1);
  Tensor w = randn(DType::f32, {2, 8, 4}, 2);
  // Decreasing, yet ending at M = 6: only the monotone check can catch it.
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {7, 6})), "group_list", "non-decreasing");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, ints({2}, {7, 6})), "group_list", "non-decreasing");  // int32 too
  // Sum != M in each form (both directions for cumsum).
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {2, 5})), "group_list", "summing to the rows");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {2, 7})), "group_list", "summing to the rows");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {3, 4}), GroupListType::count), "group_list", "summing to the rows");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2, 2}, {0, 2, 1, 3}), GroupListType::key_value), "group_list", "summing to the rows");
  // Negative count summing to M; key-value group id out of range with a correct sum.
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {7, -1}), GroupListType::count), "group_list", "non-negative counts");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2, 2}, {0, 7, 1, -1}), GroupListType::key_value), "group_list", "non-negative counts");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({1, 2}, {2, 6}), GroupListType::key_value), "group_list", "group ids in [0, 2)");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {2, 6}), GroupListType::key_value), "group_list", "[G', 2]");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({3}, {2, 4, 6})), "group_list", "one entry per weight");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {2, 6}), GroupListType(3)), "group_list_type", "key_value");
  // group_list must hold integers (int32 or int64).
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, floats(DType::f32, {2}, {2, 6})), "group_list", "int32 or int64");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, Tensor::zeros(DType::i8, {2})), "group_list", "int32 or int64");
  // x / weight mismatches.
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, randn(DType::bf16, {2, 8, 4}, 2), i64s({2}, {2, 6})), "weight", "the dtype of x");
  EXPECT_OT_ERROR_MSG(grouped_matmul(randn(DType::f16, {6, 8}, 1), w, i64s({2}, {2, 6})), "weight", "the dtype of x");
  EXPECT_OT_ERROR_MSG(grouped_matmul(Tensor::zeros(DType::i32, {6, 8}), w, i64s({2}, {2, 6})), "x", "bf16, fp16 or fp32");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, randn(DType::f32, {2, 7, 4}, 2), i64s({2}, {2, 6})), "weight", "K = 8");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, randn(DType::f32, {8, 4}, 2), i64s({2}, {2, 6})), "weight", "3-D");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, randn(DType::f32, {2, 8, 3}, 2), i64s({2}, {2, 6}), GroupListType::cumsum, {}, gemm::Act::swiglu),
                      "weight", "even N");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, w, i64s({2}, {2, 6}), GroupListType::cumsum, randn(DType::f32, {2, 5}, 1)), "bias", "[G, N]");
  // The packed-weight form checks the same group_list.
  std::vector<gemm::PackedB> packs;
  for (int g = 0; g < 2; ++g) packs.push_back(gemm::prepack(w.view().select(0, g), gemm::BLayout::KN));
  std::vector<const gemm::PackedB*> ptrs{&packs[0], &packs[1]};
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, ptrs, i64s({2}, {7, 6})), "group_list", "non-decreasing");
  EXPECT_OT_ERROR_MSG(grouped_matmul(x, ptrs, i64s({2}, {2, 5})), "group_list", "summing to the rows");
}

TEST(MoeFinalizeRouting, HandCase) {
  // N = 2, K = 2, H = 1, column layout: rows c = k*N + n.
  Tensor ex = floats(DType::f32, {4, 1}, {10, 20, 30, 40});
  Tensor idx = ints({4}, {2, 0, 3, 1});  // (n0,k0)->2 (n1,k0)->0 (n0,k1)->3 (n1,k1)->1
  Tensor scales = floats(DType::f32, {2, 2}, {0.5, 0.25, 1, 2});
  Tensor skip = floats(DType::f32, {2, 1}, {1, 2});
  Tensor bias = floats(DType::f32, {3, 1}, {100, 200, 300});
  Tensor eidx = ints({2, 2}, {0, 2, 1, 0});
  // n0: 1 + 0.5*(30+100) + 0.25*(40+300) = 151; n1: 2 + 1*(10+200) + 2*(20+100) = 452
  Tensor out = moe_finalize_routing(ex, skip, {}, bias, scales, idx, eidx);
  EXPECT_EQ(values(out), (std::vector<double>{151, 452}));
  // Row layout, drop/pad: -1 reads a zero row but still adds the bias.
  Tensor exp3 = floats(DType::f32, {2, 1, 1}, {5, 7});
  Tensor idx3 = ints({4}, {0, -1, 1, 0});
  out = moe_finalize_routing_v2(exp3, idx3, {}, {}, bias, scales, eidx, 3);
  EXPECT_EQ(values(out), (std::vector<double>{0.5 * 105 + 0.25 * 300, 1 * 207 + 2 * 105}));
}

TEST(MoeFinalizeRouting, MatchesReferenceAllModes) {
  for (DType t : float_types())
    for (int64_t N : {0, 1, 7, 513})
      for (int mode = 0; mode < 4; ++mode) {
        const int64_t K = 2, H = 16, E = 4, C = std::max<int64_t>(1, N / 2);
        bool pad = mode == 1 || mode == 3;
        Tensor ex = pad ? randn(t, {E, C, H}, 1) : randn(t, {N * K, H}, 1);
        std::vector<int32_t> iv(static_cast<size_t>(N * K));
        for (size_t i = 0; i < iv.size(); ++i) iv[i] = pad ? int32_t(int64_t(i * 7) % (E * C + 1)) - 1 : int32_t(i * 5 % iv.size());
        if (!pad)
          for (size_t i = 0; i < iv.size(); ++i) iv[i] = int32_t(i);  // a permutation
        Tensor idx = ints({N * K}, iv);
        Tensor x1 = randn(t, {N, H}, 2), x2 = randn(t, {N, H}, 3), bias = randn(t, {E, H}, 4);
        Tensor scales = randn(t, {N, K}, 5), eidx = rand_ids(N, K, E, 6);
        Tensor f = moe_finalize_routing_v2(ex, idx, x1, x2, bias, scales, eidx, mode);
        Tensor r = ref::moe_finalize_routing_v2(ex, idx, x1, x2, bias, scales, eidx, mode);
        EXPECT_LE(nerr(f, r), tol(t)) << mode;
        Tensor f2 = moe_finalize_routing_v2(ex, idx, {}, {}, {}, scales, {}, mode);
        EXPECT_LE(nerr(f2, ref::moe_finalize_routing_v2(ex, idx, {}, {}, {}, scales, {}, mode)), tol(t));
      }
}

// Rows of 1000 elements (128-lane blocks + a masked tail) and an output of 1056-element rows past
// the streaming bound (lowered to 4 MiB: non-temporal stores), with skip, bias, scales and dropped
// rows: the combine's prefetch distance crosses from one output's rows into the next one's.
TEST(MoeFinalizeRouting, LargeRowsMatchReference) {
  struct Shape { int64_t N, H, stream_min_kib; };  // the default bound, then the lowered one
  for (DType t : {DType::bf16, DType::f32})
    for (Shape s : {Shape{513, 1000, 16 << 10}, Shape{2048, 1056, 4 << 10}})
      for (int mode : {0, 3}) {
        knobs::ScopedKnob stream_from("moe.stream_min_kib", s.stream_min_kib);
        const int64_t K = 2, E = 4, C = s.N / 2;
        bool pad = mode == 3;
        Tensor ex = pad ? randn(t, {E, C, s.H}, 1) : randn(t, {s.N * K, s.H}, 1);
        std::vector<int32_t> iv(static_cast<size_t>(s.N * K));
        for (size_t i = 0; i < iv.size(); ++i) iv[i] = pad ? int32_t(int64_t(i * 7) % (E * C + 1)) - 1 : int32_t((i * 7919) % iv.size());
        Tensor idx = ints({s.N * K}, iv);
        Tensor x1 = randn(t, {s.N, s.H}, 2), bias = randn(t, {E, s.H}, 4);
        Tensor scales = randn(t, {s.N, K}, 5), eidx = rand_ids(s.N, K, E, 6);
        Tensor f = moe_finalize_routing_v2(ex, idx, x1, {}, bias, scales, eidx, mode);
        EXPECT_LE(nerr(f, ref::moe_finalize_routing_v2(ex, idx, x1, {}, bias, scales, eidx, mode)), tol(t)) << mode;
      }
}

TEST(MoeFinalizeRouting, BadInput) {
  Tensor ex = randn(DType::f32, {4, 8}, 1);
  Tensor idx = ints({4}, {0, 1, 2, 3});
  Tensor scales = randn(DType::f32, {2, 2}, 1);
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, ints({4}, {0, 1, 2, 4}), {}, {}, {}, scales), "expanded_row_idx");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, ints({4}, {0, 1, 2, -1}), {}, {}, {}, scales, {}, 0), "expanded_row_idx");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, idx, {}, randn(DType::f32, {2, 8}, 1), {}, scales), "x2");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, idx, randn(DType::bf16, {2, 8}, 1), {}, {}, scales), "x1");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, idx, {}, {}, randn(DType::f32, {3, 8}, 1), scales), "expert_idx");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, idx, {}, {}, {}, scales, {}, 4), "drop_pad_mode");
  EXPECT_OT_ERROR(moe_finalize_routing(ex, {}, {}, {}, scales, idx, {}), "skip1");
  EXPECT_OT_ERROR(moe_finalize_routing_v2(ex, idx, {}, {}, randn(DType::f32, {3, 8}, 1), scales, ints({2, 2}, {0, 1, 2, 3})), "expert_idx");
}

TEST(MoeFinalOptimizerMm, MatchesReference) {
  for (DType t : float_types())
    for (int64_t T : {0, 1, 7, 513}) {
      Tensor x = randn(t, {T, 16}, 1);
      Tensor w = randn(t, {5, 16, 12}, 2, 0.3f);
      std::vector<int32_t> idx(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) idx[size_t(i)] = int32_t((i * 3) % 4);  // expert 4 unused
      Tensor id = ints({T}, idx);
      EXPECT_LE(nerr(moe_final_optimizer_mm(x, w, id), ref::moe_final_optimizer_mm(x, w, id)), tol(t));
    }
  Tensor x = randn(DType::f32, {2, 4}, 1);
  Tensor w = randn(DType::f32, {3, 4, 2}, 1);
  EXPECT_OT_ERROR(moe_final_optimizer_mm(x, w, ints({2}, {0, 3})), "token_expert_idx");
  EXPECT_OT_ERROR(moe_final_optimizer_mm(x, w, Tensor::zeros(DType::i64, {2})), "token_expert_idx");
  EXPECT_OT_ERROR(moe_final_optimizer_mm(x, randn(DType::bf16, {3, 4, 2}, 1), ints({2}, {0, 1})), "expert_weight");
  EXPECT_OT_ERROR(moe_final_optimizer_mm(x, randn(DType::f32, {3, 5, 2}, 1), ints({2}, {0, 1})), "expert_weight");
}

}  // namespace test_grouped
