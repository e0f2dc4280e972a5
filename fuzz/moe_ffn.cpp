// moe_ffn on a prepacked store (every router kind, renorm, norm_topk_prob, groups, allowed mask,
// capacity by count or factor, shared expert, residual) against ref::moe_ffn on the unpacked
// weights; moe_ffn on quantised experts (int8 / int4, per channel or groups of 32 / 64,
// symmetric or not, weight-only or W8A8, a float or quantised shared expert) against its
// dequantising reference; and moe_expert_ffn into a caller-owned, guarded `out` with fuzzed
// gather / scatter / scale rows and offsets, against plain loops here.
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"
#include "ot/moe/quant_experts.h"
#include "ot/quant_weights.h"

using namespace ot;
using namespace ot::moe;

namespace {

double max_abs(const TensorView& v) {
  double m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(get_as_double(v, i)));
  return m;
}

// A layer's x [T, H], router weight [E, H] and stacked experts. Logits x . w are exact multiples of
// 1/256 below 1 in magnitude: ties exact, distinct scores far apart; a NaN / Inf in x now and then
// (the NaN policy). odd_router: the router weight is sometimes fp32 beside 16-bit x, or one column
// too wide.
struct Layer {
  fz::Buf &x, &rw, &gate, &up, &down;
};
Layer layer(fz::Input& in, fz::Arena& ar, DType t, int64_t T, int64_t H, int64_t I, int64_t E, bool odd_router) {
  fz::Buf& x = ar.add("x", t, {T, H});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, in.grid(16, -0.5, 0.5));
  if (x.numel() > 0 && in.byte() < 3) x.set(in.range(0, x.numel() - 1), in.pick({std::nan(""), HUGE_VAL}));
  DType rt = t;
  int64_t cols = H;
  if (odd_router) {
    if (in.byte() >= 250) rt = DType::f32;
    if (in.byte() >= 250) cols = H + 1;
  }
  fz::Buf& rw = ar.add("router_weight", rt, {E, cols});
  for (int64_t i = 0; i < rw.numel(); ++i) rw.set(i, in.grid(16, -0.25, 0.25));
  fz::Buf& gate = ar.values(in, "gate", t, {E, H, I}, 0, 0.125);
  fz::Buf& up = ar.values(in, "up", t, {E, H, I}, 0, 0.125);
  fz::Buf& down = ar.values(in, "down", t, {E, I, H}, 0, 0.125);
  return {x, rw, gate, up, down};
}

void ffn(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  const int64_t T = in.range(0, 6), H = in.range(1, 8), I = in.range(1, 8), E = in.range(1, 6);
  const Layer L = layer(in, ar, t, T, H, I, E, true);
  fz::Buf &x = L.x, &rw = L.rw, &gate = L.gate, &up = L.up, &down = L.down;
  MoeFfnOptions o;
  o.k = in.arg(1, std::min<int64_t>(E, 4));
  o.router = RouterKind(in.range(0, 2));
  o.renorm = int(in.arg(0, 1));
  o.norm_topk_prob = in.flag();
  if (o.router == RouterKind::gating_top_k) {
    o.gating.norm_type = int(in.arg(0, 1));
    o.gating.group_count = in.pick<int64_t>({1, 1, E, 2});
    o.gating.k_group = in.arg(1, std::max<int64_t>(o.gating.group_count, 1));
    o.gating.routed_scaling_factor = in.pick({1.f, 2.5f});
  }
  if (in.byte() < 64) {
    fz::Buf& a = ar.add("allowed", DType::u8, {T, E});
    for (int64_t i = 0; i < a.numel(); ++i) a.set(i, in.byte() < 200 ? 1 : 0);
    o.allowed = a;
  }
  const int cap_mode = int(in.range(0, 3));
  if (cap_mode == 1) o.expert_capacity = in.arg(0, T + 1);
  if (cap_mode == 2) o.capacity_factor = in.pick({0.5, 1.0, 1.25, -1.0});
  if (in.byte() < 64) o.residual = ar.values(in, "residual", in.byte() < 250 ? t : DType::f32, {T, H});
  const bool shared = in.byte() < 64;
  const int64_t Is = in.range(1, 4);
  fz::Buf& sg = ar.values(in, "shared_gate", t, {1, H, Is}, 0, 0.125);
  fz::Buf& su = ar.values(in, "shared_up", t, {1, H, Is}, 0, 0.125);
  fz::Buf& sd = ar.values(in, "shared_down", t, {1, Is, H}, 0, 0.125);
  ar.seal();

  std::optional<MoeExperts> ex, shared_ex;
  std::optional<gemm::PackedB> router;
  try {
    ex.emplace(MoeExperts::from_stacked(gate, up, down, WeightLayout::EHI));
    shared_ex.emplace(MoeExperts::from_stacked(sg, su, sd, WeightLayout::EHI));
    router.emplace(gemm::prepack(rw, gemm::BLayout::NK));
  } catch (const Error&) {
    fz::fail("packing well-formed weights threw");
  }
  MoeFfnOptions of = o;
  if (shared) of.shared = &*shared_ex;
  MoeFfnOptions orf = o;
  if (shared) orf.shared = &*shared_ex;
  fz::run_both(
      "moe_ffn", [&] { return moe_ffn(x, *router, *ex, of); },
      [&] { return ref::moe_ffn(x, rw, gate, up, down, orf, sg, su, sd); },
      [&](auto& a, auto& b) {
        fz::expect_close("topk_ids", a.topk_ids, b.topk_ids);
        fz::expect_close("expert_counts", a.expert_counts, b.expert_counts);
        FZ_ASSERT(a.dropped == b.dropped, "dropped ", a.dropped, " vs reference ", b.dropped);
        fz::expect_close("router_logits", a.router_logits, b.router_logits, 1e-5, 1e-6);
        fz::expect_close("topk_weights", a.topk_weights, b.topk_weights, 1e-5, 1e-6);
        fz::expect_close("y", a.y, b.y, fz::rtol_of(t), 4 * fz::rtol_of(t) * max_abs(b.y.view()) + 1e-6);
      });
  ar.check();
}

