// The node window (ranks of one node write rows straight into each other's shared-memory slots):
// same results as MPI messages, slots that are busy fall back to messages, the window grows with
// the batch, and a call that fails on one rank frees the slots its peers wrote.
#include <algorithm>
#include <cstdlib>
#include <thread>

#include "ep_test_util.h"
#include "ot/parallel.h"

namespace {

CommOptions window_on(bool on) {
  CommOptions o;
  o.threads = 0;  // leave the test's thread count alone
  o.node_window = on;
  return o;
}

// Combine without the per-rank pre-sum: one row back per (token, expert slot), so more rows use the window.
DispatchOptions per_slot_options(const Case& c) {
  DispatchOptions o = options_for(c);
  o.dedup_combine = false;
  return o;
}

// per_slot_options for s, after one call with them has grown s's window.
DispatchOptions warmed_window(Scenario& s) {
  const DispatchOptions o = per_slot_options(s.c);
  run_blocking(s.comm, s.mine(), s.ex, o);
  return o;
}

// Whether a token of rank `from` routes to rank `to`.
bool routes(const Inputs& in, const Placement& p, int from, int to) {
  const Tensor& ids = in[size_t(from)][1];
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (p.destination(from, i / ids.size(1), ids.ptr<int32_t>()[i]) == to) return true;
  return false;
}
// Window slots a blocking combine of `in` claims on this rank when every slot is free (every rank
// is on this node under CTest): rows back to each peer that routes to us.
int64_t combine_claims(const Inputs& in, const Placement& p) {
  int64_t n = 0;
  for (int q = 0; q < W(); ++q)
    if (q != me()) n += routes(in, p, q, me());
  return n;
}
// The same for dispatch + combine: dispatch rows to each peer we route to, too.
int64_t claims_per_pair(const Inputs& in, const Placement& p) {
  int64_t n = combine_claims(in, p);
  for (int q = 0; q < W(); ++q)
    if (q != me()) n += routes(in, p, me(), q);
  return n;
}

}  // namespace

// Window and messages give bit-identical results (fp32, per-slot combine: also equal to the
// single-process MoE), while the batch grows (a larger window) and shrinks again.
TEST(EpWindow, SameAsMessagesAsTheBatchGrows) {
  Comm on(MPI_COMM_WORLD, two_per_rank(), window_on(true)), off(MPI_COMM_WORLD, two_per_rank(), window_on(false));
  EXPECT_FALSE(off.node_window());
  EXPECT_EQ(on.node_window(), W() > 1 && !std::getenv("OT_EP_NODE_WINDOW"));
  int64_t sends = 0;
  for (int64_t bs : {3, 12, 40, 5}) {
    Case c = two_per_rank_case();
    c.bs = [bs](int r) { return bs + r; };
    Experts ex(c.E, c.H, 8);
    auto in = make_inputs(c, W(), 11 + uint64_t(bs));
    auto want = single_process(in, ex, c.E, DType::f32);
    for (bool dedup : {false, true}) {
      DispatchOptions o = options_for(c);
      o.dedup_combine = dedup;
      DispatchResult dw, dm;
      Tensor got_w = run_blocking(on, mine_of(in), ex, o, &dw);
      Tensor got_m = run_blocking(off, mine_of(in), ex, o, &dm);
      EXPECT_TRUE(bit_equal(dw.expand_x, dm.expand_x)) << "bs=" << bs;
      EXPECT_TRUE(bit_equal(dw.assist_info_for_combine, dm.assist_info_for_combine)) << "bs=" << bs;
      EXPECT_EQ(dw.bytes_sent, dm.bytes_sent) << "the same bytes cross between ranks either way";
      EXPECT_TRUE(bit_equal(got_w, got_m)) << "bs=" << bs << " dedup=" << dedup;
      if (!dedup) {
        EXPECT_TRUE(bit_equal(got_w, mine_of(want))) << "bs=" << bs;
      }
      EXPECT_LE(norm_err(got_w, mine_of(want)), 1e-6);
    }
    if (on.node_window() && bs == 40) {
      // The window grew after the first bs=40 dispatch; the second pair used it both ways.
      EXPECT_GE(on.window_sends() - sends, claims_per_pair(in, on.placement()));
    }
    sends = on.window_sends();
  }
  EXPECT_EQ(off.window_sends(), 0);
}

