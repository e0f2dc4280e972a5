// moe_ffn and its stages: fused layer vs the reference over token counts, dtypes, routers, weight
// layouts, capacity, shared expert + residual; expert store updates; losses; errors.
#include <cstring>

#include "helpers.h"
#include "ot/cpu.h"
#include "ot/trace.h"
#include "src/core/knobs.h"

namespace test_ffn {
using namespace ot;
using namespace ot::moe;
using namespace mt;

namespace {
struct Layer {
  int64_t E, H, I;
  Tensor router, gate, up, down;  // EHI: gate/up [E, H, I], down [E, I, H]
  Layer(DType t, int64_t E_, int64_t H_, int64_t I_, uint32_t seed) : E(E_), H(H_), I(I_) {
    router = randn(t, {E, H}, seed, 0.5f);
    gate = randn(t, {E, H, I}, seed + 1, 0.3f);
    up = randn(t, {E, H, I}, seed + 2, 0.3f);
    down = randn(t, {E, I, H}, seed + 3, 0.3f);
  }
  // What moe_ffn takes: the router packed [E, H] (NK) and the experts from the EHI stacks.
  struct Packed {
    gemm::PackedB router;
    MoeExperts ex;
  };
  Packed packed() const { return {gemm::prepack(router, gemm::BLayout::NK), MoeExperts::from_stacked(gate, up, down, WeightLayout::EHI)}; }
};
// [E, a, b] -> [E, b, a] copy (torch Linear layout of an EHI weight).
Tensor transposed(const Tensor& w) {
  int64_t E = w.size(0), a = w.size(1), b = w.size(2);
  Tensor r = Tensor::empty(w.dtype(), {E, b, a});
  copy_into(TensorView(w.view().data, w.dtype(), {E, b, a}, {a * b, 1, b}), r);
  return r;
}
// Rows whose top-k ids agree; outputs compared on those (fp32 vs fp64 logits may flip a near tie).
void expect_ffn_match(const MoeFfnResult& f, const MoeFfnResult& r, DType t, const char* what) {
  ASSERT_EQ(f.y.shape(), r.y.shape()) << what;
  int64_t T = f.y.size(0), H = f.y.size(1), K = f.topk_ids.size(1), bad = 0;
  double m = 0, s = 1e-6;
  for (int64_t i = 0; i < T; ++i) {
    bool same = true;
    for (int64_t k = 0; k < K; ++k) same &= f.topk_ids.ptr<int32_t>()[i * K + k] == r.topk_ids.ptr<int32_t>()[i * K + k];
    if (!same) { ++bad; continue; }
    for (int64_t h = 0; h < H; ++h) {
      m = std::max(m, std::fabs(get_as_double(f.y, i * H + h) - get_as_double(r.y, i * H + h)));
      s = std::max(s, std::fabs(get_as_double(r.y, i * H + h)));
    }
  }
  EXPECT_LE(bad, T / 100) << what;
  EXPECT_LE(m / s, t == DType::f32 ? 1e-4 : tol(t)) << what;
  if (bad == 0) {
    expect_same(f.expert_counts, r.expert_counts, "expert_counts");
    EXPECT_EQ(f.dropped, r.dropped) << what;
  }
}
}  // namespace

TEST(MoeFfn, MatchesReferenceOverTokensAndDtypes) {
  for (DType t : float_types()) {
    Layer L(t, 8, 32, 16, 7);
    auto [router, ex] = L.packed();
    for (int64_t T : {0, 1, 7, 513}) {
      Tensor x = randn(t, {T, 32}, uint32_t(T + 1));
      MoeFfnOptions o;
      o.k = 2;
      o.norm_topk_prob = true;
      MoeFfnResult f = moe_ffn(x, router, ex, o), r = ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o);
      expect_ffn_match(f, r, t, dtype_name(t));
      int64_t total = 0;
      for (int64_t e = 0; e < 8; ++e) total += f.expert_counts.ptr<int64_t>()[e];
      EXPECT_EQ(total, T * 2);
    }
  }
}

