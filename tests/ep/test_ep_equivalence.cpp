// dispatch + local experts + combine == the single-process MoE on the concatenated tokens: fp32 bit
// for bit (per-slot combine), bf16 within tolerance, skewed routing with empty ranks, and the seam
// to the MoE layer's own expert FFN.
#include "ep_test_util.h"

#include <cmath>
#include <cstring>

TEST(EpEndToEnd, Fp32BitExactAndForms) {
  Case c = two_per_rank_case();
  Scenario s(c, 8, 2);
  DispatchOptions o = options_for(c);
  o.dedup_combine = false;  // per-slot return, k-order sum: bit-identical
  Tensor got = run_blocking(s.comm, s.mine(), s.ex, o);
  EXPECT_TRUE(bit_equal(got, s.mine_want())) << norm_err(got, s.mine_want());
  o.dedup_combine = true;  // partial sums on the expert rank: rounding differs
  EXPECT_LE(norm_err(run_blocking(s.comm, s.mine(), s.ex, o), s.mine_want()), 1e-6);
  o.dispatcher = Dispatcher::all_gather;
  EXPECT_LE(norm_err(run_blocking(s.comm, s.mine(), s.ex, o), s.mine_want()), 1e-6);
}

TEST(EpEndToEnd, Bf16WithinTolerance) {
  Case c = bf16_four_per_rank_case(32);
  Scenario s(c, 16, 3);
  for (Dispatcher disp : kDispatchers)
    for (bool dedup : {true, false}) {
      DispatchOptions o = options_for(c);
      o.dispatcher = disp;
      o.dedup_combine = dedup;
      Tensor got = run_blocking(s.comm, s.mine(), s.ex, o);
      EXPECT_EQ(got.dtype(), DType::bf16);
      EXPECT_LE(norm_err(got, s.mine_want()), 1.5e-2) << dispatcher_name(disp) << " dedup=" << dedup;
    }
}

TEST(EpEdge, AllTokensToOneRankAndEmptyRanks) {
  Case c = two_per_rank_case();
  c.K = 2;
  c.bs = [](int r) { return int64_t(r % 2 == 0 ? 0 : 5 + r); };
  c.pool = [](int, int64_t) { return std::vector<int>{0, 1}; };  // rank 0's experts only
  Scenario s(c, 8, 9);
  for (Dispatcher disp : kDispatchers) {
    DispatchOptions o = options_for(c);
    o.dispatcher = disp;
    DispatchResult d;
    Tensor got = run_blocking(s.comm, s.mine(), s.ex, o, &d);
    EXPECT_LE(norm_err(got, s.mine_want()), 1e-6);
    if (me() != 0) {
      EXPECT_EQ(d.expand_x.size(0), 0);
    }
  }
}

// Every rank's tokens concatenated in rank order (x, expert ids, scales: each 4-byte) and their count.
struct AllTokens {
  int64_t N = 0;
  std::vector<Tensor> cat;
};
static AllTokens all_tokens(const Case& c, const Inputs& in) {
  AllTokens t;
  for (int r = 0; r < W(); ++r) t.N += c.bs(r);
  t.cat = {Tensor::empty(DType::f32, {t.N, c.H}), Tensor::empty(DType::i32, {t.N, c.K}), Tensor::empty(DType::f32, {t.N, c.K})};
  for (size_t i = 0; i < t.cat.size(); ++i)
    for (int r = 0, o = 0; r < W(); o += int(c.bs(r)), ++r)
      std::memcpy(t.cat[i].ptr<char>() + o * t.cat[i].size(1) * 4, in[size_t(r)][i].ptr<char>(), size_t(c.bs(r) * t.cat[i].size(1)) * 4);
  return t;
}

// The MoE layer's single-process path on every rank's tokens: its routing plan and the store's
// expert FFN, fp32 [N, H].
template <class Store>
static Tensor single_process(const Case& c, const Inputs& in, const Store& all) {
  AllTokens t = all_tokens(c, in);
  moe::RoutingPlan plan = moe::moe_routing_plan(t.cat[1], t.cat[2], c.E);
  Tensor want = Tensor::zeros(DType::f32, {t.N, c.H});
  moe::moe_expert_ffn(t.cat[0], all, plan.rows(), want, true);
  return want;
}
// This rank's rows of single_process's result.
static TensorView mine_rows(const Case& c, const Tensor& want) {
  int64_t mine0 = 0;
  for (int r = 0; r < me(); ++r) mine0 += c.bs(r);
  return want.view().narrow(0, mine0, c.bs(me()));
}