// Combines in flight together: the second finds its slots still holding the first's unread rows
// and sends its rows in the messages instead; both are right.
TEST(EpWindow, BusySlotsFallBackToMessages) {
  Scenario s(two_per_rank_case(), 8, 21, {}, window_on(true));
  auto& [c, ex, in, want, comm] = s;
  const DispatchOptions o = warmed_window(s);
  const auto& mine = s.mine();
  DispatchResult d1 = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  DispatchResult d2 = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y1 = Tensor::empty(DType::f32, {d1.expand_x.size(0), c.H}), y2 = Tensor::empty(DType::f32, {d2.expand_x.size(0), c.H});
  ex.local(comm.placement(), me())(batch_of(d1, y1));
  ex.local(comm.placement(), me())(batch_of(d2, y2));
  const int64_t before = comm.window_sends();
  PendingCombine c1 = moe_distribute_combine_start(comm, y1, d1);
  PendingCombine c2 = moe_distribute_combine_start(comm, y2, d2);
  const int64_t used = comm.window_sends() - before;
  Tensor o2 = c2.wait(), o1 = c1.wait();
  EXPECT_TRUE(bit_equal(o1, mine_of(want)));
  EXPECT_TRUE(bit_equal(o2, mine_of(want)));
  if (comm.node_window()) {
    EXPECT_EQ(used, combine_claims(in, comm.placement())) << "only the first combine's rows find free slots";
  }
  EXPECT_TRUE(bit_equal(run_blocking(comm, mine, ex, o), mine_of(want)));  // and the slots are free again
}

// A bad argument on one rank after its peers wrote rows into its slots: every rank throws, the
// slots are freed, and the next call goes through the window again.
TEST(EpWindow, FailedCallFreesSlots) {
  Scenario s(two_per_rank_case(), 8, 31, {}, window_on(true));
  auto& [c, ex, in, want, comm] = s;
  const DispatchOptions o = warmed_window(s);
  const auto& mine = s.mine();
  DispatchOptions bad = o;
  bad.expert_token_nums_type = me() == W() - 1 ? 7 : 1;
  expect_all_throw("expert_token_nums_type", [&] { moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], bad); });
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y = Tensor::empty(DType::f32, {d.expand_x.size(0), c.H});
  ex.local(comm.placement(), me())(batch_of(d, y));
  Tensor bad_y = Tensor::empty(DType::f32, {me() == W() - 1 ? 1 : d.expand_x.size(0), c.H});
  expect_all_throw("expert_out", [&] { moe_distribute_combine(comm, me() == W() - 1 ? bad_y : y, d); });
  const int64_t before = comm.window_sends();
  EXPECT_TRUE(bit_equal(run_blocking(comm, mine, ex, o), mine_of(want)));
  if (comm.node_window()) {
    EXPECT_EQ(comm.window_sends() - before, claims_per_pair(in, comm.placement())) << "dispatch and combine both used the window";
  }
}

// The Comm shares the node's cores: W ranks on this machine get its cores divided among them (at
// least 1 each); an explicit count is set as given.
TEST(EpWindow, ThreadsShareTheNode) {
  Comm comm(MPI_COMM_WORLD, two_per_rank(), window_on(true));
  EXPECT_EQ(comm.node_size(), W());  // CTest runs every rank on this machine
  EXPECT_GE(comm.threads_per_rank(), 1);
  EXPECT_LE(comm.threads_per_rank() * W(), std::max(W(), int(std::thread::hardware_concurrency())));
  const int before = ot::num_threads();
  CommOptions three;
  three.threads = 3;
  Comm c3(MPI_COMM_WORLD, two_per_rank(), three);
  EXPECT_EQ(ot::num_threads(), 3);
  ot::set_num_threads(before);
}

// A receive layout past kStreamBytes (16 MB here) is written with non-temporal stores: same rows,
// through the messages (first call) and the window (second call).
TEST(EpWindow, LargeLayoutStreamsTheSameRows) {
  Case c = two_per_rank_case();
  c.K = 4;
  c.H = 4096;  // 16 KB fp32 rows, BS x K = 1280 of them arrive per rank on average (20 MB)
  c.bs = [](int) { return int64_t(320); };
  auto in = make_inputs(c, W(), 41);
  Comm comm(MPI_COMM_WORLD, c.E, window_on(true));
  ref::RankExpand r = ref::dispatch(views(in), comm.placement(), me(), false);
  const auto& mine = mine_of(in);
  for (int call = 0; call < 2; ++call) {
    DispatchOptions o = options_for(c);
    DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
    EXPECT_TRUE(bit_equal(d.expand_x, r.expand_x)) << "call " << call;
    EXPECT_EQ(assist_of(d), r.assist);
  }
}
