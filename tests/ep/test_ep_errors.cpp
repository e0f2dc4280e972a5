// Error agreement: a bad argument on ONE rank makes every rank throw an ot::Error naming it, and
// afterwards a good call still works (nobody is left inside a collective).
#include "ep_test_util.h"

#include <stdexcept>

TEST(EpErrors, BadArgumentOnOneRankFailsEverywhere) {
  Case c = two_per_rank_case();
  c.bs = [](int) { return int64_t(4); };  // every rank has tokens, so the bad rank can hold a bad id
  Comm comm(c.E);
  const int bad = W() - 1;
  DispatchOptions o = options_for(c);
  auto in = make_inputs(c, W(), 11);
  const auto& m = mine_of(in);
  auto dispatch_fails = [&](const char* arg, const DispatchOptions& ob, const TensorView& ids, const TensorView& w) {
    expect_all_throw(arg, [&] { moe_distribute_dispatch(comm, m[0], ids, w, ob); });
  };
  {
    Tensor ids = Tensor::copy_of(m[1]);
    if (me() == bad) ids.ptr<int32_t>()[1] = int32_t(c.E + 3);
    dispatch_fails("expert_ids", o, ids, m[2]);
  }
  if (W() > 1) {  // K mismatch across ranks
    Tensor ids = m[1], w = m[2];
    if (me() == bad) {
      ids = Tensor::empty(DType::i32, {4, c.K - 1});
      w = full({4, c.K - 1}, 1.f);
      for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = int32_t(i % (c.K - 1));
    }
    dispatch_fails("expert_ids", o, ids, w);
  }
  {  // world size not matching the communicator
    DispatchOptions ob = o;
    if (me() == bad) ob.ep_world_size = W() + 1;
    dispatch_fails("ep_world_size", ob, m[1], m[2]);
  }
  if (W() > 1) {  // moe_expert_num not divisible by the world size (on one rank)
    DispatchOptions ob = o;
    if (me() == bad) ob.moe_expert_num = c.E + 1;
    dispatch_fails("moe_expert_num", ob, m[1], m[2]);
  }
  {  // a mask of the wrong shape on one rank
    DispatchOptions ob = o;
    Tensor mask = Tensor::zeros(DType::u8, {me() == bad ? 3 : 4});
    ob.x_active_mask = mask;
    dispatch_fails("x_active_mask", ob, m[1], m[2]);
  }
  {  // combine: wrong expert_out shape on one rank
    DispatchResult d = moe_distribute_dispatch(comm, m[0], m[1], m[2], o);
    Tensor y = Tensor::empty(DType::f32, {d.expand_x.size(0) + (me() == bad ? 1 : 0), c.H});
    expect_all_throw("expert_out", [&] { moe_distribute_combine(comm, y, d); });
  }
  {  // the local expert computation throws on one rank inside the pipeline
    FfnOptions f;
    f.dispatch = o;
    f.chunks = 2;
    Experts ex(c.E, c.H, 8);
    ExpertFn good = ex.local(comm.placement(), me());
    ExpertFn fn = [&](const ExpertBatch& b) {
      if (me() == bad) throw std::runtime_error("boom");
      good(b);
    };
    expect_all_throw("experts", [&] { ep_moe_ffn(comm, m[0], m[1], m[2], fn, f); });
  }
  if (W() > 1) {  // the blocking form on one rank, the split form on the others
    expect_all_throw("call", [&] {
      if (me() == bad) moe_distribute_dispatch(comm, m[0], m[1], m[2], o);
      else moe_distribute_dispatch_start(comm, m[0], m[1], m[2], o).wait();
    });
  }
  // Nobody is left hanging: a good call completes everywhere.
  DispatchResult d = moe_distribute_dispatch(comm, m[0], m[1], m[2], o);
  EXPECT_EQ(d.expert_token_nums.numel(), comm.num_local_experts());
}
