// Placements: contiguous, redundant copies (a hot expert's tokens split between its copies) and
// shared-expert ranks, each equal to the single-process MoE.
#include "ep_test_util.h"

TEST(EpPlacement, ContiguousCopiesAndRebalance) {
  Placement p = Placement::contiguous(8, 4);
  EXPECT_EQ(p.local_experts(1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(p.destination(0, 5, 7), 3);
  Placement c = Placement::from_copies(4, 2, {{0, 1}, {0}, {1}, {1}});
  EXPECT_EQ(c.local_experts(1), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(c.destination(1, 3, 0), 1);  // own copy
  EXPECT_NE(c.hash(), Placement::contiguous(4, 2).hash());
  Placement rb = Placement::rebalanced(8, 4, {100, 1, 1, 1, 1, 1, 1, 1}, 1);
  EXPECT_GE(rb.copies(0).size(), 2u);
  EXPECT_THROW(Placement::from_copies(2, 2, {{0}, {}}), Error);
  EXPECT_THROW(Placement::from_copies(2, 2, {{0}, {2}}), Error);
  EXPECT_THROW(Placement::contiguous(6, 4), Error);
}

// A hot expert copied on every rank: its tokens are split between copies; results unchanged.
TEST(EpPlacement, RedundantCopiesSplitTokens) {
  Case c = two_per_rank_case();
  c.K = 2;
  c.bs = [](int r) { return int64_t(10 + r); };
  c.pool = [](int, int64_t t) { return std::vector<int>{0, int(1 + t % 3)}; };
  Scenario s(c, 8, 8);
  std::vector<std::vector<int>> copies;
  for (int64_t e = 0; e < c.E; ++e) copies.push_back({int(e / (c.E / W()))});
  for (int q = 1; q < W(); ++q) copies[0].push_back(q);
  s.comm.set_placement(Placement::from_copies(c.E, W(), copies));
  DispatchOptions o = options_for(c);
  DispatchResult d;
  Tensor got = run_blocking(s.comm, s.mine(), s.ex, o, &d);
  EXPECT_LE(norm_err(got, s.mine_want()), 1e-6);
  int64_t hot = d.expert_token_nums.ptr<int64_t>()[s.comm.placement().local_index(me(), 0)];
  EXPECT_GT(hot, 0);  // every copy receives part of expert 0's tokens
}

// Shared-expert ranks (spec 9): ranks [0, S) hold the shared expert, every token also goes to one of
// them and comes back unweighted. Equals the single-process MoE whose tokens carry one more slot
// (the shared expert, weight 1): bit for bit in fp32 with the per-slot combine.
TEST(EpSharedRanks, SharedExpertOnItsOwnRanks) {
  if (W() < 2) GTEST_SKIP() << "needs a MoE rank besides the shared one";
  for (int S = 1; S < W(); S += 2) {
    Case c;
    c.E = 3 * (W() - S);  // a multiple of W - S, for W = 2 and 4 not of W (spec 9.1 asks no more)
    Experts ex(c.E + 1, c.H, 8);  // expert E: the shared expert
    auto in = make_inputs(c, W(), 41);
    auto ext = in;
    for (int r = 0; r < W(); ++r) {
      const int64_t BS = in[size_t(r)][0].size(0);
      Tensor ids = Tensor::empty(DType::i32, {BS, c.K + 1}), w = Tensor::empty(DType::f32, {BS, c.K + 1});
      for (int64_t t = 0; t < BS; ++t) {
        for (int64_t k = 0; k < c.K; ++k) {
          ids.ptr<int32_t>()[t * (c.K + 1) + k] = in[size_t(r)][1].ptr<int32_t>()[t * c.K + k];
          w.ptr<float>()[t * (c.K + 1) + k] = in[size_t(r)][2].ptr<float>()[t * c.K + k];
        }
        ids.ptr<int32_t>()[t * (c.K + 1) + c.K] = int32_t(c.E);
        w.ptr<float>()[t * (c.K + 1) + c.K] = 1.f;
      }
      ext[size_t(r)][1] = ids, ext[size_t(r)][2] = w;
    }
    auto want = single_process(ext, ex, c.E + 1, DType::f32);
    CommOptions shared;
    shared.shared_expert_ranks = S;
    Comm comm(MPI_COMM_WORLD, c.E, shared);
    EXPECT_EQ(comm.placement().hash(), Placement::shared_ranks(c.E, W(), S).hash());
    if (c.E % W()) {  // contiguous shards need a multiple of W
      EXPECT_THROW({ Comm contiguous(MPI_COMM_WORLD, c.E); }, Error);
    }
    const auto& mine = mine_of(in);
    DispatchOptions o = options_for(c);
    o.shared_expert_rank_num = S;
    o.dedup_combine = false;
    SCOPED_TRACE(::testing::Message() << "S=" << S);
    DispatchResult d;
    Tensor got = run_blocking(comm, mine, ex, o, &d);
    EXPECT_TRUE(bit_equal(got, mine_of(want))) << norm_err(got, mine_of(want));
    if (me() < S) {  // a shared rank: one local expert, a row for every token routed to it
      int64_t rows = 0;
      for (int r = 0; r < W(); ++r)
        for (int64_t t = 0; t < in[size_t(r)][0].size(0); ++t) rows += comm.placement().destination(r, t, c.E) == me();
      EXPECT_EQ(d.expert_token_nums.numel(), 1);
      EXPECT_EQ(d.expand_x.size(0), rows);
    }
    o.dedup_combine = true;
    EXPECT_LE(norm_err(run_blocking(comm, mine, ex, o), mine_of(want)), 1e-6);
    FfnOptions f;
    f.dispatch = o;
    f.chunks = 2;
    EXPECT_LE(norm_err(run_pipelined(comm, mine, ex, f), mine_of(want)), 1e-6);
    // Without the matching placement (the routed experts round-robin, no shared one): every rank
    // fails, naming the option.
    Comm plain(MPI_COMM_WORLD, c.E, shared);
    std::vector<std::vector<int>> round_robin;
    for (int64_t e = 0; e < c.E; ++e) round_robin.push_back({int(e % W())});
    plain.set_placement(Placement::from_copies(c.E, W(), round_robin));
    expect_all_throw("moe_expert_num", [&] { moe_distribute_dispatch(plain, mine[0], mine[1], mine[2], o); });
  }
}