// Prefill on the AMX kernel's software model (knob gemm.amx_emulate): experts of >= 16 rows take the
// AMX tiles (rows padded to 32, the down GEMM's race-free column split with whole-panel tiles),
// the rest the vector kernels, in one call.
TEST(MoeFfn, PrefillOnTheAmxKernelModel) {
  if (cpu::detected_isa() < cpu::Isa::avx2) GTEST_SKIP() << "bf16 pairs need AVX2";
  const int64_t prev = knobs::get("gemm.amx_emulate");
  knobs::set("gemm.amx_emulate", 1);
  EXPECT_STREQ(gemm::kernel_name(DType::bf16, DType::bf16, 16), "amx_bf16_emulated");
  {
    const DType t = DType::bf16;  // (fp32 and fp16 weights run on the fp32 kernels)
    Layer L(t, 8, 64, 48, 11);
    auto [router, ex] = L.packed();
    for (int64_t T : {7, 100, 300}) {
      Tensor x = randn(t, {T, 64}, uint32_t(T + 3));
      MoeFfnOptions o;
      o.k = 2;
      o.norm_topk_prob = true;
      MoeFfnResult f = moe_ffn(x, router, ex, o), r = ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o);
      expect_ffn_match(f, r, t, (std::string(dtype_name(t)) + " T " + std::to_string(T)).c_str());
    }
  }
  knobs::set("gemm.amx_emulate", prev);
}

TEST(MoeFfn, RoutersCapacitySharedResidual) {
  DType t = DType::bf16;
  Layer L(t, 8, 32, 16, 11), S(t, 1, 32, 16, 99);
  auto [router, ex] = L.packed();
  MoeExperts shared = MoeExperts::from_stacked(S.gate, S.up, S.down, WeightLayout::EHI);
  Tensor x = randn(t, {129, 32}, 3), res = randn(t, {129, 32}, 4);
  for (int variant = 0; variant < 6; ++variant) {
    MoeFfnOptions o;
    o.k = 2;
    if (variant == 1) { o.router = RouterKind::softmax_topk_v2; o.renorm = 1; }
    if (variant == 2) { o.router = RouterKind::gating_top_k; o.gating.norm_type = 1; o.gating.group_count = 4; o.gating.k_group = 2; o.gating.group_select_mode = 1; o.gating.routed_scaling_factor = 2.5f; }
    if (variant == 3) o.capacity_factor = 0.5;  // capacity overflow: dropped, reported
    if (variant == 4) { o.shared = &shared; o.residual = res; }
    if (variant == 5) o.k = 8;                   // k = E
    MoeFfnResult f = moe_ffn(x, router, ex, o);
    MoeFfnResult r = ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o, S.gate.view().select(0, 0), S.up.view().select(0, 0),
                                  S.down.view().select(0, 0));
    expect_ffn_match(f, r, t, std::to_string(variant).c_str());
    if (variant == 3) {
      EXPECT_GT(f.dropped, 0);
    }
  }
}

// The shared expert's intermediate size differs from the routed experts' (Qwen2-MoE: 4x); both the
// stacked [1, H, Is] and plain [H, Is] shared weights are accepted by the reference.
TEST(MoeFfn, SharedExpertWithItsOwnIntermediate) {
  for (DType t : {DType::f32, DType::bf16}) {
    Layer L(t, 8, 32, 16, 41), S(t, 1, 32, 40, 42);
    auto [router, ex] = L.packed();
    MoeExperts shared = MoeExperts::from_stacked(S.gate, S.up, S.down, WeightLayout::EHI);
    Tensor x = randn(t, {37, 32}, 43);
    MoeFfnOptions o;
    o.k = 2;
    o.shared = &shared;
    MoeFfnResult f = moe_ffn(x, router, ex, o);
    expect_ffn_match(f, ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o, S.gate, S.up, S.down), t, "stacked shared");
    expect_ffn_match(f, ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o, S.gate.view().select(0, 0), S.up.view().select(0, 0), S.down.view().select(0, 0)), t,
                     "2-D shared");
    // The shared expert really contributes (a wrong Is would not be caught by a zero contribution).
    MoeFfnOptions plain = o;
    plain.shared = nullptr;
    EXPECT_GT(nerr(f.y, moe_ffn(x, router, ex, plain).y), 0.05);
    EXPECT_THROW(ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o, S.gate, S.up, L.down), Error);
    // The trace counts the shared expert's flops too: router + 3 GEMMs per pair and per token.
    trace::set_timeline(true);
    moe_ffn(x, router, ex, o);
    trace::set_timeline(false);
    double flops = -1;
    for (const trace::Event& e : trace::take_events()) if (e.name == "moe_ffn") flops = e.flops;
    EXPECT_DOUBLE_EQ(flops, 2.0 * 37 * 32 * (8 + 3.0 * (2 * 16 + 40)));
  }
}