// The seam to the MoE layer: ep_moe_ffn on moe::moe_expert_ffn over this rank's slice of the
// expert store equals the MoE layer's own single-process path on the concatenated tokens.
TEST(EpMoeSeam, MoeExpertFfnMatchesSingleProcessMoe) {
  Case c = two_per_rank_case();
  c.bs = [](int r) { return int64_t(r == 2 ? 0 : 5 + 2 * r); };
  const int64_t I = 8, L = c.E / W();
  Rng g(4242);
  const float sh = 1 / std::sqrt(float(c.H)), si = 1 / std::sqrt(float(I));
  Tensor gu = uniform({c.E, c.H, 2 * I}, g, -sh, sh), dn = uniform({c.E, I, c.H}, g, -si, si);
  moe::MoeExperts all = moe::MoeExperts::from_fused(gu, dn, moe::WeightLayout::EHI);
  moe::MoeExperts local = moe::MoeExperts::from_fused(gu.view().narrow(0, me() * L, L), dn.view().narrow(0, me() * L, L), moe::WeightLayout::EHI);
  auto in = make_inputs(c, W(), 12);
  const Tensor want = single_process(c, in, all);
  Comm comm(c.E);
  const auto& mine = mine_of(in);
  for (bool dedup : {false, true})
    for (bool quant : {false, true}) {  // int8 rows go into the grouped GEMM as its int8 A operand
      FfnOptions f = ffn_options_for(c);
      f.dispatch.dedup_combine = dedup;
      f.dispatch.quant_int8 = quant;
      Tensor got = ep_moe_ffn(comm, mine[0], mine[1], mine[2], moe_experts(local), f);
      EXPECT_LE(norm_err(got, mine_rows(c, want)), quant ? 3e-2 : 1e-5) << "dedup=" << dedup << " quant=" << quant;
    }
}

// W8A8 experts behind the seam: the int8 dispatch's rows (quantised once per token on the sender
// with quantize_row_i8_dynamic) are the store's int8 activations as they arrive, so they give what
// the single-process W8A8 path gives when it quantises the same fp32 rows itself; float dispatch
// rows are quantised on the expert rank to the same codes. Only the combine's order differs.
TEST(EpMoeSeam, W8A8StoreTakesTheInt8DispatchRows) {
  Case c = two_per_rank_case();
  c.bs = [](int r) { return int64_t(r == 2 ? 0 : 5 + 2 * r); };
  const int64_t I = 8, L = c.E / W();
  Rng g(4343);
  const float sh = 1 / std::sqrt(float(c.H)), si = 1 / std::sqrt(float(I));
  Tensor gu = uniform({c.E, c.H, 2 * I}, g, -sh, sh), dn = uniform({c.E, I, c.H}, g, -si, si);
  const auto a8 = gemm::ActivationQuant::int8_per_token;
  QuantizedWeights qgu = quantize_weights(gu, WeightFormat::int8, 0, true), qdn = quantize_weights(dn, WeightFormat::int8, 0, true);
  auto slice = [&](const QuantizedWeights& q) {
    QuantWeightView v = q.view();
    v.data = v.data.narrow(0, me() * L, L);
    v.scale = v.scale.narrow(0, me() * L, L);
    return v;
  };
  moe::QuantMoeExperts all = moe::QuantMoeExperts::from_quantized(qgu.view(), qdn.view(), a8);
  moe::QuantMoeExperts local = moe::QuantMoeExperts::from_quantized(slice(qgu), slice(qdn), a8);
  auto in = make_inputs(c, W(), 13);
  const Tensor want = single_process(c, in, all);
  Comm comm(c.E);
  const auto& mine = mine_of(in);
  for (bool quant : {false, true}) {
    FfnOptions f = ffn_options_for(c);
    f.dispatch.quant_int8 = quant;
    Tensor got = ep_moe_ffn(comm, mine[0], mine[1], mine[2], moe_experts(local), f);
    EXPECT_LE(norm_err(got, mine_rows(c, want)), 1e-5) << "quant=" << quant;
  }
}
