// Token-level options: x_active_mask (inactive tokens or slots are not sent) and the zero, copy
// and const experts (spec 9.3, never sent), each equal to the matching single-process MoE.
#include "ep_test_util.h"

// x_active_mask: inactive tokens (1-D) or slots (2-D) are not sent; the answer equals the
// single-process MoE with their routing weights zeroed (inactive tokens: zero rows), bit for bit in
// fp32 with the per-slot combine, and no byte leaves a rank for an inactive slot.
TEST(EpMask, InactiveTokensAndSlots) {
  Case c = two_per_rank_case();
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 21);
  const auto& mine = mine_of(in);
  Comm comm(c.E);
  for (int dims : {1, 2}) {
    auto on = [&](int r, int64_t t, int64_t k) { return dims == 1 ? (t + r) % 3 != 0 : (t + k + r) % 4 != 0; };
    auto zeroed = in;
    std::vector<Tensor> masks;
    for (int r = 0; r < W(); ++r) {
      const int64_t BS = in[size_t(r)][0].size(0);
      Tensor m = dims == 1 ? Tensor::empty(DType::u8, {BS}) : Tensor::empty(DType::u8, {BS, c.K});
      Tensor w = Tensor::copy_of(in[size_t(r)][2]);
      for (int64_t t = 0; t < BS; ++t)
        for (int64_t k = 0; k < c.K; ++k) {
          if (dims == 2 || k == 0) m.ptr<uint8_t>()[dims == 1 ? t : t * c.K + k] = on(r, t, k);
          if (!on(r, t, k)) w.ptr<float>()[t * c.K + k] = 0.f;
        }
      zeroed[size_t(r)][2] = w;
      masks.push_back(m);
    }
    auto want = single_process(zeroed, ex, c.E, DType::f32);
    const int64_t active_here = rows_arriving(in, comm.placement(), [&](int r, int64_t t, int64_t k, int) { return on(r, t, k); });
    Tensor ones = full({mine[0].size(0), c.H}, 1.f);
    for (Dispatcher disp : kDispatchers)
      for (bool dedup : {false, true}) {
        DispatchOptions o = options_for(c);
        o.dispatcher = disp;
        o.dedup_combine = dedup;
        o.x_active_mask = mine_of(masks);
        SCOPED_TRACE(::testing::Message() << dims << "-D mask " << dispatcher_name(disp) << " dedup=" << dedup);
        DispatchResult d;
        Tensor got = run_blocking(comm, mine, ex, o, &d);
        if (disp == Dispatcher::all_to_all && !dedup) EXPECT_TRUE(bit_equal(got, mine_of(want))) << norm_err(got, mine_of(want));
        else EXPECT_LE(norm_err(got, mine_of(want)), 1e-6);
        EXPECT_EQ(d.expand_x.size(0), active_here);  // only active slots arrive
        if (dims == 1) {  // inactive tokens: zero rows, also with a shared expert output given
          CombineInputs ci;
          ci.shared_expert_x = ones;
          Tensor out = run_blocking(comm, mine, ex, o, nullptr, ci);
          for (int64_t t = 0; t < mine[0].size(0); ++t) {
            if (mine_of(masks).ptr<uint8_t>()[t]) continue;
            for (int64_t h = 0; h < c.H; ++h) EXPECT_EQ(out.ptr<float>()[t * c.H + h], 0.f);
          }
        }
      }
    // The pipelined form narrows the mask per chunk.
    FfnOptions f = ffn_options_for(c);
    f.dispatch.x_active_mask = mine_of(masks);
    f.chunks = 2;
    EXPECT_LE(norm_err(run_pipelined(comm, mine, ex, f), mine_of(want)), 1e-6);
  }
}

// Zero, copy and const experts (spec 9.3): ids past the routed ones, never sent, computed at
// combine on the token's own rank. Equals the single-process MoE with those experts' outputs, bit
// for bit in fp32 with the per-slot combine; also pipelined; a missing ori_x fails everywhere.
TEST(EpSpecial, ZeroCopyConstExperts) {
  Case c = two_per_rank_case();
  const int64_t Z = 1, C = 1, Q = 2;
  c.pool = [&](int, int64_t) {
    std::vector<int> p(static_cast<size_t>(c.E + Z + C + Q));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int(i);
    return p;
  };
  Rng g(5);
  Tensor a1 = uniform({Q}, g, -1, 1), a2 = uniform({Q}, g, -1, 1), v = uniform({Q, c.H}, g, -1, 1);
  Scenario s(c, 8, 51, [&](int64_t sp, float ox, int64_t h) -> float {
    if (sp < Z) return 0.f;
    if (sp < Z + C) return ox;
    const int64_t q = sp - Z - C;
    return a1.ptr<float>()[q] * ox + a2.ptr<float>()[q] * v.ptr<float>()[q * c.H + h];
  });
  Comm& comm = s.comm;
  const auto& mine = s.mine();
  DispatchOptions o = options_for(c);
  o.zero_expert_num = Z, o.copy_expert_num = C, o.const_expert_num = Q;
  CombineInputs ci;
  ci.ori_x = mine[0];
  ci.const_expert_alpha_1 = a1, ci.const_expert_alpha_2 = a2, ci.const_expert_v = v;
  // Only routed slots arrive.
  const int64_t routed_here = rows_arriving(s.in, comm.placement(), [&](int, int64_t, int64_t, int e) { return e < c.E; });
  for (Dispatcher disp : kDispatchers)
    for (bool dedup : {false, true}) {
      o.dispatcher = disp;
      o.dedup_combine = dedup;
      SCOPED_TRACE(::testing::Message() << dispatcher_name(disp) << " dedup=" << dedup);
      DispatchResult d;
      Tensor got = run_blocking(comm, mine, s.ex, o, &d, ci);
      EXPECT_EQ(d.expand_x.size(0), routed_here);
      if (disp == Dispatcher::all_to_all && !dedup) EXPECT_TRUE(bit_equal(got, s.mine_want())) << norm_err(got, s.mine_want());
      else EXPECT_LE(norm_err(got, s.mine_want()), 1e-6);
    }
  FfnOptions f;
  f.dispatch = o;
  f.chunks = 2;
  f.const_expert_alpha_1 = a1, f.const_expert_alpha_2 = a2, f.const_expert_v = v;
  EXPECT_LE(norm_err(run_pipelined(comm, mine, s.ex, f), s.mine_want()), 1e-6);
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y = Tensor::zeros(DType::f32, {d.expand_x.size(0), c.H});
  CombineInputs missing = ci;
  if (me() == W() - 1) missing.ori_x = TensorView();
  expect_all_throw("ori_x", [&] { moe_distribute_combine(comm, y, d, missing); });
}