// The shared expert's GEMMs join the routed experts' chain (moe.shared_in_chain = 1) or run in a
// call of their own first (0): the same accumulation order, so the same bits, at decode-sized
// (decode kernel, race-free column shares) and prefill-sized batches, with and without residual.
TEST(MoeFfn, SharedExpertInTheRoutedChainGivesTheSameBits) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (int64_t Is : {16, 40}) {
      Layer L(t, 8, 64, 16, 51), S(t, 1, 64, Is, 52);
      auto [router, ex] = L.packed();
      MoeExperts shared = MoeExperts::from_stacked(S.gate, S.up, S.down, WeightLayout::EHI);
      for (int64_t T : {1, 6, 129}) {
        Tensor x = randn(t, {T, 64}, 53 + uint64_t(T)), res = randn(t, {T, 64}, 54);
        MoeFfnOptions o;
        o.k = 3;
        o.shared = &shared;
        if (T == 6) o.residual = res;
        knobs::set("moe.shared_in_chain", 0);
        MoeFfnResult separate = moe_ffn(x, router, ex, o);
        knobs::set("moe.shared_in_chain", 1);
        MoeFfnResult chained = moe_ffn(x, router, ex, o);
        const std::string what = std::string(dtype_name(t)) + " Is " + std::to_string(Is) + " T " + std::to_string(T);
        ASSERT_EQ(separate.y.view().nbytes(), chained.y.view().nbytes());
        EXPECT_EQ(std::memcmp(separate.y.view().data, chained.y.view().data, chained.y.view().nbytes()), 0) << what;
        expect_ffn_match(chained, ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o, S.gate, S.up, S.down), t, what.c_str());
      }
    }
  }
  knobs::set("moe.shared_in_chain", 1);
}

TEST(MoeFfn, AllTokensOnOneExpertAndEmptyExperts) {
  Layer L(DType::f32, 4, 16, 8, 5);
  auto [router, ex] = L.packed();
  Tensor x = randn(DType::f32, {513, 16}, 6);
  Tensor allowed = Tensor::zeros(DType::u8, {513, 4});
  for (int64_t i = 0; i < 513; ++i) allowed.ptr<uint8_t>()[i * 4 + 2] = 1;
  MoeFfnOptions o;
  o.k = 1;
  o.allowed = allowed;
  MoeFfnResult f = moe_ffn(x, router, ex, o);
  EXPECT_EQ(values(f.expert_counts), (std::vector<double>{0, 0, 513, 0}));
  expect_ffn_match(f, ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o), DType::f32, "one expert");
}

TEST(MoeFfn, WeightLayoutsAgree) {
  DType t = DType::bf16;
  Layer L(t, 4, 32, 16, 21);
  gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
  Tensor x = randn(t, {40, 32}, 8);
  MoeFfnOptions o;
  Tensor base = moe_ffn(x, router, MoeExperts::from_stacked(L.gate, L.up, L.down, WeightLayout::EHI), o).y;
  Tensor torch_y = moe_ffn(x, router, MoeExperts::from_stacked(transposed(L.gate), transposed(L.up), transposed(L.down), WeightLayout::torch), o).y;
  EXPECT_LE(nerr(torch_y, base), 1e-6);
  // Fused gate_up: EHI [E, H, 2I] and torch w13 [E, 2I, H].
  Tensor gu = Tensor::empty(t, {4, 32, 32});
  for (int64_t e = 0; e < 4; ++e) {
    copy_into(L.gate.view().select(0, e), gu.view().select(0, e).narrow(1, 0, 16));
    copy_into(L.up.view().select(0, e), gu.view().select(0, e).narrow(1, 16, 16));
  }
  EXPECT_LE(nerr(moe_ffn(x, router, MoeExperts::from_fused(gu, L.down, WeightLayout::EHI), o).y, base), 1e-6);
  EXPECT_LE(nerr(moe_ffn(x, router, MoeExperts::from_fused(transposed(gu), transposed(L.down), WeightLayout::torch), o).y, base), 1e-6);
}

