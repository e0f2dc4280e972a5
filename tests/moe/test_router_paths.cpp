// Routers and the weighted row combine on each instruction-set path (scalar rows, AVX2 rows, AVX-512 rows)
// against the references: odd E (tail lanes), k up to 16 (vector top-k) and beyond (scalar), ties
// (the vector top-k hands those rows to the scalar path), groups, bias, masks, the fused finiteness
// check, and unpermute / finalize on H with and without 128-lane blocks.
#include "helpers.h"

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/knobs.h"

namespace test_router_paths {
using namespace ot;
using namespace ot::moe;
using namespace mt;

namespace {

std::vector<cpu::Isa> paths() {
  std::vector<cpu::Isa> v{cpu::Isa::scalar};
  if (cpu::detected_isa() >= cpu::Isa::avx2) v.push_back(cpu::Isa::avx2);
  if (cpu::detected_isa() >= cpu::Isa::avx512) v.push_back(cpu::Isa::avx512);
  return v;
}

void expect_match(const GatingResult& f, const GatingResult& r, DType t, const std::string& what) {
  SCOPED_TRACE(what);
  expect_same(f.expert_idx, r.expert_idx, "expert_idx");
  EXPECT_LE(nerr(f.y, r.y), tol(t));
  if (r.row_idx.defined()) expect_same(f.row_idx, r.row_idx, "row_idx");
  ASSERT_EQ(f.scores.defined(), r.scores.defined());
  if (r.scores.defined()) {
    EXPECT_LE(nerr(f.scores, r.scores), 1e-5);
  }
}

// Logits with ties: every value drawn from a few levels, so equal scores straddle the k-th place.
Tensor tied(DType t, int64_t T, int64_t E, uint32_t seed, int levels) {
  Tensor x = Tensor::empty(t, {T, E});
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  for (int64_t i = 0; i < T * E; ++i) set_from_double(x, i, 0.25 * d(g));
  return x;
}

}  // namespace

// The dispatch table (router.cpp, kRouterKernels) as the trace names it: the AVX-512 lanes kernel
// takes every router with E = 16 m <= 256, k <= 16 and no mask; the AVX2 kernels the rest (masks,
// other E), also on AVX-512 machines; k > 16 the portable rows.
TEST(MoeRouterPaths, DispatchTable) {
  auto kernel = [](auto&& call) {
    trace::take_events();
    trace::set_timeline(true);
    call();
    trace::set_timeline(false);
    std::vector<trace::Event> ev = trace::take_events();
    return ev.empty() ? std::string() : ev.back().kernel;
  };
  Tensor x128 = randn(DType::f32, {33, 128}, 1), x40 = randn(DType::f32, {33, 40}, 2), x2 = randn(DType::f32, {2, 128}, 3);
  Tensor allowed = Tensor::zeros(DType::u8, {33, 128});
  std::fill(allowed.ptr<uint8_t>(), allowed.ptr<uint8_t>() + 33 * 128, uint8_t(1));
  GatingTopKOptions bias;
  bias.k = 8; bias.group_count = 8; bias.k_group = 4; bias.group_select_mode = 1;
  Tensor b = randn(DType::f32, {128}, 4);
  bias.bias = b;
  const bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
  if (cpu::detected_isa() >= cpu::Isa::avx512 && vbmi) {
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x128, 8); }), "avx512_t16");
    EXPECT_EQ(kernel([&] { moe_gating_top_k(x128, bias); }), "avx512_t16");  // softmax keys + bias, top-2 groups
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x2, 8); }), "avx512_t16");  // a partial block
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x128, 8, {}, allowed); }), "avx2_rows");
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x40, 8); }), "avx2_t8");
  }
  if (cpu::detected_isa() >= cpu::Isa::avx2) {
    cpu::ScopedMaxIsa cap(cpu::Isa::avx2);
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x128, 8); }), "avx2_t8");
    EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x2, 8); }), "avx2_rows");  // fewer than 4 rows
    EXPECT_EQ(kernel([&] { moe_gating_top_k(x128, bias); }), "avx2_rows");     // softmax keys + bias
  }
  EXPECT_EQ(kernel([&] { moe_gating_top_k_softmax(x128, 17); }), "fp32_rows");
}

TEST(MoeRouterPaths, SoftmaxRoutersMatchReference) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : float_types())
      for (int64_t E : {5, 16, 37, 128, 300})
        for (int64_t k : {1, 3, 8, 16, 17}) {
          if (k > E) continue;
          std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " E" + std::to_string(E) + " k" + std::to_string(k);
          Tensor x = randn(t, {33, E}, uint32_t(E * 31 + k), 3.f);
          Tensor fin = Tensor::zeros(DType::u8, {33});
          fin.ptr<uint8_t>()[5] = 1;
          expect_match(moe_gating_top_k_softmax(x, k, fin), ref::moe_gating_top_k_softmax(x, k, fin), t, what + " v1");
          for (int renorm : {0, 1})
            expect_match(moe_gating_top_k_softmax_v2(x, k, {}, renorm, true), ref::moe_gating_top_k_softmax_v2(x, k, {}, renorm, true), t,
                         what + " v2 renorm " + std::to_string(renorm));
        }
  }
}

TEST(MoeRouterPaths, GatingTopKMatchesReference) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : float_types())
      for (int64_t E : {24, 64, 256})
        for (int norm : {0, 1})
          for (int mode : {0, 1})
            for (bool with_bias : {false, true})
              for (int64_t groups : {1, 8}) {
                GatingTopKOptions o;
                o.k = 8; o.norm_type = norm; o.group_select_mode = mode; o.group_count = groups; o.k_group = groups > 1 ? 4 : 1;
                o.routed_scaling_factor = 2.5f; o.out_flag = (E + norm) % 2 == 0;
                Tensor bias = randn(DType::f32, {E}, uint32_t(E), 0.5f);
                if (with_bias) o.bias = bias;
                Tensor x = randn(t, {41, E}, uint32_t(E + norm * 8 + mode * 4 + groups), 2.f);
                std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " E" + std::to_string(E) + " norm " +
                                   std::to_string(norm) + " mode " + std::to_string(mode) + " bias " + std::to_string(with_bias) +
                                   " groups " + std::to_string(groups);
                expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what);
              }
  }
}