// gate | up side by side, [E, H, 2I]: the quantised store's gate_up as its reference takes it.
Tensor gate_up_of(const TensorView& gate, const TensorView& up) {
  const int64_t I = gate.sizes[2];
  Tensor cat = Tensor::empty(gate.dtype, {gate.sizes[0], gate.sizes[1], 2 * I});
  copy_into(gate, cat.view().narrow(2, 0, I));
  copy_into(up, cat.view().narrow(2, I, I));
  return cat;
}

void quant_ffn(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16});
  const WeightFormat fmt = in.flag() ? WeightFormat::int4 : WeightFormat::int8;
  const int64_t gs = in.pick<int64_t>({0, 0, 32, 64});
  const bool sym = in.flag();
  const gemm::ActivationQuant aq = fmt == WeightFormat::int8 && in.byte() < 96 ? gemm::ActivationQuant::int8_per_token : gemm::ActivationQuant::none;
  // Groups divide H (gate/up's K) and I (down's K); int4 packs two columns a byte (H even).
  // Mostly one group a column (the packing loops dominate a run under the sanitizers' coverage).
  const int64_t T = in.range(0, 6), E = in.range(1, 3);
  const int64_t H = gs ? gs * (in.byte() < 32 ? 2 : 1) : 2 * in.range(1, 6), I = gs ? gs * (in.byte() < 32 ? 2 : 1) : in.range(1, 9);
  const Layer L = layer(in, ar, t, T, H, I, E, false);
  fz::Buf &x = L.x, &rw = L.rw, &gate = L.gate, &up = L.up, &down = L.down;
  MoeFfnOptions o;
  o.k = in.arg(1, std::min<int64_t>(E, 4));
  o.router = RouterKind(in.range(0, 2));
  o.norm_topk_prob = in.flag();
  if (in.byte() < 64) o.residual = ar.values(in, "residual", t, {T, H});
  const int shared = int(in.range(0, 3));  // 0, 1: none; 2: float; 3: quantised like the routed store
  fz::Buf& sg = ar.values(in, "shared_gate", t, {1, H, I}, 0, 0.125);
  fz::Buf& su = ar.values(in, "shared_up", t, {1, H, I}, 0, 0.125);
  fz::Buf& sd = ar.values(in, "shared_down", t, {1, I, H}, 0, 0.125);
  ar.seal();

  QuantizedWeights gu, dn, sgu, sdn;
  std::optional<QuantMoeExperts> ex, shared_q;
  std::optional<MoeExperts> shared_f;
  std::optional<gemm::PackedB> router;
  try {
    gu = quantize_weights(gate_up_of(gate, up), fmt, gs, sym);
    dn = quantize_weights(down, fmt, gs, sym);
    ex.emplace(QuantMoeExperts::from_quantized(gu.view(), dn.view(), aq));
    if (shared == 3) {
      sgu = quantize_weights(gate_up_of(sg, su), fmt, gs, sym);
      sdn = quantize_weights(sd, fmt, gs, sym);
      shared_q.emplace(QuantMoeExperts::from_quantized(sgu.view(), sdn.view(), aq));
    }
    if (shared == 2) shared_f.emplace(MoeExperts::from_stacked(sg, su, sd, WeightLayout::EHI));
    router.emplace(gemm::prepack(rw, gemm::BLayout::NK));
  } catch (const Error& e) {
    fz::fail(ot::detail::cat("quantising or packing well-formed weights threw: ", e.what()));
  }
  MoeFfnOptions of = o;
  if (shared == 2) of.shared = &*shared_f;
  if (shared == 3) of.shared_quant = &*shared_q;
  // The reference (the same options: they say which shared expert there is): the float shared
  // expert as given, the quantised one dequantised.
  Tensor dsg, dsu, dsd;
  if (shared == 3) {
    const Tensor w = dequantize_weights(sgu.view());
    dsg = Tensor::copy_of(w.view().narrow(2, 0, I));
    dsu = Tensor::copy_of(w.view().narrow(2, I, I));
    dsd = dequantize_weights(sdn.view());
  }
  const TensorView rg = shared == 2 ? sg.view() : dsg.view(), ru = shared == 2 ? su.view() : dsu.view(), rd = shared == 2 ? sd.view() : dsd.view();
  // W8A8: the rows' int8 rounding can differ by one code where fp32 and fp64 sums straddle an edge.
  const double frac = aq == gemm::ActivationQuant::none ? std::max(4 * fz::rtol_of(t), 1e-3) : 2e-2;
  fz::run_both(
      "moe_ffn (quantised)", [&] { return moe_ffn(x, *router, *ex, of); },
      [&] { return ref::moe_ffn(x, rw, gu.view(), dn.view(), of, rg, ru, rd, aq); },
      [&](auto& a, auto& b) {
        fz::expect_close("topk_ids", a.topk_ids, b.topk_ids);
        fz::expect_close("expert_counts", a.expert_counts, b.expert_counts);
        fz::expect_close("topk_weights", a.topk_weights, b.topk_weights, 1e-5, 1e-6);
        fz::expect_close("y", a.y, b.y, fz::rtol_of(t), frac * max_abs(b.y.view()) + 1e-6);
      });
  ar.check();
}