TEST(MoeFfn, ExpertStoreReplaceAddRemove) {
  DType t = DType::f32;
  Layer A(t, 4, 16, 8, 31), B(t, 4, 16, 8, 41);
  MoeExperts ex = MoeExperts::from_stacked(A.gate, A.up, A.down, WeightLayout::EHI);
  const gemm::PackedB* keep = &ex.gate_up(1);
  ex.set(2, B.gate.view().select(0, 2), B.up.view().select(0, 2), B.down.view().select(0, 2), WeightLayout::EHI);  // replace
  EXPECT_EQ(&ex.gate_up(1), keep);  // others untouched, not repacked
  ex.set(4, B.gate.view().select(0, 0), B.up.view().select(0, 0), B.down.view().select(0, 0), WeightLayout::EHI);  // add: E = 5
  EXPECT_EQ(ex.num_experts(), 5);
  // The same layer built from scratch gives the same result.
  Tensor g = Tensor::empty(t, {5, 16, 8}), u = Tensor::empty(t, {5, 16, 8}), d = Tensor::empty(t, {5, 8, 16});
  for (int64_t e = 0; e < 5; ++e) {
    const Layer& src = e == 2 || e == 4 ? B : A;
    int64_t se = e == 4 ? 0 : e;
    copy_into(src.gate.view().select(0, se), g.view().select(0, e));
    copy_into(src.up.view().select(0, se), u.view().select(0, e));
    copy_into(src.down.view().select(0, se), d.view().select(0, e));
  }
  Tensor router_w = randn(t, {5, 16}, 2);
  gemm::PackedB router = gemm::prepack(router_w, gemm::BLayout::NK);
  Tensor x = randn(t, {33, 16}, 3);
  MoeFfnOptions o;
  o.k = 2;
  expect_ffn_match(moe_ffn(x, router, ex, o), ref::moe_ffn(x, router_w, g, u, d, o), t, "updated store");
  ex.remove(0);
  EXPECT_EQ(ex.num_experts(), 4);
  EXPECT_EQ(&ex.gate_up(0), keep);
  EXPECT_OT_ERROR(ex.remove(4), "e");
  EXPECT_OT_ERROR(ex.set(6, g.view().select(0, 0), u.view().select(0, 0), d.view().select(0, 0), WeightLayout::EHI), "e");
  EXPECT_OT_ERROR(ex.set(0, randn(t, {16, 9}, 1), u.view().select(0, 0), d.view().select(0, 0), WeightLayout::EHI), "gate");
}