TEST(MoeRouterPaths, TiesGoToTheLowerExpert) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (int levels : {2, 5, 40}) {
      Tensor x = tied(DType::f32, 53, 128, uint32_t(levels), levels);
      std::string what = std::string(cpu::isa_name(isa)) + " levels " + std::to_string(levels);
      expect_match(moe_gating_top_k_softmax(x, 8), ref::moe_gating_top_k_softmax(x, 8), DType::f32, what);
      GatingTopKOptions o;
      o.k = 6; o.norm_type = 1; o.group_count = 8; o.k_group = 3;
      expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " gating");
    }
  }
}

TEST(MoeRouterPaths, AllowedMaskAndMaskedGroups) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    const int64_t T = 29, E = 64;
    Tensor x = randn(DType::bf16, {T, E}, 3, 2.f);
    Tensor allowed = Tensor::zeros(DType::u8, {T, E});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) allowed.ptr<uint8_t>()[t * E + e] = t % 3 == 0 ? e % 4 == 0 : (t % 3 == 1 ? e < 20 : 1);
    std::string what = cpu::isa_name(isa);
    expect_match(moe_gating_top_k_softmax(x, 8, {}, allowed), ref::moe_gating_top_k_softmax(x, 8, {}, allowed), DType::bf16, what);
    expect_match(moe_gating_top_k_softmax_v2(x, 8, {}, 0, true, allowed), ref::moe_gating_top_k_softmax_v2(x, 8, {}, 0, true, allowed),
                 DType::bf16, what + " v2");
    // Rows t % 3 == 0 keep 2 groups with 2 allowed experts each: -inf keys are chosen (lower id first)
    // with weight 0.
    GatingTopKOptions o;
    o.k = 8; o.norm_type = 1; o.group_count = 8; o.k_group = 2; o.out_flag = true; o.allowed = allowed;
    expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::bf16, what + " gating");
  }
}

TEST(MoeRouterPaths, BadRowAnywhereIsAnError) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (int64_t row : {0, 300, 999}) {
      Tensor x = randn(DType::f32, {1000, 40}, 2);
      x.ptr<float>()[row * 40 + 39] = row == 300 ? -INFINITY : NAN;  // the last lane of a row: the masked tail
      EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 4), "x");
      GatingTopKOptions o;
      o.k = 4; o.norm_type = 1;
      EXPECT_OT_ERROR(moe_gating_top_k(x, o), "x");
      // A row allowing fewer than k experts.
      Tensor ok = randn(DType::f32, {1000, 40}, 3);
      Tensor allowed = Tensor::empty(DType::u8, {1000, 40});
      for (int64_t i = 0; i < 1000 * 40; ++i) allowed.ptr<uint8_t>()[i] = i / 40 != row || i % 40 < 3;
      EXPECT_OT_ERROR(moe_gating_top_k_softmax(ok, 4, {}, allowed), "allowed");
      o.allowed = allowed;
      EXPECT_OT_ERROR(moe_gating_top_k(ok, o), "allowed");
      EXPECT_NO_THROW(moe_gating_top_k_softmax(ok, 3, {}, allowed));
    }
  }
}

// Small calls run on one thread, larger ones split into tasks of 16 Ki logits: every split gives
// the same bits (rows are independent), from one task up to several per thread.
TEST(MoeRouterPaths, TaskSplitsGiveTheSameBits) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (int64_t T : {7, 255, 256, 660, 700, 5000}) {
      Tensor x = randn(DType::f32, {T, 64}, uint32_t(T), 2.f);
      GatingTopKOptions sig, soft;
      sig.k = 6; sig.norm_type = 1; sig.group_count = 4; sig.k_group = 2; sig.routed_scaling_factor = 2.5f;
      soft.k = 6; soft.routed_scaling_factor = 2.5f;
      auto route = [&] {
        return std::vector<GatingResult>{moe_gating_top_k_softmax(x, 6), moe_gating_top_k_softmax_v2(x, 6, {}, 1, false),
                                         moe_gating_top_k(x, sig), moe_gating_top_k(x, soft)};
      };
      set_num_threads(1);
      const std::vector<GatingResult> one = route();
      set_num_threads(0);
      const std::vector<GatingResult> all = route();
      for (size_t c = 0; c < one.size(); ++c) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " T " + std::to_string(T) + " router " + std::to_string(c));
        expect_same(one[c].expert_idx, all[c].expert_idx, "ids");
        expect_same(one[c].y, all[c].y, "weights");
      }
      // Batch invariance: a row routed alone (the row kernels) gets the bits it gets in the batch.
      if (T == 700) {
        const Tensor full = x;
        for (int64_t row : {0, 5, 339, 699}) {
          x = Tensor::empty(DType::f32, {1, 64});
          std::copy(full.ptr<float>() + row * 64, full.ptr<float>() + row * 64 + 64, x.ptr<float>());
          const std::vector<GatingResult> alone = route();
          for (size_t c = 0; c < alone.size(); ++c) {
            SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " row " + std::to_string(row) + " alone, router " + std::to_string(c));
            for (int64_t j = 0; j < 6; ++j) {
              EXPECT_EQ(alone[c].expert_idx.ptr<int32_t>()[j], all[c].expert_idx.ptr<int32_t>()[row * 6 + j]);
              EXPECT_EQ(alone[c].y.ptr<float>()[j], all[c].y.ptr<float>()[row * 6 + j]);
            }
          }
        }
      }
    }
  }
}

