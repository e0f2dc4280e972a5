// moe_ffn on quantised experts against its reference (dequantize_weights, then the plain moe_ffn
// reference) on every ISA path of this machine: int8 per channel and group-wise, int4 per channel
// and groups 32 / 64 / 128, symmetric and asymmetric; T = 0, 1, 5, 33 with one expert that gets no
// tokens; I odd and not a multiple of the 32-column panel; x fp32 / bf16; shared expert and
// residual; torch layout; bit-reproducibility; errors before any output is written.
#include <cmath>
#include <string>

#include "helpers.h"
#include "ot/cpu.h"
#include "ot/moe/quant_experts.h"
#include "ot/quant.h"

namespace test_ffn_quant {
using namespace ot;
using namespace ot::moe;
using mt::randn;

namespace {

struct Fmt { WeightFormat f; int64_t gs; bool sym; int64_t H, I; };

std::vector<cpu::Isa> paths() {
  std::vector<cpu::Isa> v{cpu::Isa::scalar};
  if (cpu::detected_isa() >= cpu::Isa::avx2) v.push_back(cpu::Isa::avx2);
  if (cpu::detected_isa() >= cpu::Isa::avx512) v.push_back(cpu::Isa::avx512);
  return v;
}

// Relative Frobenius error of y vs the reference over the rows whose top-k ids agree (fp32 vs fp64
// logits may flip a near tie); *bad counts the others.
double rel_frob_rows(const MoeFfnResult& f, const MoeFfnResult& r, int64_t* bad) {
  EXPECT_EQ(f.y.view().shape(), r.y.view().shape());
  const int64_t T = f.y.size(0), H = f.y.size(1), K = f.topk_ids.size(1);
  double d = 0, n = 0;
  *bad = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t k = 0; k < K; ++k) same &= f.topk_ids.ptr<int32_t>()[t * K + k] == r.topk_ids.ptr<int32_t>()[t * K + k];
    if (!same) { ++*bad; continue; }
    for (int64_t h = 0; h < H; ++h) {
      const double a = get_as_double(f.y, t * H + h), b = get_as_double(r.y, t * H + h);
      d += (a - b) * (a - b);
      n += b * b;
    }
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// Quantised gate_up [E, H, 2I] and down [E, I, H] as the store holds them (for the reference).
struct QLayer {
  Tensor router, gate, up, down;
  QuantizedWeights gu, dn;
  QLayer(DType t, int64_t E, int64_t H, int64_t I, const Fmt& fm, uint32_t seed) {
    router = randn(t, {E, H}, seed, 0.5f);
    gate = randn(t, {E, H, I}, seed + 1, 0.3f);
    up = randn(t, {E, H, I}, seed + 2, 0.3f);
    down = randn(t, {E, I, H}, seed + 3, 0.3f);
    Tensor cat = Tensor::empty(t, {E, H, 2 * I});
    copy_into(gate, cat.view().narrow(2, 0, I));
    copy_into(up, cat.view().narrow(2, I, I));
    gu = quantize_weights(cat, fm.f, fm.gs, fm.sym);
    dn = quantize_weights(down, fm.f, fm.gs, fm.sym);
  }
};

const std::vector<Fmt> kFormats = {
    {WeightFormat::int8, 0, true, 72, 41},    {WeightFormat::int8, 0, false, 72, 41},   {WeightFormat::int4, 32, true, 160, 96},
    {WeightFormat::int4, 32, false, 160, 96}, {WeightFormat::int4, 64, true, 128, 64},  {WeightFormat::int4, 64, false, 128, 64},
    {WeightFormat::int4, 128, true, 128, 128}, {WeightFormat::int4, 128, false, 128, 128}, {WeightFormat::int8, 64, false, 64, 64},
    {WeightFormat::int4, 0, true, 40, 37},
};

std::string name_of(const Fmt& fm) {
  return std::string(weight_format_name(fm.f)) + " gs=" + std::to_string(fm.gs) + (fm.sym ? " sym" : " asym") + " H=" + std::to_string(fm.H) +
         " I=" + std::to_string(fm.I);
}

}  // namespace

TEST(MoeFfnQuant, MatchesDequantisedReference) {
  const int64_t E = 6;
  int combo = 0;
  for (const Fmt& fm : kFormats) {
    ++combo;
    const DType xt = combo % 3 == 0 ? DType::f32 : DType::bf16;
    QLayer L(xt, E, fm.H, fm.I, fm, uint32_t(10 * combo));
    gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
    QuantMoeExperts ex = QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, fm.f, fm.gs, fm.sym);
    EXPECT_EQ(ex.num_experts(), E);
    EXPECT_EQ(ex.hidden(), fm.H);
    EXPECT_EQ(ex.intermediate(), fm.I);
    EXPECT_EQ(ex.symmetric(), fm.sym);
    for (int64_t T : {0, 1, 5, 33}) {
      Tensor x = randn(xt, {T, fm.H}, uint32_t(100 + combo + T));
      Tensor allowed = Tensor::zeros(DType::u8, {T, E});  // expert 3 gets no tokens
      for (int64_t i = 0; i < T * E; ++i) allowed.ptr<uint8_t>()[i] = i % E != 3;
      MoeFfnOptions o;
      o.k = 2;
      o.allowed = allowed;
      o.norm_topk_prob = true;
      MoeFfnResult r = ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o);
      const std::string what = name_of(fm) + " T=" + std::to_string(T) + " " + dtype_name(xt);
      for (cpu::Isa isa : paths()) {
        cpu::ScopedMaxIsa cap(isa);
        MoeFfnResult f = moe_ffn(x, router, ex, o);
        ASSERT_EQ(f.y.dtype(), xt) << what;
        EXPECT_EQ(f.expert_counts.ptr<int64_t>()[3], 0) << what;
        int64_t bad = 0;
        const double err = rel_frob_rows(f, r, &bad);
        EXPECT_LE(bad, 1) << what;
        EXPECT_LE(err, xt == DType::f32 ? 1e-4 : 4e-3) << what << " isa=" << cpu::isa_name(isa);
      }
    }
  }
}

