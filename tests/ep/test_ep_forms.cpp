// The overlapping forms: split dispatch/combine (own rows computed before the remote rows arrive)
// and the pipelined ep_moe_ffn, both equal to the single-process MoE.
#include "ep_test_util.h"

namespace {

// Groups of `all` minus each expert's block of rows from this rank (`own`).
ExpertBatch remote_rows(const ExpertBatch& all, const std::vector<PendingDispatch::Block>& own) {
  ExpertBatch remote = all;
  remote.expert.clear(), remote.row_begin.clear(), remote.rows.clear();
  auto add = [&](int64_t e, int64_t begin, int64_t end) {
    if (end > begin) remote.expert.push_back(e), remote.row_begin.push_back(begin), remote.rows.push_back(end - begin);
  };
  for (size_t g = 0; g < all.expert.size(); ++g) {
    const auto& blk = own[size_t(all.expert[g])];
    add(all.expert[g], all.row_begin[g], blk.begin);
    add(all.expert[g], blk.begin + blk.count, all.row_begin[g] + all.rows[g]);
  }
  return remote;
}

}  // namespace

// Split form: own rows are computed before the remote rows arrive; same answer as blocking.
TEST(EpOverlap, SplitFormMatchesBlocking) {
  Case c = two_per_rank_case();
  Scenario s(c, 8, 5);
  Comm& comm = s.comm;
  ExpertFn fn = s.ex.local(comm.placement(), me());
  const auto& mine = s.mine();
  for (bool dedup : {false, true}) {
    DispatchOptions o = options_for(c);
    o.dedup_combine = dedup;
    PendingDispatch pd = moe_distribute_dispatch_start(comm, mine[0], mine[1], mine[2], o);
    DispatchResult& d = pd.result();
    Tensor y = Tensor::empty(DType::f32, {d.expand_x.size(0), c.H});
    ExpertBatch local;
    local.x = d.expand_x.view();
    local.y = y.view();
    local.progress = [&] { comm.progress(); };
    for (size_t l = 0; l < pd.local_blocks().size(); ++l)
      if (pd.local_blocks()[l].count > 0)
        local.expert.push_back(int64_t(l)), local.row_begin.push_back(pd.local_blocks()[l].begin), local.rows.push_back(pd.local_blocks()[l].count);
    fn(local);
    pd.wait();
    ExpertBatch remote = remote_rows(batch_of(d, y.view()), pd.local_blocks());
    remote.progress = local.progress;
    fn(remote);
    PendingCombine pc = moe_distribute_combine_start(comm, y, d);
    while (!pc.test()) comm.progress();
    Tensor got = pc.wait();
    EXPECT_LE(norm_err(got, s.mine_want()), dedup ? 1e-6 : 0.0) << "dedup=" << dedup;
  }
}

TEST(EpOverlap, PipelinedFfnMatchesSingleProcess) {
  Case c = two_per_rank_case();
  c.bs = [](int r) { return int64_t(r == 1 ? 0 : 6 + 3 * r); };
  Scenario s(c, 8, 6);
  const auto& mine = s.mine();
  Tensor shared = Tensor::empty(DType::f32, {mine[0].size(0), c.H});
  for (int64_t i = 0; i < shared.numel(); ++i) shared.ptr<float>()[i] = 0.25f * float(i % 7);
  Tensor expect = Tensor::copy_of(s.mine_want());
  for (int64_t i = 0; i < expect.numel(); ++i) expect.ptr<float>()[i] += shared.ptr<float>()[i];
  for (int chunks : {1, 2, 3})
    for (Dispatcher disp : kDispatchers) {
      FfnOptions f = ffn_options_for(c);
      f.dispatch.dispatcher = disp;
      f.dispatch.dedup_combine = false;
      f.chunks = chunks;
      SCOPED_TRACE(::testing::Message() << dispatcher_name(disp) << " chunks=" << chunks);
      EXPECT_LE(norm_err(run_pipelined(s.comm, mine, s.ex, f), s.mine_want()), disp == Dispatcher::all_to_all ? 0.0 : 1e-6);
      EXPECT_LE(norm_err(run_pipelined(s.comm, mine, s.ex, f, shared), expect), 1e-6);
    }
}