TEST(MoeCombinePaths, UnpermuteAndFinalizeMatchReference) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : float_types())
      for (int64_t H : {7, 128, 200}) {
        const int64_t T = 37, K = 3, E = 6;
        std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " H" + std::to_string(H);
        SCOPED_TRACE(what);
        Tensor x = randn(t, {T, H}, uint32_t(H));
        Tensor ids = rand_ids(T, K, E, uint32_t(H + 1));
        Tensor probs = randn(DType::f32, {T, K}, uint32_t(H + 2));
        probs.ptr<float>()[4] = 0;  // a zero weight is skipped
        TokenPermuteResult p = moe_token_permute(x, ids);
        EXPECT_LE(nerr(moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs),
                       ref::moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs)),
                  tol(t));
        InitRoutingV2Options io;
        io.expert_num = E;
        InitRoutingV2Result ir = moe_init_routing_v2(x, ids, io);
        Tensor scales = randn(t, {T, K}, uint32_t(H + 3));
        Tensor skip = randn(t, {T, H}, uint32_t(H + 4));
        Tensor bias = randn(t, {E, H}, uint32_t(H + 5));
        // drop_pad_mode 2: dropless, token-major index (init routing v2's gather form).
        EXPECT_LE(nerr(moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, skip, skip, bias, scales, ids, 2),
                       ref::moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, skip, skip, bias, scales, ids, 2)),
                  tol(t));
        EXPECT_LE(nerr(moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, {}, {}, {}, scales, {}, 2),
                       ref::moe_finalize_routing_v2(ir.expanded_x, ir.expanded_row_idx, {}, {}, {}, scales, {}, 2)),
                  tol(t));
      }
  }
}

TEST(MoeCombinePaths, UnpermuteMoreThan64RowsPerToken) {  // summed in batches of 64
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    const int64_t T = 5, K = 70, E = 80, H = 24;
    Tensor x = randn(DType::bf16, {T, H}, 7);
    Tensor ids = rand_ids(T, K, E, 8);
    Tensor probs = randn(DType::f32, {T, K}, 9, 0.1f);
    TokenPermuteResult p = moe_token_permute(x, ids);
    EXPECT_LE(nerr(moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs),
                   ref::moe_token_unpermute(p.permuted_tokens, p.sorted_indices, probs)),
              tol(DType::bf16))
        << cpu::isa_name(isa);
  }
}

TEST(MoeInitRoutingQuant, Int8OutputFeedsPermute) {
  Tensor x = randn(DType::bf16, {9, 32}, 4);
  Tensor ids = rand_ids(9, 2, 4, 5);
  InitRoutingV2Options o;
  o.expert_num = 4; o.quant_mode = 0;
  Tensor scale = floats(DType::f32, {1}, {20});
  o.scale = scale;
  InitRoutingV2Result r = moe_init_routing_v2(x, ids, o);
  ASSERT_EQ(r.expanded_x.dtype(), DType::i8);
  for (int64_t i = 0; i < r.expanded_x.numel(); ++i) {
    double q = get_as_double(r.expanded_x, i);
    EXPECT_GE(q, -128);
    EXPECT_LE(q, 127);
  }
  // int8 rows route like any other rows.
  Tensor rows = Tensor::empty(DType::i32, {18, 1});
  for (int i = 0; i < 18; ++i) rows.ptr<int32_t>()[i] = i % 3;
  TokenPermuteResult p = moe_token_permute(r.expanded_x, rows);
  TokenPermuteResult pr = ref::moe_token_permute(r.expanded_x, rows);
  EXPECT_EQ(p.permuted_tokens.dtype(), DType::i8);
  expect_same(p.permuted_tokens, pr.permuted_tokens, "permuted int8");
  EXPECT_OT_ERROR(moe_token_permute(Tensor::zeros(DType::u8, {18, 32}), rows), "tokens");
}

// The vector top-k's edges: E not a multiple of 16 (padding lanes in the column maxima), k = E and
// k = 16 (every candidate chosen), 19 rows (a block of 8 plus a tail), and rows whose candidates
// overflow the 16-lane fast path (flat rows: the general vector top-k, then the scalar row on ties)
// mixed with ordinary rows in one block.
TEST(MoeRouterPaths, VectorTopKEdges) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : {DType::f32, DType::bf16})
      for (int64_t E : {1, 5, 16, 17, 31, 33, 200})
        for (int64_t k : {int64_t(1), int64_t(7), int64_t(15), int64_t(16), E}) {
          if (k > E || k > 16) continue;
          std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " E" + std::to_string(E) + " k" + std::to_string(k);
          Tensor x = randn(t, {19, E}, uint32_t(E * 7 + k), 2.f);
          for (int64_t row : {2, 9, 10, 18})  // flat rows (all equal) and two-level rows
            for (int64_t e = 0; e < E; ++e) set_from_double(x, row * E + e, row % 2 ? 0.5 * double(e % 2) : 0.25);
          expect_match(moe_gating_top_k_softmax(x, k), ref::moe_gating_top_k_softmax(x, k), t, what + " v1");
          expect_match(moe_gating_top_k_softmax_v2(x, k, {}, 1, false), ref::moe_gating_top_k_softmax_v2(x, k, {}, 1, false), t,
                       what + " v2 renorm 1");
          GatingTopKOptions o;
          o.k = k; o.norm_type = 1; o.out_flag = true;
          expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what + " gating sigmoid");
        }
  }
}

// Group-limited selection through the vector group tree (groups of a multiple of 16 experts, at
// most 16 groups: 2 to 16 groups, 1 or 2 vectors a group), each k_group, both group scores, with
// and without bias, softmax and sigmoid, on random rows and on rows of a few levels (tied experts
// and tied group scores: the lower group and the lower expert win), with masks.
TEST(MoeRouterPaths, GroupTreeMatchesReference) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (auto [E, G] : {std::pair<int64_t, int64_t>{32, 2}, {64, 4}, {128, 8}, {256, 8}, {256, 16}, {192, 4}})
      for (int64_t kg = 1; kg < G; kg += (G > 4 ? 3 : 1))
        for (int mode : {0, 1})
          for (int variant : {0, 1, 2}) {  // random; tied levels; tied levels with bias and a mask
            GatingTopKOptions o;
            o.k = std::min<int64_t>(8, kg * (E / G)); o.group_count = G; o.k_group = kg; o.group_select_mode = mode;
            o.norm_type = (kg + mode) % 2; o.routed_scaling_factor = 1.5f; o.out_flag = variant == 2;
            Tensor x = variant == 0 ? randn(DType::f32, {27, E}, uint32_t(E + G + kg), 2.f) : tied(DType::f32, 27, E, uint32_t(kg + mode), 3);
            Tensor bias_rows = tied(DType::f32, 1, E, 9, 2);
            TensorView bias = bias_rows.view().reshape({E});
            Tensor allowed = Tensor::empty(DType::u8, {27, E});
            for (int64_t i = 0; i < 27 * E; ++i) allowed.ptr<uint8_t>()[i] = (i / E) % 2 == 0 || i % 5 != 0;
            if (variant == 2) { o.bias = bias; o.allowed = allowed; }
            std::string what = std::string(cpu::isa_name(isa)) + " E" + std::to_string(E) + " G" + std::to_string(G) + " kg" +
                               std::to_string(kg) + " mode " + std::to_string(mode) + " variant " + std::to_string(variant);
            expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what);
          }
  }
}