// An empty store (default-constructed, or every expert removed) takes H, I and the dtype from the
// next expert; a failing set on it must not leave a half-learned shape behind.
TEST(MoeFfn, ExpertStoreEmpty) {
  DType t = DType::f32;
  Layer A(t, 2, 16, 8, 71), B(DType::bf16, 3, 24, 12, 72);
  auto ga = [&](int64_t e) { return A.gate.view().select(0, e); };
  MoeExperts ex;
  EXPECT_OT_ERROR(ex.set(1, ga(0), A.up.view().select(0, 0), A.down.view().select(0, 0), WeightLayout::EHI), "e");  // E = 0: only e = 0
  EXPECT_OT_ERROR(ex.set(0, ga(0), randn(t, {16, 9}, 1), A.down.view().select(0, 0), WeightLayout::EHI), "up");
  EXPECT_OT_ERROR(ex.set_fused(0, randn(t, {16, 9}, 1), A.down.view().select(0, 0), WeightLayout::EHI), "gate_up");  // odd 2I
  EXPECT_OT_ERROR(ex.set(0, randn(t, {0, 8}, 1), randn(t, {0, 8}, 1), randn(t, {8, 0}, 1), WeightLayout::EHI), "gate");  // H = 0
  EXPECT_EQ(ex.num_experts(), 0);
  EXPECT_EQ(ex.hidden(), 0);  // nothing learned from the failed calls
  EXPECT_EQ(ex.intermediate(), 0);
  ex.set(0, ga(0), A.up.view().select(0, 0), A.down.view().select(0, 0), WeightLayout::EHI);
  ex.set(1, ga(1), A.up.view().select(0, 1), A.down.view().select(0, 1), WeightLayout::EHI);
  EXPECT_EQ(ex.hidden(), 16);
  EXPECT_EQ(ex.intermediate(), 8);
  EXPECT_EQ(ex.dtype(), t);
  // Emptied, the store takes B's H 24, I 12 and bf16 (torch layout this time).
  ex.remove(1);
  ex.remove(0);
  Tensor bg = transposed(B.gate), bu = transposed(B.up), bd = transposed(B.down);
  for (int64_t e = 0; e < 3; ++e) ex.set(e, bg.view().select(0, e), bu.view().select(0, e), bd.view().select(0, e), WeightLayout::torch);
  EXPECT_EQ(ex.hidden(), 24);
  EXPECT_EQ(ex.intermediate(), 12);
  EXPECT_EQ(ex.dtype(), DType::bf16);
  gemm::PackedB router = gemm::prepack(B.router, gemm::BLayout::NK);
  Tensor x = randn(DType::bf16, {9, 24}, 5);
  MoeFfnOptions o;
  o.k = 2;
  expect_ffn_match(moe_ffn(x, router, ex, o), ref::moe_ffn(x, B.router, B.gate, B.up, B.down, o), DType::bf16, "refilled store");
  // H and I given at construction stay fixed, also while the store is empty.
  MoeExperts fixed(16, 8);
  EXPECT_OT_ERROR(fixed.set(0, B.gate.view().select(0, 0), B.up.view().select(0, 0), B.down.view().select(0, 0), WeightLayout::EHI), "gate");
  fixed.set(0, ga(0), A.up.view().select(0, 0), A.down.view().select(0, 0), WeightLayout::EHI);
  EXPECT_EQ(fixed.num_experts(), 1);
  EXPECT_OT_ERROR(MoeExperts(0, 8), "hidden");  // checked at construction, not at the first set
  EXPECT_OT_ERROR(MoeExperts(16, -1), "intermediate");
}

// A failing set / set_fused / remove changes neither the store (ids, shape, dtype, packed weights)
// nor the tensors the caller passed in.
TEST(MoeFfn, NothingTheCallerOwnsChangesOnError) {
  DType t = DType::f32;
  Layer A(t, 3, 16, 8, 81);
  MoeExperts ex = MoeExperts::from_stacked(A.gate, A.up, A.down, WeightLayout::EHI);
  std::vector<const gemm::PackedB*> packed;
  for (int64_t e = 0; e < 3; ++e) { packed.push_back(&ex.gate_up(e)); packed.push_back(&ex.down(e)); }
  Tensor g = randn(t, {16, 8}, 1), u = randn(t, {16, 8}, 2), d = randn(t, {8, 16}, 3);
  Tensor bad_u = randn(t, {16, 9}, 4), h16 = randn(DType::f16, {16, 8}, 5), gu_odd = randn(t, {16, 15}, 6);
  Tensor gu = randn(t, {16, 16}, 7), bad_d = randn(t, {8, 15}, 8);
  std::vector<std::pair<const Tensor*, std::vector<double>>> mine;
  for (const Tensor* p : {&g, &u, &d, &bad_u, &h16, &gu_odd, &gu, &bad_d}) mine.push_back({p, values(*p)});
  auto unchanged = [&](const char* what) {
    EXPECT_EQ(ex.num_experts(), 3) << what;
    EXPECT_EQ(ex.hidden(), 16) << what;
    EXPECT_EQ(ex.intermediate(), 8) << what;
    EXPECT_EQ(ex.dtype(), t) << what;
    for (int64_t e = 0; e < std::min<int64_t>(3, ex.num_experts()); ++e) {
      EXPECT_EQ(&ex.gate_up(e), packed[size_t(2 * e)]) << what << " expert " << e;
      EXPECT_EQ(&ex.down(e), packed[size_t(2 * e + 1)]) << what << " expert " << e;
    }
    for (auto& [p, v] : mine) EXPECT_EQ(values(*p), v) << what;
  };
  EXPECT_OT_ERROR(ex.set(4, g, u, d, WeightLayout::EHI), "e");
  unchanged("set e > E");
  EXPECT_OT_ERROR(ex.set(-1, g, u, d, WeightLayout::EHI), "e");
  unchanged("set e < 0");
  EXPECT_OT_ERROR(ex.set(1, g, bad_u, d, WeightLayout::EHI), "up");
  unchanged("set bad up");
  EXPECT_OT_ERROR(ex.set(3, h16, h16, Tensor::copy_of(TensorView(h16.view().data, DType::f16, {8, 16})), WeightLayout::EHI), "weights");
  unchanged("set other dtype");
  EXPECT_OT_ERROR(ex.set(0, g, u, d, WeightLayout::torch), "gate");  // EHI shapes called torch
  unchanged("set wrong layout");
  EXPECT_OT_ERROR(ex.set_fused(3, gu_odd, d, WeightLayout::EHI), "gate_up");
  unchanged("set_fused odd 2I");
  EXPECT_OT_ERROR(ex.set_fused(2, gu, bad_d, WeightLayout::EHI), "down");
  unchanged("set_fused bad down");
  EXPECT_OT_ERROR(ex.remove(3), "e");
  unchanged("remove e = E");
  EXPECT_OT_ERROR(ex.remove(-1), "e");
  unchanged("remove e < 0");
}