TEST(MoeFfnQuant, SharedExpertResidualAndTorchLayout) {
  const Fmt fm{WeightFormat::int4, 64, false, 128, 64};
  const int64_t E = 5, T = 9;
  QLayer L(DType::bf16, E, fm.H, fm.I, fm, 7);
  gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
  QuantMoeExperts ex = QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, fm.f, fm.gs, fm.sym);
  Tensor sg = randn(DType::bf16, {1, fm.H, 24}, 70, 0.3f), su = randn(DType::bf16, {1, fm.H, 24}, 71, 0.3f),
         sd = randn(DType::bf16, {1, 24, fm.H}, 72, 0.3f);
  MoeExperts shared = MoeExperts::from_stacked(sg, su, sd, WeightLayout::EHI);
  Tensor x = randn(DType::bf16, {T, fm.H}, 8), res = randn(DType::bf16, {T, fm.H}, 9);
  MoeFfnOptions o;
  o.k = 2;
  o.shared = &shared;
  o.residual = res;
  MoeFfnResult f = moe_ffn(x, router, ex, o), r = ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o, sg, su, sd);
  int64_t bad = 0;
  EXPECT_LE(rel_frob_rows(f, r, &bad), 4e-3);
  EXPECT_EQ(bad, 0);
  // torch layout (gate/up [E, I, H], down [E, H, I]) quantises to the same codes: bit-identical y.
  auto tr = [](const Tensor& w) {
    const int64_t n = w.size(0), a = w.size(1), b = w.size(2);
    Tensor t = Tensor::empty(w.dtype(), {n, b, a});
    copy_into(TensorView(w.view().data, w.dtype(), {n, b, a}, {a * b, 1, b}), t);
    return t;
  };
  QuantMoeExperts ext = QuantMoeExperts::quantize(tr(L.gate), tr(L.up), tr(L.down), WeightLayout::torch, fm.f, fm.gs, fm.sym);
  Tensor yt = moe_ffn(x, router, ext, o).y, y2 = moe_ffn(x, router, ex, o).y;
  EXPECT_EQ(std::memcmp(yt.view().data, f.y.view().data, f.y.view().nbytes()), 0) << "torch layout";
  EXPECT_EQ(std::memcmp(y2.view().data, f.y.view().data, f.y.view().nbytes()), 0) << "run to run";
  // The store from quantize_weights' output is the same store.
  QuantMoeExperts exq = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view());
  Tensor yq = moe_ffn(x, router, exq, o).y;
  EXPECT_EQ(std::memcmp(yq.view().data, f.y.view().data, f.y.view().nbytes()), 0) << "from_quantized";
}