// Huge finite logits (exp and sigmoid at their clamps) still route exactly. Each row holds 9 equal
// maxima 1e30 (so the top 8 are the same in score and logit order: a saturated softmax or sigmoid
// ties in fp64 where the logits still differ), -1e30 and 90 + e (sigmoid 1.0 in fp32 and fp64).
TEST(MoeRouterPaths, HugeLogits) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    Tensor x = randn(DType::f32, {21, 128}, 11, 2.f);
    for (int64_t r = 0; r < 21; ++r)
      for (int64_t j = 0; j < 24; ++j) x.ptr<float>()[r * 128 + (r * 5 + 13 * j) % 128] = j < 9 ? 1e30f : j < 16 ? -1e30f : 90.f + float(j);
    std::string what = cpu::isa_name(isa);
    expect_match(moe_gating_top_k_softmax(x, 8), ref::moe_gating_top_k_softmax(x, 8), DType::f32, what + " v1");
    expect_match(moe_gating_top_k_softmax_v2(x, 8, {}, 1, false), ref::moe_gating_top_k_softmax_v2(x, 8, {}, 1, false), DType::f32, what + " renorm");
    GatingTopKOptions o;
    o.k = 8; o.norm_type = 1; o.group_count = 8; o.k_group = 4; o.group_select_mode = 1; o.out_flag = true;
    expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " sigmoid groups");
    // Such rows go to the scalar row (the exps' offset, kExpOffsetLimit), which still finds a NaN
    // beside the huge max: row 5 in a block of 16, row 18 after the blocks.
    for (int64_t row : {5, 18}) {
      Tensor y = randn(DType::f32, {21, 128}, 13, 2.f);
      y.ptr<float>()[row * 128 + 3] = 1e30f;
      y.ptr<float>()[row * 128 + 9] = NAN;
      SCOPED_TRACE(what + " huge and NaN in row " + std::to_string(row));
      EXPECT_OT_ERROR(moe_gating_top_k_softmax(y, 8), "x");
      EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(y, 8, {}, 1, false), "x");
    }
  }
}

// Finite logits near the fp32 maximum: x log2 e overflows in the vector exps, which the fused
// finiteness check takes for a bad row; the call must still return every row, as the reference does.
TEST(MoeRouterPaths, NearFloatMaxLogits) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    Tensor x = randn(DType::f32, {19, 128}, 12, 2.f);
    // (9 equal maxima: which of the rest underflow to a score of 0 does not decide the top 8.)
    for (int64_t j = 0; j < 12; ++j) x.ptr<float>()[3 * 128 + 7 * j] = j < 9 ? 3e38f : -3e38f;
    x.ptr<float>()[11 * 128 + 5] = -3.3e38f;
    std::string what = cpu::isa_name(isa);
    expect_match(moe_gating_top_k_softmax(x, 8), ref::moe_gating_top_k_softmax(x, 8), DType::f32, what + " v1");
    expect_match(moe_gating_top_k_softmax_v2(x, 8, {}, 0, true), ref::moe_gating_top_k_softmax_v2(x, 8, {}, 0, true), DType::f32, what + " v2");
    GatingTopKOptions o;
    o.k = 8;
    expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " gating");
  }
}

// Rows of whole vectors without a mask (E 16 m): the softmax routers check finiteness through the
// sum of the exps (NaN exactly when some logit is NaN or +-Inf), read fp32 rows in place, reduce a
// block's row maxima and sums together and store 16 output lanes a row (lanes past k are the next
// rows' slots) except at the end of a thread's rows. Every row count from 1 to 40 (partial
// blocks, chunk ends), k from 1 to 16, and a bad value in any row or lane is an error.
TEST(MoeRouterPaths, WholeVectorRowsAndBlockEdges) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType t : {DType::f32, DType::bf16})
      for (int64_t T = 1; T <= 40; T += (T < 12 ? 1 : 7))
        for (int64_t k : {1, 3, 8, 16}) {
          const int64_t E = k == 3 ? 48 : 128;
          std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " T" + std::to_string(T) + " k" + std::to_string(k);
          Tensor x = randn(t, {T, E}, uint32_t(T * 17 + k), 2.f);
          Tensor fin = Tensor::zeros(DType::u8, {T});
          fin.ptr<uint8_t>()[T / 2] = 1;
          expect_match(moe_gating_top_k_softmax(x, k, fin), ref::moe_gating_top_k_softmax(x, k, fin), t, what + " v1");
          expect_match(moe_gating_top_k_softmax_v2(x, k, {}, 0, T % 2 == 0), ref::moe_gating_top_k_softmax_v2(x, k, {}, 0, T % 2 == 0), t,
                       what + " v2");
          GatingTopKOptions o;
          o.k = k; o.routed_scaling_factor = 1.5f;
          expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what + " gating softmax");
        }
    for (float bad : {NAN, INFINITY, -INFINITY})
      for (int64_t row : {0, 5, 8, 12, 36}) {
        Tensor x = randn(DType::f32, {37, 128}, 4);
        x.ptr<float>()[row * 128 + (row * 37) % 128] = bad;
        std::string what = std::string(cpu::isa_name(isa)) + " row " + std::to_string(row) + " value " + std::to_string(bad);
        SCOPED_TRACE(what);
        EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 8), "x");
        EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(x, 8, {}, 0, true), "x");
        GatingTopKOptions o;
        o.k = 8;
        EXPECT_OT_ERROR(moe_gating_top_k(x, o), "x");
      }
  }
}