// out[scatter[i]] (+)= scale[i] * ffn_e(x[gather[i]]) in fp64, the intermediate rounded to dtype t.
void expert_ref(const fz::Buf& x, const fz::Buf& g, const fz::Buf& u, const fz::Buf& d, const ExpertRows& r, int64_t H, int64_t I, DType t,
                std::vector<double>& out, bool acc) {
  std::vector<double> hbuf(static_cast<size_t>(I));
  std::vector<bool> seen(out.size() / size_t(H), false);
  for (size_t e = 0; e + 1 < r.offsets.size(); ++e)
    for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
      const int64_t xe = r.first_expert + int64_t(e), xr = r.gather ? r.gather[i] : i, orow = r.scatter ? r.scatter[i] : i;
      for (int64_t j = 0; j < I; ++j) {
        double a = 0, b = 0;
        for (int64_t h = 0; h < H; ++h) {
          a += x.get(xr * H + h) * g.get((xe * H + h) * I + j);
          b += x.get(xr * H + h) * u.get((xe * H + h) * I + j);
        }
        Tensor one = Tensor::empty(t, {1});
        set_from_double(one, 0, a / (1 + std::exp(-a)) * b);
        hbuf[size_t(j)] = get_as_double(one, 0);
      }
      const double s = r.scale ? r.scale[i] : 1.0;
      if (!acc && !seen[size_t(orow)]) std::fill(out.begin() + orow * H, out.begin() + (orow + 1) * H, 0.0);
      seen[size_t(orow)] = true;
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t j = 0; j < I; ++j) y += hbuf[size_t(j)] * d.get((xe * I + j) * H + h);
        out[size_t(orow * H + h)] += s * y;
      }
    }
}