TEST(MoeFfn, StagesComposeForExpertParallelism) {
  // Two "ranks" each run their half of the experts on the same routing; the sum equals moe_ffn.
  DType t = DType::f32;
  Layer L(t, 8, 16, 8, 51);
  auto [router, ex] = L.packed();
  Tensor x = randn(t, {65, 16}, 4);
  MoeFfnOptions o;
  o.k = 3;
  MoeFfnResult full = moe_ffn(x, router, ex, o);
  Tensor y = Tensor::zeros(DType::f32, {65, 16});
  for (int64_t rank = 0; rank < 2; ++rank) {
    RoutingPlan p = moe_routing_plan(full.topk_ids, full.topk_weights, 8, -1, rank * 4, rank * 4 + 4);
    EXPECT_EQ(p.first_expert, rank * 4);
    moe_expert_ffn(x, ex, p.rows(), y, true);
  }
  EXPECT_LE(nerr(y, full.y), 1e-5);
  // Grouped FFN on already-permuted rows (what EP dispatch delivers): no gather, no scatter.
  RoutingPlan p = moe_routing_plan(full.topk_ids, full.topk_weights, 8);
  Tensor xs = Tensor::empty(t, {p.rows().rows(), 16});
  for (int64_t i = 0; i < xs.size(0); ++i) std::memcpy(xs.ptr<float>() + i * 16, x.ptr<float>() + p.token[size_t(i)] * 16, 64);
  ExpertRows plain;
  plain.offsets = p.offsets;
  Tensor ys = Tensor::empty(t, {xs.size(0), 16});
  moe_expert_ffn(xs, ex, plain, ys, false);
  Tensor y2 = Tensor::zeros(DType::f32, {65, 16});
  for (int64_t i = 0; i < xs.size(0); ++i)
    for (int64_t h = 0; h < 16; ++h) y2.ptr<float>()[p.token[size_t(i)] * 16 + h] += p.weight[size_t(i)] * ys.ptr<float>()[i * 16 + h];
  EXPECT_LE(nerr(y2, full.y), 1e-5);
}