// The 16-tokens-in-lanes kernel's softmax routers (E a multiple of 16 up to 256, no mask): blocks of
// 16 rows and a partial one, so T below and past multiples of 16 (100: E 128, k 8); E of 1, 5, 6, 8, 12 and 16 vectors (the candidate
// values: a gather at odd counts, gather_perm's blend tree of 3, 4, 6 and 8 pairs at even); k from 1 to 16 (8 has
// its own pruned networks); random rows, rows of a few levels (exact ties: the lower expert wins;
// rows of more than 16 candidates: the kernel's insertion), rows of +0 and -0 (equal: the lower id
// wins), rows of +-1e30 (a saturated softmax; every unchosen score underflows alike); bad values in
// a block's rows on the paths with and without the full softmax; at E 128 / 192 / 256 also keys
// that are probabilities + bias, the scores output and group limits.
TEST(MoeRouterPaths, TokensInLanesKernel) {
  {  // the machine's own ISA (the scalar rows have their tests above)
    const cpu::Isa isa = cpu::detected_isa();
    for (DType t : {DType::f32, DType::bf16})
      for (int64_t T : {15, 33, 100})
        for (int64_t E : {16, 80, 96, 128, 192, 256})
          for (int64_t k : {1, 5, 8, 16})
            for (int variant : {0, 1, 2, 3}) {
              if (k > E || (variant > 0 && T != 33) || (T == 100 && (E != 128 || k != 8))) continue;
              Tensor x = variant == 1 ? tied(t, T, E, uint32_t(E + k), 3) : randn(t, {T, E}, uint32_t(T * 7 + E + k), 2.f);
              for (int64_t i = 0; variant >= 2 && i < T * E; ++i) {
                const double v = variant == 2 ? ((i * 7) % 5 == 0 ? -0.0 : 0.0) : (i % 3 == 0 ? 1e30 : -1e30);
                set_from_double(x, i, v);
              }
              std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " T" + std::to_string(T) + " E" + std::to_string(E) +
                                 " k" + std::to_string(k) + " variant " + std::to_string(variant);
              Tensor fin = Tensor::zeros(DType::u8, {T});
              fin.ptr<uint8_t>()[T - 2] = 1;
              expect_match(moe_gating_top_k_softmax(x, k, fin), ref::moe_gating_top_k_softmax(x, k, fin), t, what + " v1");
              for (int renorm : {0, 1})
                expect_match(moe_gating_top_k_softmax_v2(x, k, {}, renorm, false), ref::moe_gating_top_k_softmax_v2(x, k, {}, renorm, false), t,
                             what + " v2 renorm " + std::to_string(renorm));
              GatingTopKOptions o;
              o.k = k; o.routed_scaling_factor = 2.5f;
              expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what + " gating softmax");
              // Softmax scores not on the logits: keys = probabilities + bias, the scores output;
              // a group limit on the logits (max) or on the probabilities (top-2 sum).
              if (E % 64 != 0) continue;
              Tensor bias = randn(DType::f32, {E}, uint32_t(E + k + variant), 0.1f);
              GatingTopKOptions g = o;
              g.out_flag = true;
              if (variant != 3) {  // (+-1e30 rows: probabilities 0 and 1 / n, a bias would order them by fp32 rounding)
                g.bias = bias;
                expect_match(moe_gating_top_k(x, g), ref::moe_gating_top_k(x, g), t, what + " gating softmax bias");
              }
              g.bias = {};
              g.group_count = 4; g.k_group = 2;
              for (int mode : {0, 1}) {
                g.group_select_mode = mode;
                expect_match(moe_gating_top_k(x, g), ref::moe_gating_top_k(x, g), t, what + " gating softmax groups mode " + std::to_string(mode));
              }
            }
    for (float bad : {NAN, INFINITY, -INFINITY})
      for (int64_t row : {3, 16, 31}) {
        Tensor x = randn(DType::f32, {48, 128}, 5);
        x.ptr<float>()[row * 128 + (row * 37) % 128] = bad;
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " row " + std::to_string(row) + " value " + std::to_string(bad));
        EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 8), "x");
        EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(x, 5, {}, 1, false), "x");
        EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(x, 8, {}, 0, false), "x");
      }
  }
}