TEST(MoeFfnQuant, BadInputIsANamedError) {
  const Fmt fm{WeightFormat::int8, 0, true, 64, 40};
  QLayer L(DType::bf16, 4, fm.H, fm.I, fm, 3);
  auto arg_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // group size not supported / not dividing I = 40; down of the wrong shape; format mismatch.
  EXPECT_NE(arg_of([&] { QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, WeightFormat::int4, 48, true); }).find("group_size"),
            std::string::npos);
  EXPECT_NE(arg_of([&] { QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, WeightFormat::int4, 32, true); }).find("group_size"),
            std::string::npos);
  EXPECT_NE(arg_of([&] { QuantMoeExperts::quantize(L.gate, L.up, L.gate, WeightLayout::EHI, WeightFormat::int8, 0, true); }).find("down"),
            std::string::npos);
  QuantizedWeights d4 = quantize_weights(L.down, WeightFormat::int4, 0, true);
  EXPECT_NE(arg_of([&] { QuantMoeExperts::from_quantized(L.gu.view(), d4.view()); }).find("down"), std::string::npos);
  QuantMoeExperts ex = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view());
  gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
  Tensor xw = randn(DType::bf16, {3, fm.H + 1}, 4);
  EXPECT_NE(arg_of([&] { moe_ffn(xw, router, ex, {}); }).find("x"), std::string::npos);
  EXPECT_NE(arg_of([&] { moe_ffn(randn(DType::bf16, {3, fm.H}, 4), router, QuantMoeExperts(), {}); }).find("experts"), std::string::npos);
  // moe_expert_ffn: a scatter id out of range is rejected before out is touched.
  Tensor x = randn(DType::bf16, {2, fm.H}, 5), out = randn(DType::f32, {2, fm.H}, 6), before = Tensor::copy_of(out);
  const int32_t gather[2] = {0, 1}, scatter[2] = {0, 2};
  ExpertRows rows;
  rows.offsets = {0, 1, 2};
  rows.gather = gather;
  rows.scatter = scatter;
  EXPECT_NE(arg_of([&] { moe_expert_ffn(x, ex, rows, out, true); }).find("rows.scatter"), std::string::npos);
  EXPECT_EQ(std::memcmp(out.view().data, before.view().data, out.view().nbytes()), 0);
}

// W8A8 experts (int8 weights, every routed expert's input row quantised per token to int8: x for
// gate/up, the SwiGLU output for down) against the reference that quantises the same rows the same
// way; the shared expert stays bf16. The int8 rounding of an intermediate row can differ by one code
// where the fp32 and fp64 sums straddle a rounding edge, hence 2e-3 for fp32 outputs.
TEST(MoeFfnQuant, W8A8MatchesItsReference) {
  const int64_t E = 6;
  const gemm::ActivationQuant a8 = gemm::ActivationQuant::int8_per_token;
  int combo = 0;
  for (const Fmt& fm : {Fmt{WeightFormat::int8, 0, true, 72, 41}, Fmt{WeightFormat::int8, 64, false, 64, 64}})
    for (DType xt : {DType::bf16, DType::f32}) {
      ++combo;
      QLayer L(xt, E, fm.H, fm.I, fm, uint32_t(40 + combo));
      gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
      QuantMoeExperts ex = QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, fm.f, fm.gs, fm.sym, a8);
      EXPECT_EQ(ex.activation_quant(), a8);
      for (int64_t T : {0, 1, 5, 33}) {
        Tensor x = randn(xt, {T, fm.H}, uint32_t(300 + combo + T));
        MoeFfnOptions o;
        o.k = 2;
        o.norm_topk_prob = true;
        MoeFfnResult r = ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o, {}, {}, {}, a8);
        const std::string what = name_of(fm) + " T=" + std::to_string(T) + " " + dtype_name(xt);
        if (T > 1) {  // the reference is lossy against weight-only (a W8A8 path that kept the rows would fail)
          int64_t bad = 0;
          EXPECT_GT(rel_frob_rows(r, ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o), &bad), 5e-4) << what;
        }
        for (cpu::Isa isa : paths()) {
          cpu::ScopedMaxIsa cap(isa);
          MoeFfnResult f = moe_ffn(x, router, ex, o);
          int64_t bad = 0;
          EXPECT_LE(rel_frob_rows(f, r, &bad), xt == DType::f32 ? 2e-3 : 4e-3) << what << " isa=" << cpu::isa_name(isa);
          EXPECT_LE(bad, 1) << what;
        }
      }
    }
  // int4 codes cannot take int8 activations.
  QLayer L(DType::bf16, E, 64, 64, Fmt{WeightFormat::int4, 32, true, 64, 64}, 9);
  EXPECT_THROW(QuantMoeExperts::quantize(L.gate, L.up, L.down, WeightLayout::EHI, WeightFormat::int4, 32, true, a8), Error);
}