void expert_ffn(fz::Input& in, fz::Arena& ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16});
  const int64_t H = in.range(1, 8), I = in.range(1, 8), E = in.range(1, 5), X = in.range(0, 6), O = in.range(0, 6);
  fz::Buf& gate = ar.values(in, "gate", t, {E, H, I}, 0, 0.125);
  fz::Buf& up = ar.values(in, "up", t, {E, H, I}, 0, 0.125);
  fz::Buf& down = ar.values(in, "down", t, {E, I, H}, 0, 0.125);
  fz::Buf& x = ar.values(in, "x", in.byte() < 250 ? t : DType::f32, {X, in.byte() < 250 ? H : H + 1}, 0, 0.25);
  const DType ot_ = in.pick({DType::f32, t});
  fz::Buf& out = ar.values(in, "out", ot_, {O, H});
  ExpertRows r;
  const int64_t EL = in.range(0, E + 1);
  r.first_expert = in.byte() < 250 ? in.range(0, std::max<int64_t>(E - EL, 0)) : in.pick<int64_t>({-1, E});
  r.offsets.push_back(in.byte() < 250 ? 0 : 1);
  for (int64_t e = 0; e < EL; ++e) r.offsets.push_back(r.offsets.back() + (in.byte() < 250 ? in.range(0, 3) : -1));
  const int64_t A = std::max<int64_t>(r.offsets.back(), 0);
  std::vector<int32_t> gather(static_cast<size_t>(A)), scatter(static_cast<size_t>(A));
  std::vector<float> scale(static_cast<size_t>(A));
  bool acc = in.flag();
  bool distinct = true;
  std::vector<int32_t> free_rows;
  for (int64_t o = 0; o < O; ++o) free_rows.push_back(int32_t(o));
  for (int64_t i = 0; i < A; ++i) {
    gather[size_t(i)] = int32_t(in.byte() < 250 ? in.range(0, X - 1) : in.pick<int64_t>({-1, X}));
    if (acc || free_rows.empty()) {
      distinct = acc;
      scatter[size_t(i)] = int32_t(in.byte() < 250 ? in.range(0, O - 1) : in.pick<int64_t>({-1, O}));
    } else {  // without accumulate the rows must be distinct
      size_t j = size_t(in.range(0, int64_t(free_rows.size()) - 1));
      scatter[size_t(i)] = free_rows[j];
      free_rows.erase(free_rows.begin() + int64_t(j));
    }
    scale[size_t(i)] = float(in.grid(8, 0, 1));
  }
  if (in.flag()) r.gather = gather.data();
  if (in.flag()) r.scatter = scatter.data();
  if (in.flag()) r.scale = scale.data();
  if (r.scatter && !distinct) acc = true;  // repeated rows without accumulate: undefined, not asked
  ar.seal();
  std::optional<MoeExperts> ex;
  try {
    ex.emplace(MoeExperts::from_stacked(gate, up, down, WeightLayout::EHI));
  } catch (const Error&) {
    fz::fail("packing well-formed weights threw");
  }
  std::vector<double> want(size_t(O * H));
  for (int64_t i = 0; i < O * H; ++i) want[size_t(i)] = out.get(i);
  bool ok = false;
  try {
    moe_expert_ffn(x, *ex, r, out, acc);
    ok = true;
  } catch (const Error& e) {
    FZ_ASSERT(!e.arg().empty(), "moe_expert_ffn: an ot::Error without an argument: ", e.what());
  } catch (const std::exception& e) {
    fz::fail(ot::detail::cat("moe_expert_ffn: not an ot::Error: ", e.what()));
  }
  if (!ok) {  // nothing written
    ar.check();
    return;
  }
  ar.check({&out});
  // Every row id was validated by the call (it succeeded), so the loops below stay in bounds.
  expert_ref(x, gate, up, down, r, H, I, t, want, acc);
  double m = 0;
  for (double v : want) m = std::max(m, std::fabs(v));
  for (int64_t i = 0; i < O * H; ++i) {
    const double got = out.get(i), w = want[size_t(i)];
    FZ_ASSERT(std::fabs(got - w) <= 4 * fz::rtol_of(t == DType::f32 && ot_ == DType::f32 ? DType::f32 : DType::bf16) * (m + std::fabs(w)) + 1e-5,
              "moe_expert_ffn out element ", i, " is ", got, ", reference ", w);
  }
}

}  // namespace

OT_FUZZ_TARGET(in, ar) {
  const uint8_t mode = in.byte();
  if (mode < 120) ffn(in, ar);
  else if (mode < 190) quant_ffn(in, ar);
  else expert_ffn(in, ar);
}