// EP dispatch delivers int8 rows with a per-row scale: the grouped FFN takes them as they are and
// must equal the FFN of the dequantised rows (fp32 rows through an fp32 copy of the same weights;
// the int8 route stores the SwiGLU intermediate in bf16, hence the bf16 tolerance).
TEST(MoeFfn, ExpertFfnOnInt8RowsWithScales) {
  Layer L(DType::bf16, 6, 64, 40, 71);
  MoeExperts ex = MoeExperts::from_stacked(L.gate, L.up, L.down, WeightLayout::EHI);
  auto f32 = [](const Tensor& t) { Tensor r = Tensor::empty(DType::f32, t.shape()); copy_into(t, r); return r; };
  MoeExperts exf = MoeExperts::from_stacked(f32(L.gate), f32(L.up), f32(L.down), WeightLayout::EHI);
  const int64_t T = 37;
  std::mt19937 rng(9);
  Tensor q = Tensor::empty(DType::i8, {T, 64}), xs = Tensor::empty(DType::f32, {T}), xf = Tensor::empty(DType::f32, {T, 64});
  for (int64_t t = 0; t < T; ++t) {
    xs.ptr<float>()[t] = 0.002f + 0.03f * float(rng() % 100) / 100.f;  // scales differ per row
    for (int64_t h = 0; h < 64; ++h) {
      int8_t v = int8_t(int(rng() % 255) - 127);
      q.ptr<int8_t>()[t * 64 + h] = v;
      xf.ptr<float>()[t * 64 + h] = float(v) * xs.ptr<float>()[t];
    }
  }
  RoutingPlan p = moe_routing_plan(rand_ids(T, 3, 6, 4), randn(DType::f32, {T, 3}, 5), 6);
  // Routed: gather x rows (scale indexed through the gather), weighted scatter-add into tokens.
  Tensor y = Tensor::zeros(DType::f32, {T, 64}), yr = Tensor::zeros(DType::f32, {T, 64});
  moe_expert_ffn(q, ex, p.rows(), y, true, xs);
  moe_expert_ffn(xf, exf, p.rows(), yr, true);
  EXPECT_LE(nerr(y, yr), tol(DType::bf16));
  // Already-permuted rows (no gather / scatter): scale i belongs to row i.
  ExpertRows plain;
  plain.offsets = {0, 10, 10, 30, T, T, T};
  Tensor yp = Tensor::empty(DType::bf16, {T, 64}), ypr = Tensor::empty(DType::f32, {T, 64});
  moe_expert_ffn(q, ex, plain, yp, false, xs);
  moe_expert_ffn(xf, exf, plain, ypr, false);
  EXPECT_LE(nerr(yp, ypr), tol(DType::bf16));
  // A dropped scale changes the result (the test can fail).
  Tensor ones = Tensor::empty(DType::f32, {T});
  for (int64_t t = 0; t < T; ++t) ones.ptr<float>()[t] = 1.f;
  moe_expert_ffn(q, ex, plain, yp, false, ones);
  EXPECT_GT(nerr(yp, ypr), 0.5);
  // Errors: int8 without or with a wrong x_scale, x_scale with float rows.
  EXPECT_OT_ERROR(moe_expert_ffn(q, ex, plain, yp, false), "x_scale");
  EXPECT_OT_ERROR(moe_expert_ffn(q, ex, plain, yp, false, Tensor::empty(DType::f32, {T - 1})), "x_scale");
  EXPECT_OT_ERROR(moe_expert_ffn(q, ex, plain, yp, false, Tensor::empty(DType::bf16, {T})), "x_scale");
  EXPECT_OT_ERROR(moe_expert_ffn(randn(DType::bf16, {T, 64}, 3), ex, plain, yp, false, xs), "x_scale");
  EXPECT_OT_ERROR(moe_expert_ffn(Tensor::zeros(DType::i32, {T, 64}), ex, plain, yp, false, xs), "x");
}

TEST(MoeFfn, BadInput) {
  Layer L(DType::bf16, 4, 16, 8, 61);
  auto [router, ex] = L.packed();
  MoeFfnOptions o;
  EXPECT_OT_ERROR(moe_ffn(randn(DType::f32, {3, 16}, 1), router, ex, o), "experts");  // dtype mismatch
  EXPECT_OT_ERROR(moe_ffn(randn(DType::bf16, {3, 12}, 1), router, ex, o), "x");
  o.k = 5;
  EXPECT_OT_ERROR(moe_ffn(randn(DType::bf16, {3, 16}, 1), router, ex, o), "k");
  o.k = 2;
  o.residual = randn(DType::bf16, {2, 16}, 1);
  EXPECT_OT_ERROR(moe_ffn(randn(DType::bf16, {3, 16}, 1), router, ex, o), "residual");
  gemm::PackedB r3 = gemm::prepack(randn(DType::bf16, {3, 16}, 1), gemm::BLayout::NK);
  EXPECT_OT_ERROR(moe_ffn(randn(DType::bf16, {3, 16}, 1), r3, ex, MoeFfnOptions{}), "router");
  Tensor nan_x = randn(DType::bf16, {3, 16}, 1);
  nan_x.ptr<uint16_t>()[0] = 0x7fc0;
  EXPECT_OT_ERROR(moe_ffn(nan_x, router, ex, MoeFfnOptions{}), "x");  // NaN router scores
  EXPECT_OT_ERROR(moe_routing_plan(ints({1, 2}, {0, 5}), floats(DType::f32, {1, 2}, {1, 1}), 4), "topk_ids");
}

