// Dispatch itself: the expand_x layout against the plain reference, bytes on the wire, and the
// Comm's reuse of output storage.
#include "ep_test_util.h"

#include <algorithm>

TEST(EpDispatch, LayoutMatchesReference) {
  Case c = two_per_rank_case();
  Comm comm(c.E);
  for (DType dt : {DType::f32, DType::bf16}) {
    c.dtype = dt;
    auto in = make_inputs(c, W(), 1);
    const auto& mine = mine_of(in);
    for (bool quant : {false, true}) {
      ref::RankExpand r = ref::dispatch(views(in), comm.placement(), me(), quant);
      for (Dispatcher disp : kDispatchers)
        for (int type : {0, 1}) {
          DispatchOptions o = options_for(c);
          o.dispatcher = disp;
          o.quant_int8 = quant;
          o.expert_token_nums_type = type;
          DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << dispatcher_name(disp) << " quant=" << quant << " type=" << type);
          EXPECT_TRUE(bit_equal(d.expand_x, r.expand_x));
          if (quant) {
            EXPECT_TRUE(bit_equal(d.dynamic_scales, r.dynamic_scales));
          }
          EXPECT_EQ(assist_of(d), r.assist);
          int64_t run = 0;
          for (size_t l = 0; l < r.tokens_per_expert.size(); ++l) {
            run += r.tokens_per_expert[l];
            EXPECT_EQ(d.expert_token_nums.ptr<int64_t>()[l], type == 0 ? run : r.tokens_per_expert[l]);
            EXPECT_EQ(d.ep_recv_counts.ptr<int32_t>()[int64_t(l) * W() + W() - 1], run);
          }
        }
      }
  }
}

// A token with several experts on one rank crosses the wire once; bytes_sent says so (rows with
// their headers, plus one record per peer: dispatch's carries the row count, a slot count per local
// expert and the node-window slot; combine's none).
TEST(EpDispatch, DedupByteCounts) {
  Case c = bf16_four_per_rank_case(40);
  c.bs = [](int r) { return int64_t(9 + r); };
  auto in = make_inputs(c, W(), 4);
  Comm comm(c.E);
  const Placement& p = comm.placement();
  // Wire row: an (8 + 8 K)-byte header then the payload, each padded to 16 bytes.
  auto stride = [&](int64_t payload) { return ((((8 + 8 * c.K + 15) / 16) * 16 + payload + 15) / 16) * 16; };
  int64_t rows_out = 0, slots_out = 0, rows_in = 0;
  for (int r = 0; r < W(); ++r)
    for (int64_t t = 0; t < c.bs(r); ++t) {
      std::vector<int> dests;
      for (int64_t k = 0; k < c.K; ++k) {
        int q = p.destination(r, t, in[size_t(r)][1].ptr<int32_t>()[t * c.K + k]);
        if (r == me() && q != me()) ++slots_out;
        if (std::find(dests.begin(), dests.end(), q) == dests.end()) dests.push_back(q);
      }
      for (int q : dests) {
        if (r == me() && q != me()) ++rows_out;
        if (q == me() && r != me()) ++rows_in;
      }
    }
  DispatchOptions o = options_for(c);
  const auto& mine = mine_of(in);
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  const int64_t peers = W() - 1, recs = peers * record_bytes(2 + c.E / W());
  EXPECT_EQ(d.bytes_sent, rows_out * stride(c.H * 2) + recs);
  if (W() > 1) {
    EXPECT_LT(rows_out, slots_out + 1);
  }
  Tensor y = Tensor::copy_of(d.expand_x);
  PendingCombine pc = moe_distribute_combine_start(comm, y, d);
  EXPECT_EQ(pc.bytes_sent(), rows_in * c.H * 2 + peers * record_bytes(0));  // one partial row per received token
  pc.wait();
  o.quant_int8 = true;
  EXPECT_EQ(moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o).bytes_sent, rows_out * stride(c.H) + recs);
}

// The Comm reuses output storage (expand_x, x_out) once the caller has dropped earlier results, and
// never while the caller still holds them.
TEST(EpComm, ReusesOutputStorageOnlyWhenDropped) {
  Case c = two_per_rank_case();
  c.bs = [](int) { return int64_t(6); };
  auto in = make_inputs(c, W(), 31);
  const auto& mine = mine_of(in);
  Comm comm(c.E);
  DispatchOptions o = options_for(c);
  DispatchResult a = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor keep = Tensor::copy_of(a.expand_x);
  DispatchResult b = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);  // a still held
  if (a.expand_x.numel() > 0) {
    EXPECT_NE(a.expand_x.view().data, b.expand_x.view().data);
    EXPECT_TRUE(bit_equal(a.expand_x, keep));
  }
  void* where = b.expand_x.view().data;
  b = DispatchResult();  // dropped: its storage comes back
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  if (d.expand_x.numel() > 0) {
    EXPECT_EQ(d.expand_x.view().data, where);
  }
  EXPECT_TRUE(bit_equal(d.expand_x, keep));
  Tensor y = Tensor::copy_of(d.expand_x);
  Tensor out1 = moe_distribute_combine(comm, y, d);
  Tensor out2 = moe_distribute_combine(comm, y, d);  // out1 held: separate storage, same values
  EXPECT_NE(out1.view().data, out2.view().data);
  EXPECT_TRUE(bit_equal(out1, out2));
}
