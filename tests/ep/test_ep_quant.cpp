// int8 options: dynamic per-row int8 dispatch rows, int8 combine rows (comm_quant_mode 2) and
// smooth-quant per-expert scales (spec 9.2).
#include "ep_test_util.h"

TEST(EpQuant, Int8RowsWithinTolerance) {
  Case c = two_per_rank_case();
  c.dtype = DType::bf16;
  c.H = 32;
  Scenario s(c, 16, 7);
  FfnOptions f = ffn_options_for(c);
  f.dispatch.quant_int8 = true;
  EXPECT_LE(norm_err(run_pipelined(s.comm, s.mine(), s.ex, f), s.mine_want()), 3e-2);
}

// comm_quant_mode 2: combine rows travel as int8 with a per-row scale (dedup and per-slot forms);
// within int8 tolerance of the single-process answer, fewer combine bytes.
TEST(EpQuant, CombineInt8RowsWithinTolerance) {
  Case c = two_per_rank_case();
  c.dtype = DType::bf16;
  c.H = 64;
  Scenario s(c, 16, 9);
  Comm& comm = s.comm;
  const auto& mine = s.mine();
  for (bool dedup : {true, false}) {
    DispatchOptions o = options_for(c);
    o.dedup_combine = dedup;
    int64_t bytes[2] = {0, 0};
    for (int q : {0, 2}) {
      o.comm_quant_mode = q;
      DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
      Tensor y = Tensor::empty(DType::bf16, {d.expand_x.size(0), c.H});
      s.ex.local(comm.placement(), me())(batch_of(d, y));
      PendingCombine pc = moe_distribute_combine_start(comm, y, d);
      Tensor got = pc.wait();
      bytes[q / 2] = pc.bytes_sent() - (W() - 1) * record_bytes(0);  // the rows alone
      EXPECT_LE(norm_err(got, s.mine_want()), q ? 3e-2 : 1.5e-2) << "dedup=" << dedup << " comm_quant_mode=" << q;
    }
    if (bytes[0] > 0) {
      EXPECT_LT(bytes[1], bytes[0] * 2 / 3) << "int8 rows: about half of bf16";
    }
  }
  DispatchOptions bad = options_for(c);
  bad.comm_quant_mode = me() == W() - 1 ? 1 : 0;
  expect_all_throw("comm_quant_mode", [&] { moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], bad); });
}

// Smooth-quant scales (spec 9.2): each expand_x row is int8(x * scales[e + shared_expert_num]) with
// its own dynamic scale, i.e. quantised per (token, expert); equal to the plain reference bit for
// bit in every form. Given without quant_int8 on one rank: every rank fails.
TEST(EpQuant, SmoothScalesPerTokenAndExpert) {
  Case c = two_per_rank_case();
  c.dtype = DType::bf16;
  c.H = 32;
  auto in = make_inputs(c, W(), 13);
  const auto& mine = mine_of(in);
  Comm comm(c.E);
  for (int shared_num : {0, 1}) {
    Rng g(99);
    Tensor smooth = uniform({c.E + shared_num, c.H}, g, 0.25f, 2.25f);
    ref::RankExpand r = ref::dispatch(views(in), comm.placement(), me(), true, smooth, shared_num);
    for (Dispatcher disp : kDispatchers)
      for (bool split : {false, true}) {
        DispatchOptions o = options_for(c);
        o.dispatcher = disp;
        o.quant_int8 = true;
        o.smooth_scales = smooth;
        o.shared_expert_num = shared_num;
        SCOPED_TRACE(::testing::Message() << dispatcher_name(disp) << " split=" << split << " shared_expert_num=" << shared_num);
        DispatchResult d = split ? moe_distribute_dispatch_start(comm, mine[0], mine[1], mine[2], o).wait()
                                 : moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
        EXPECT_TRUE(bit_equal(d.expand_x, r.expand_x));
        EXPECT_TRUE(bit_equal(d.dynamic_scales, r.dynamic_scales));
        EXPECT_EQ(assist_of(d), r.assist);
      }
  }
  DispatchOptions bad = options_for(c);
  Tensor smooth = full({c.E, c.H}, 1.f);
  if (me() == W() - 1) bad.smooth_scales = smooth;  // without quant_int8
  expect_all_throw("smooth_scales", [&] { moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], bad); });
}