// The 16-tokens-in-lanes kernel's gating_top_k with sigmoid scores (route_rows_t16: E a multiple
// of 16 up to 256, groups of whole vectors, no mask): T below 16, past multiples of 16;
// 1, 4, 8 and 16 groups of 1 to 4 vectors (E 192: rows of a run-time vector count), k_group from
// 1 to all groups, both group scores, with and without bias, k 1 / 8 / 16 (8 has pruned networks),
// fp32 and bf16 logits; rows of a few levels (exact ties in the scores and in the group scores: the
// lower expert and the lower group win; the bias one level a group), a bias that changes the choice (checked: the ids differ
// from the unbiased call's), the scores output; huge logits; NaN / +-Inf in a block's rows.
TEST(MoeRouterPaths, TokensInLanesSigmoid) {
  const cpu::Isa isa = cpu::detected_isa();  // the machine's own ISA (the scalar rows have their tests above)
  int run = 0;
  for (auto [E, G] : {std::pair<int64_t, int64_t>{64, 1}, {64, 4}, {128, 8}, {256, 8}, {256, 4}, {256, 16}, {192, 4}})
    for (int64_t kg = 1; kg <= G; kg += (G <= 4 ? 1 : G == 8 ? 3 : 5))
      for (int mode : {0, 1})
        for (int variant : {0, 1, 2}) {  // random; tied levels (bias tied too); a bias that changes the choice
          ++run;
          const DType t = run % 3 == 0 ? DType::bf16 : DType::f32;
          const int64_t T = run % 4 == 0 ? 5 : (run % 4 == 1 ? 33 : 48);
          GatingTopKOptions o;
          o.norm_type = 1; o.group_count = G; o.k_group = kg; o.group_select_mode = mode;
          o.k = std::min<int64_t>(run % 5 == 0 ? 16 : run % 5 == 1 ? 1 : 8, kg * (E / G));
          o.routed_scaling_factor = 2.5f; o.out_flag = run % 7 == 0;
          Tensor x = variant == 1 ? tied(t, T, E, uint32_t(run), 3) : randn(t, {T, E}, uint32_t(run), 2.f);
          Tensor bias = randn(DType::f32, {1, E}, uint32_t(run + 2), 0.1f);
          // Tied rows: one bias a group (0 or 1), so equal group sums are equal sums of equal terms in
          // fp32 and fp64 alike ((s1 + b1) + (s2 + b2) = (s1 + b2) + (s2 + b1) exactly only in real numbers).
          for (int64_t e = 0; variant == 1 && e < E; ++e) bias.ptr<float>()[e] = float((e / (E / G)) % 2);
          if (variant == 2)
            for (int64_t e = 0; e < E; e += 5) bias.ptr<float>()[e] = 1.5f;
          const bool with_bias = variant > 0 || (mode == 1 && run % 2 == 0);  // mode 1 without bias: keys = the sigmoids
          if (with_bias) o.bias = bias.view().reshape({E});
          std::string what = std::string(cpu::isa_name(isa)) + " " + dtype_name(t) + " T" + std::to_string(T) + " E" + std::to_string(E) +
                             " G" + std::to_string(G) + " kg" + std::to_string(kg) + " k" + std::to_string(o.k) + " mode " +
                             std::to_string(mode) + " variant " + std::to_string(variant) + " bias " + std::to_string(with_bias);
          GatingResult f = moe_gating_top_k(x, o);
          expect_match(f, ref::moe_gating_top_k(x, o), t, what);
          if (variant == 2) {  // the bias decided some choices
            GatingTopKOptions u = o;
            u.bias = {};
            GatingResult g = moe_gating_top_k(x, u);
            expect_match(g, ref::moe_gating_top_k(x, u), t, what + " unbiased");
            int64_t differ = 0;
            for (int64_t i = 0; i < f.expert_idx.numel(); ++i) differ += f.expert_idx.ptr<int32_t>()[i] != g.expert_idx.ptr<int32_t>()[i];
            EXPECT_GT(differ, 0) << what;
          }
        }
  // Huge logits: sigmoids of 0 and 1 (ties in fp32 and fp64), with a bias.
  {
    Tensor x = randn(DType::f32, {40, 256}, 21, 2.f);
    for (int64_t i = 0; i < 40 * 256; ++i)
      if (i % 3 == 0) x.ptr<float>()[i] = i % 2 ? 1e30f : -1e30f;
    Tensor bias = tied(DType::f32, 1, 256, 22, 2);
    for (int mode : {0, 1}) {
      GatingTopKOptions o;
      o.k = 8; o.norm_type = 1; o.group_count = 8; o.k_group = 4; o.group_select_mode = mode; o.bias = bias.view().reshape({256});
      expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, "huge logits mode " + std::to_string(mode));
    }
  }
  for (float bad : {NAN, INFINITY, -INFINITY})
    for (int64_t row : {3, 16, 31}) {
      Tensor x = randn(DType::f32, {48, 256}, 5);
      x.ptr<float>()[row * 256 + (row * 37) % 256] = bad;
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " row " + std::to_string(row) + " value " + std::to_string(bad));
      GatingTopKOptions o;
      o.k = 8; o.norm_type = 1; o.group_count = 8; o.k_group = 4; o.group_select_mode = 1;
      Tensor bias = randn(DType::f32, {256}, 6, 0.1f);
      o.bias = bias;
      EXPECT_OT_ERROR(moe_gating_top_k(x, o), "x");
    }
}

// The AVX2 row kernel's edges (router__avx2.cpp), on every path: E not a multiple of 8 and up to
// 512 (8 or 16 column maxima, folded for k <= 4), k = E; rows of a few levels whose ties at the k-th
// place are ranked exactly (up to 64 candidates) or, flat, by the scalar row; huge logits (3e7:
// the softmax by the scalar row; +-1e30: 2^t at its clamps); groups of 9
// experts (not whole vectors) with bias and a mask; a mask leaving exactly k experts.
TEST(MoeRouterPaths, RowKernelEdges) {
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    for (int64_t E : {3, 9, 36, 100, 512})
      for (int64_t k : {int64_t(1), int64_t(4), int64_t(9), int64_t(16), E}) {
        if (k > E || k > 16) continue;
        const int64_t T = 23;
        std::string what = std::string(cpu::isa_name(isa)) + " E" + std::to_string(E) + " k" + std::to_string(k);
        Tensor x = randn(DType::f32, {T, E}, uint32_t(E * 5 + k), 2.f);
        Tensor lv = tied(DType::f32, T, E, uint32_t(E + k), 6);
        for (int64_t r = 0; r < T; ++r)
          for (int64_t e = 0; e < E; ++e) {
            float* p = x.ptr<float>() + r * E + e;
            if (r % 4 == 1) *p = lv.ptr<float>()[r * E + e];                 // 6 levels: ties at the k-th place
            if (r == 6) *p = 0.5f;                                            // flat
            // Huge rows (equal logits where the fp64 scores tie: the same order on logits and scores).
            if (r == 10) *p = 3e7f + 2.f * float(e % 300);  // the softmax by the scalar row
            if (r == 14) *p = e % 2 ? 1e30f : -1e30f;         // saturated sigmoid / softmax
          }
        expect_match(moe_gating_top_k_softmax(x, k), ref::moe_gating_top_k_softmax(x, k), DType::f32, what + " v1");
        for (int renorm : {0, 1})
          expect_match(moe_gating_top_k_softmax_v2(x, k, {}, renorm, renorm == 0), ref::moe_gating_top_k_softmax_v2(x, k, {}, renorm, renorm == 0),
                       DType::f32, what + " v2 renorm " + std::to_string(renorm));
        GatingTopKOptions o;
        o.k = k; o.routed_scaling_factor = 1.5f; o.out_flag = true;
        expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " gating softmax");
        // Sigmoid, and keys with a bias: without the 3e7 row (its sigmoids tie in fp64 where the
        // logits differ; its tiny fp64 softmax scores break the bias levels' ties).
        for (int64_t e = 0; e < E; e += 2) x.ptr<float>()[10 * E + e] = 0.f;
        for (int64_t e = 1; e < E; e += 2) x.ptr<float>()[10 * E + e] = float(e % 5);
        for (int norm : {0, 1}) {
          o.norm_type = norm;
          o.bias = {};
          if (norm == 1) expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " gating sigmoid");
          Tensor bias = tied(DType::f32, 1, E, uint32_t(E), 3);
          o.bias = bias.view().reshape({E});
          expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " gating bias norm " + std::to_string(norm));
        }
      }
    // Groups of 9 experts (E 36, 4 groups), both group scores, bias, a mask; tied rows too.
    for (int mode : {0, 1})
      for (int variant : {0, 1}) {
        const int64_t T = 31, E = 36;
        GatingTopKOptions o;
        o.k = 5; o.group_count = 4; o.k_group = 2; o.group_select_mode = mode; o.norm_type = (mode + variant) % 2; o.out_flag = true;
        Tensor x = variant == 0 ? randn(DType::bf16, {T, E}, uint32_t(40 + mode), 2.f) : tied(DType::bf16, T, E, uint32_t(41 + mode), 4);
        Tensor bias = randn(DType::f32, {E}, 7, 0.3f);
        Tensor allowed = Tensor::empty(DType::u8, {T, E});
        for (int64_t i = 0; i < T * E; ++i) allowed.ptr<uint8_t>()[i] = (i / E) % 3 != 0 || i % 4 != 1;
        std::string what = std::string(cpu::isa_name(isa)) + " groups of 9 mode " + std::to_string(mode) + " variant " + std::to_string(variant);
        expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::bf16, what);
        o.bias = bias;
        o.allowed = allowed;
        expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::bf16, what + " bias mask");
      }
    // A mask leaving exactly k of 20 experts (fp16 logits).
    Tensor x = randn(DType::f16, {17, 20}, 8, 2.f);
    Tensor allowed = Tensor::zeros(DType::u8, {17, 20});
    for (int64_t r = 0; r < 17; ++r)
      for (int64_t j = 0; j < 6; ++j) allowed.ptr<uint8_t>()[r * 20 + (r + 3 * j) % 20] = 1;
    std::string what = std::string(cpu::isa_name(isa)) + " exactly k allowed";
    expect_match(moe_gating_top_k_softmax_v2(x, 6, {}, 0, true, allowed), ref::moe_gating_top_k_softmax_v2(x, 6, {}, 0, true, allowed), DType::f16, what);
    GatingTopKOptions o;
    o.k = 6; o.norm_type = 1; o.allowed = allowed;
    expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f16, what + " gating");
  }
}