// A W8A8 store takes rows already quantised per token (codes and scales, as EP's int8 dispatch
// delivers them) and gives the bits of the same rows quantised inside the call; other stores and
// missing scales are named errors.
TEST(MoeFfnQuant, W8A8TakesInt8RowsWithTheirScales) {
  const Fmt fm{WeightFormat::int8, 0, true, 64, 40};
  const int64_t E = 4, T = 11, K = 2;
  QLayer L(DType::f32, E, fm.H, fm.I, fm, 21);
  QuantMoeExperts a8 = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view(), gemm::ActivationQuant::int8_per_token);
  Tensor x = randn(DType::f32, {T, fm.H}, 22);
  Tensor codes = Tensor::empty(DType::i8, {T, fm.H}), scale = Tensor::empty(DType::f32, {T});
  for (int64_t t = 0; t < T; ++t) scale.ptr<float>()[t] = quantize_row_i8_dynamic(x.ptr<float>() + t * fm.H, fm.H, codes.ptr<int8_t>() + t * fm.H);
  Tensor ids = Tensor::empty(DType::i32, {T, K}), w = Tensor::empty(DType::f32, {T, K});
  for (int64_t i = 0; i < T * K; ++i) ids.ptr<int32_t>()[i] = int32_t((i * 7 + i / K) % E), w.ptr<float>()[i] = 0.25f + 0.05f * float(i % 5);
  RoutingPlan plan = moe_routing_plan(ids, w, E);
  Tensor a = Tensor::zeros(DType::f32, {T, fm.H}), b = Tensor::zeros(DType::f32, {T, fm.H});
  moe_expert_ffn(x, a8, plan.rows(), a, true);
  moe_expert_ffn(codes, a8, plan.rows(), b, true, scale);
  EXPECT_EQ(std::memcmp(a.view().data, b.view().data, a.view().nbytes()), 0);
  QuantMoeExperts w8 = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view());
  EXPECT_OT_ERROR(moe_expert_ffn(codes, w8, plan.rows(), b, true, scale), "x");
  EXPECT_OT_ERROR(moe_expert_ffn(codes, a8, plan.rows(), b, true), "x_scale");
  EXPECT_OT_ERROR(moe_expert_ffn(x, a8, plan.rows(), b, true, scale), "x_scale");
}

// A quantised shared expert (opt.shared_quant: weight-only int8 / int4, or W8A8 with W8A8 routed
// experts) against the reference on its dequantised weights; the float paths refuse it.
TEST(MoeFfnQuant, QuantisedSharedExpert) {
  const int64_t E = 5, T = 9, Is = 64;
  for (const auto& [fm, a] : {std::pair{Fmt{WeightFormat::int8, 0, true, 64, 40}, gemm::ActivationQuant::none},
                              std::pair{Fmt{WeightFormat::int4, 32, false, 64, 64}, gemm::ActivationQuant::none},
                              std::pair{Fmt{WeightFormat::int8, 0, true, 64, 40}, gemm::ActivationQuant::int8_per_token}}) {
    QLayer L(DType::bf16, E, fm.H, fm.I, fm, 31);
    gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
    QuantMoeExperts ex = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view(), a);
    QLayer S(DType::bf16, 1, fm.H, Is, Fmt{fm.f, fm.gs, fm.sym, fm.H, Is}, 32);  // the shared expert: E = 1
    QuantMoeExperts shared = QuantMoeExperts::from_quantized(S.gu.view(), S.dn.view(), a);
    // Its dequantised weights for the reference: gate / up halves of [1, H, 2 Is], down [1, Is, H].
    Tensor gu = dequantize_weights(S.gu.view()), dn = dequantize_weights(S.dn.view());
    Tensor x = randn(DType::bf16, {T, fm.H}, 33), res = randn(DType::bf16, {T, fm.H}, 34);
    MoeFfnOptions o;
    o.k = 2;
    o.shared_quant = &shared;
    o.residual = res;
    MoeFfnResult f = moe_ffn(x, router, ex, o);
    MoeFfnResult r = ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o, gu.view().narrow(2, 0, Is), gu.view().narrow(2, Is, Is), dn.view(), a);
    o.shared_quant = nullptr;
    MoeFfnResult without = ref::moe_ffn(x, L.router, L.gu.view(), L.dn.view(), o, {}, {}, {}, a);
    int64_t bad = 0;
    const std::string what = name_of(fm) + (a == gemm::ActivationQuant::none ? "" : " w8a8");
    EXPECT_LE(rel_frob_rows(f, r, &bad), 4e-3) << what;
    EXPECT_EQ(bad, 0) << what;
    EXPECT_GT(rel_frob_rows(r, without, &bad), 1e-2) << what;  // the shared expert contributes
  }
  const Fmt fm{WeightFormat::int8, 0, true, 64, 40};
  QLayer L(DType::bf16, E, fm.H, fm.I, fm, 35);
  QuantMoeExperts ex = QuantMoeExperts::from_quantized(L.gu.view(), L.dn.view());
  gemm::PackedB router = gemm::prepack(L.router, gemm::BLayout::NK);
  MoeExperts fl = MoeExperts::from_stacked(L.gate, L.up, L.down, WeightLayout::EHI);
  MoeFfnOptions o;
  o.shared_quant = &ex;
  Tensor x = randn(DType::bf16, {3, fm.H}, 36);
  EXPECT_OT_ERROR(moe_ffn(x, router, fl, o), "shared_quant");  // float experts
  o.shared = &fl;
  EXPECT_OT_ERROR(moe_ffn(x, router, ex, o), "shared_quant");  // both
}

}  // namespace test_ffn_quant