// capacity_factor: 0 means "use expert_capacity"; > 0 gives Megatron's capacity; NaN, Inf or a
// negative factor is an error naming it (a NaN or negative factor used to mean dropless silently).
TEST(MoeFfn, CapacityFactor) {
  const double nan = std::nan(""), inf = HUGE_VAL;
  for (double f : {nan, -1.0, -0.5, inf, -inf}) {
    EXPECT_OT_ERROR_MSG(moe_capacity(10, 2, 8, f), "capacity_factor", "finite number > 0");
  }
  Layer L(DType::f32, 4, 16, 8, 91);
  auto [router, ex] = L.packed();
  Tensor x = randn(DType::f32, {33, 16}, 9);
  MoeFfnOptions o;
  o.k = 2;
  for (double f : {nan, -1.0, inf}) {
    o.capacity_factor = f;
    EXPECT_OT_ERROR_MSG(moe_ffn(x, router, ex, o), "capacity_factor", "finite number > 0");
    EXPECT_OT_ERROR_MSG(ref::moe_ffn(x, L.router, L.gate, L.up, L.down, o), "capacity_factor", "finite number > 0");
  }
  // Factor 0.5: ceil(33 * 2 / 4 * 0.5) = 9 rows per expert, the same as expert_capacity = 9.
  o.capacity_factor = 0.5;
  MoeFfnResult a = moe_ffn(x, router, ex, o);
  o.capacity_factor = 0;
  o.expert_capacity = 9;
  MoeFfnResult b = moe_ffn(x, router, ex, o);
  EXPECT_GT(a.dropped, 0);
  EXPECT_EQ(a.dropped, b.dropped);
  EXPECT_EQ(values(a.y), values(b.y));
}

TEST(MoeLoss, AuxZAndCapacity) {
  // Two tokens, two experts: probs [[0.75, 0.25], [0.25, 0.75]], counts [2, 0] with k = 1:
  // loss = E * sum_i f_i P_i = 2 * (1 * 0.5 + 0 * 0.5) = 1.
  Tensor probs = floats(DType::f32, {2, 2}, {0.75, 0.25, 0.25, 0.75});
  Tensor counts = ints({2}, {2, 0});
  EXPECT_NEAR(moe_aux_loss(probs, counts, 1), 1.0, 1e-6);
  EXPECT_NEAR(moe_aux_loss(probs, counts, 1, 0.01f), 0.01, 1e-8);
  Tensor p = randn(DType::f32, {65, 8}, 1);
  Tensor c = ints({8}, {10, 20, 0, 5, 30, 15, 25, 25});
  EXPECT_NEAR(moe_aux_loss(p, c, 2), ref::moe_aux_loss(p, c, 2), 1e-5);
  Tensor logits = floats(DType::f32, {2, 2}, {0, 0, 1, 1});
  double l0 = std::log(2.0), l1 = 1 + std::log(2.0);
  EXPECT_NEAR(moe_z_loss(logits), (l0 * l0 + l1 * l1) / 2, 1e-5);
  Tensor mask = Tensor::zeros(DType::u8, {2});
  mask.ptr<uint8_t>()[1] = 1;
  EXPECT_NEAR(moe_z_loss(logits, 1.f, mask), l1 * l1, 1e-5);
  Tensor lg = randn(DType::bf16, {33, 8}, 2);
  EXPECT_NEAR(moe_z_loss(lg, 0.1f), ref::moe_z_loss(lg, 0.1f), 1e-4);
  EXPECT_EQ(moe_capacity(512, 8, 128, 1.25), 40);   // ceil(512*8/128*1.25)
  EXPECT_EQ(moe_capacity(10, 2, 8, 1.0, 4), 4);     // ceil(2.5) = 3, raised to min_capacity
  EXPECT_OT_ERROR(moe_aux_loss(probs, ints({3}, {1, 1, 0}), 1), "tokens_per_expert");
  EXPECT_OT_ERROR(moe_aux_loss(probs, counts, 3), "k");
  EXPECT_OT_ERROR(moe_capacity(10, 2, 8, 0.0), "capacity_factor");
}

}  // namespace test_ffn