// The t8 kernels' candidate bitmask at its edges: rows of exactly 14..17 candidates (a tie at 1.0
// with every other logit below it: 8 of the tied experts in experts 0-7, one byte of the mask and 8
// distinct column maxima, so the threshold is 1.0 for any k <= 8; the rest spread over the row):
// up to 16 the block decides them (ties to the lower expert, across mask bytes and words), 17 go to
// the row kernel. Two blocks a call; E 64 (one mask word), 128, 256 (four words); both AVX2 forms.
TEST(MoeRouterPaths, TokensInLanesCandidateBoundary) {
  for (cpu::Isa isa : paths())
    for (int64_t knob : {1, 0}) {
      if (knob == 0 && isa != cpu::Isa::avx2) continue;
      cpu::ScopedMaxIsa cap(isa);
      knobs::set("moe.router_t8", knob);
      for (int64_t E : {64, 128, 256})
        for (int64_t k : {1, 3, 8}) {
          const int64_t T = 16;
          Tensor x = randn(DType::f32, {T, E}, uint32_t(E + k), 0.1f);
          std::mt19937 g(uint32_t(E * k));
          for (int64_t r = 0; r < T; ++r) {
            float* row = x.ptr<float>() + r * E;
            for (int64_t e = 0; e < E; ++e) row[e] -= 3.f;
            const int64_t n = 14 + r % 4;
            for (int64_t e = 0; e < 8; ++e) row[e] = 1.f;
            for (int64_t c = 8; c < n;) {
              const int64_t e = 8 + int64_t(g() % uint32_t(E - 8));
              if (row[e] != 1.f) row[e] = 1.f, ++c;
            }
          }
          std::string what = std::string(cpu::isa_name(isa)) + " knob " + std::to_string(knob) + " E" + std::to_string(E) + " k" + std::to_string(k);
          expect_match(moe_gating_top_k_softmax(x, k), ref::moe_gating_top_k_softmax(x, k), DType::f32, what + " v1");
          expect_match(moe_gating_top_k_softmax_v2(x, k, {}, 1, false), ref::moe_gating_top_k_softmax_v2(x, k, {}, 1, false), DType::f32, what + " v2");
          GatingTopKOptions o;
          o.k = k; o.norm_type = 1; o.routed_scaling_factor = 2.5f;
          expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), DType::f32, what + " sigmoid");
        }
    }
  knobs::set("moe.router_t8", knobs::find("moe.router_t8").default_value());
}

