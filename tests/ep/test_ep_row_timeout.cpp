// Bounded row collectives: in the split all_to_all and the all_gather forms the rows travel in an
// MPI collective that every rank posts after the record exchange. A rank that rejects a malformed
// record (played by the wire hook: a negative slot count in the record one peer sends it) throws
// "message" and never enters the collective; every other rank then waits in it and must throw
// "peer" within CommOptions::timeout_s, and its Comm must refuse the next call ("comm").
// The abandoned collective stays pending for the rest of the process (creating another Comm after
// it corrupts Open MPI's next context-id agreement), so each form runs as a CTest of its own
// (ep_row_timeout_<form>_np*, OT_EP_TEST_ROW_TIMEOUT=all_to_all | all_gather) and skips elsewhere.
#include <chrono>
#include <cstdlib>
#include <string>

#include "ep_test_util.h"
#include "src/ep/internal.h"

namespace {

constexpr int kVictim = 0;

void negative_count(int dest, char* msg, size_t, const RowFormat&) {
  if (dest != kVictim) return;
  int64_t* rec = reinterpret_cast<int64_t*>(msg);
  rec[ot::ep::kRecHead + 1] = -5;  // the slots for the victim's local expert 0
}

}  // namespace

TEST(EpRowTimeout, ARankThatNeverEntersTheRowCollectiveMakesTheOthersFail) {
  const char* env = std::getenv("OT_EP_TEST_ROW_TIMEOUT");
  if (!env) GTEST_SKIP() << "run by the ep_row_timeout CTests (leaves a collective pending)";
  if (W() < 2) GTEST_SKIP() << "needs a peer";
  const std::string what = env;
  ASSERT_TRUE(what == "all_to_all" || what == "all_gather") << what;
  Case c = two_per_rank_case();
  c.bs = [](int) { return int64_t(4); };
  auto in = make_inputs(c, W(), 11);
  const auto& m = mine_of(in);
  const int sender = W() - 1;
  CommOptions copt;
  copt.node_window = false;
  copt.timeout_s = 1.0;
  Comm comm(MPI_COMM_WORLD, c.E, copt);
  DispatchOptions o = options_for(c);
  o.dispatcher = what == "all_to_all" ? Dispatcher::all_to_all : Dispatcher::all_gather;
  if (me() == sender) ot::ep::dispatch_wire_tamper = negative_count;
  const auto t0 = std::chrono::steady_clock::now();
  std::string arg;
  try {
    PendingDispatch pd = moe_distribute_dispatch_start(comm, m[0], m[1], m[2], o);
    pd.wait();
  } catch (const Error& e) {
    arg = e.arg();
    if (me() == kVictim) {
      EXPECT_NE(e.got().find("rank " + std::to_string(sender)), std::string::npos) << e.what();
    }
  }
  ot::ep::dispatch_wire_tamper = nullptr;
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (me() == kVictim) {
    EXPECT_EQ(arg, "message");
  } else {
    EXPECT_EQ(arg, "peer");
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 30.0);
    std::string next;
    try {
      moe_distribute_dispatch(comm, m[0], m[1], m[2], options_for(c));
    } catch (const Error& e) {
      next = e.arg();
    }
    EXPECT_EQ(next, "comm");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