// The AVX2 8-tokens-in-lanes kernel (router_t8__avx2.cpp: softmax routers selecting on the logits,
// E a multiple of 8 up to 256, k <= 8, no mask / scores output; sigmoid gating, below), on every
// path and with the
// moe.router_t8 knob at both values (0: the AVX2 row kernel): T 1 and 3 (the row kernel), 4 and 7
// (one padded block), 8, 9 (a block and a row), 15, 513 (blocks, a tail, two threads' chunks); E of
// 1, 2, 3, 16 and 32 vectors; k 1, 3, 8; random rows, rows of a few levels (ties within a row and
// across the 8 tokens of a block: the lower expert wins), flat rows (more than 16 candidates: the
// row kernel) and huge rows (|max| >= 2^24: the scalar row) mixed into blocks; finished rows; fp32
// and bf16; v1 (row_idx), v2 renorm 0 / 1, gating softmax; NaN / +-Inf anywhere is an error.
TEST(MoeRouterPaths, TokensInLanesAvx2) {
  for (cpu::Isa isa : paths())
    for (int64_t knob : {1, 0}) {
      if (knob == 0 && isa != cpu::Isa::avx2) continue;  // the knob only picks between the AVX2 forms
      cpu::ScopedMaxIsa cap(isa);
      knobs::set("moe.router_t8", knob);
      for (DType t : {DType::f32, DType::bf16})
        for (int64_t T : {1, 3, 4, 7, 8, 9, 15, 513})
          for (int64_t E : {8, 16, 24, 128, 256})
            for (int64_t k : {1, 3, 8})
              for (int variant : {0, 1, 2}) {  // random; tied levels; flat, huge and tied rows among random ones
                if ((T == 513 && (E != 128 || variant == 1)) || (variant > 0 && k == 3 && E > 24)) continue;
                Tensor x = variant == 1 ? tied(t, T, E, uint32_t(T + E + k), 3) : randn(t, {T, E}, uint32_t(T * 3 + E + k), 2.f);
                Tensor lv = tied(t, T, E, uint32_t(E * k), 4);
                for (int64_t r = 0; variant == 2 && r < T; ++r)
                  for (int64_t e = 0; e < E; ++e) {
                    if (r % 8 == 2) set_from_double(x, r * E + e, 0.5);                                  // flat
                    if (r % 8 == 5) set_from_double(x, r * E + e, 3e7 + 4.0 * double(e % 5));             // huge
                    if (r % 8 == 6 || r % 8 == 7) set_from_double(x, r * E + e, get_as_double(lv, r * E + e));  // ties
                  }
                std::string what = std::string(cpu::isa_name(isa)) + " knob " + std::to_string(knob) + " " + dtype_name(t) + " T" +
                                   std::to_string(T) + " E" + std::to_string(E) + " k" + std::to_string(k) + " variant " + std::to_string(variant);
                Tensor fin = Tensor::zeros(DType::u8, {T});
                for (int64_t r = 1; r < T; r += 5) fin.ptr<uint8_t>()[r] = 1;
                expect_match(moe_gating_top_k_softmax(x, k, fin), ref::moe_gating_top_k_softmax(x, k, fin), t, what + " v1");
                for (int renorm : {0, 1})
                  expect_match(moe_gating_top_k_softmax_v2(x, k, fin, renorm, false), ref::moe_gating_top_k_softmax_v2(x, k, fin, renorm, false), t,
                               what + " v2 renorm " + std::to_string(renorm));
                GatingTopKOptions o;
                o.k = k; o.routed_scaling_factor = 2.5f;
                expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what + " gating softmax");
              }
      // Sigmoid gating: no groups, or 4 / 8 groups of whole vectors
      // (E 64: groups of one vector; 256: of 4 or 8), k_group 1 / half / all, both group scores,
      // without bias (keys: the logits or, top-2 groups, the sigmoids), with a random bias and with
      // a tied one (one level a group), the scores output; random, tied, and flat / huge rows.
      int run = 0;
      for (int64_t T : {1, 4, 7, 9, 513})
        for (auto [E, G] : {std::pair<int64_t, int64_t>{8, 1}, {64, 1}, {64, 8}, {256, 8}, {256, 4}})
          for (int64_t kg : {int64_t(1), G / 2, G})
            for (int mode : {0, 1})
              for (int variant : {0, 1, 2}) {  // no bias; random bias; tied rows and a bias of a level a group
                if (kg < 1 || (G == 1 && (kg != 1 || mode == 1)) || (T == 513 && (E != 256 || G != 8 || kg != 4))) continue;
                const DType t = ++run % 3 == 0 ? DType::bf16 : DType::f32;
                GatingTopKOptions o;
                o.norm_type = 1; o.group_count = G; o.k_group = kg; o.group_select_mode = mode;
                o.k = std::min<int64_t>(run % 4 == 0 ? 1 : run % 4 == 1 ? 5 : 8, kg * (E / G));
                o.routed_scaling_factor = 2.5f; o.out_flag = run % 2 == 0;
                Tensor x = variant == 2 ? tied(t, T, E, uint32_t(run), 3) : randn(t, {T, E}, uint32_t(run), 2.f);
                for (int64_t r = 0; variant == 0 && r < T; ++r)
                  for (int64_t e = 0; e < E; ++e) {
                    if (r % 8 == 3) set_from_double(x, r * E + e, 0.5);                                        // flat
                    if (r % 8 == 6) set_from_double(x, r * E + e, (e * 7) % 3 == 0 ? 1e30 : -1e30);  // saturated sigmoids
                  }
                Tensor bias = randn(DType::f32, {E}, uint32_t(run + 1), 0.2f);
                for (int64_t e = 0; variant == 2 && e < E; ++e) bias.ptr<float>()[e] = float((e / (E / G)) % 2);
                if (variant > 0) o.bias = bias;
                std::string what = std::string(cpu::isa_name(isa)) + " knob " + std::to_string(knob) + " sigmoid " + dtype_name(t) + " T" +
                                   std::to_string(T) + " E" + std::to_string(E) + " G" + std::to_string(G) + " kg" + std::to_string(kg) +
                                   " k" + std::to_string(o.k) + " mode " + std::to_string(mode) + " variant " + std::to_string(variant);
                expect_match(moe_gating_top_k(x, o), ref::moe_gating_top_k(x, o), t, what);
              }
      for (float bad : {NAN, INFINITY, -INFINITY})
        for (int64_t row : {0, 6, 9, 20}) {
          Tensor x = randn(DType::f32, {21, 64}, 5);
          x.ptr<float>()[row * 64 + (row * 37) % 64] = bad;
          SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " knob " + std::to_string(knob) + " row " + std::to_string(row) + " value " + std::to_string(bad));
          EXPECT_OT_ERROR(moe_gating_top_k_softmax(x, 8), "x");
          EXPECT_OT_ERROR(moe_gating_top_k_softmax_v2(x, 4, {}, 1, false), "x");
          GatingTopKOptions o;
          o.k = 8; o.norm_type = 1; o.group_count = 8; o.k_group = 4; o.group_select_mode = 1;
          EXPECT_OT_ERROR(moe_gating_top_k(x, o), "x");
        }
    }
  knobs::set("moe.router_t8", knobs::find("moe.router_t8").default_value());
}

}  // namespace test_router_paths
