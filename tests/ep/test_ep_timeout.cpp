// Bounded waits: a peer that does not take part in an exchange makes every other rank throw an
// ot::Error naming it within CommOptions::timeout_s, and the Comm then refuses every call at once
// (naming "comm") instead of waiting again.
#include <chrono>
#include <string>

#include "ep_test_util.h"

TEST(EpTimeout, AbsentPeerMakesTheOthersFailNamingIt) {
  if (W() < 2) GTEST_SKIP() << "needs a peer";
  Case c = two_per_rank_case();
  c.bs = [](int) { return int64_t(4); };
  CommOptions copt;
  copt.node_window = false;
  copt.timeout_s = 1.0;
  Comm comm(MPI_COMM_WORLD, c.E, copt);
  auto in = make_inputs(c, W(), 9);
  const auto& m = mine_of(in);
  const DispatchOptions o = options_for(c);
  const int absent = W() - 1;
  if (me() != absent) {
    const auto t0 = std::chrono::steady_clock::now();
    bool threw = false;
    try {
      moe_distribute_dispatch(comm, m[0], m[1], m[2], o);
    } catch (const Error& e) {
      threw = true;
      EXPECT_EQ(e.arg(), "peer") << e.what();
      EXPECT_NE(e.got().find("rank " + std::to_string(absent)), std::string::npos) << e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(threw);
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 30.0);
    bool refused = false;
    try {
      moe_distribute_dispatch(comm, m[0], m[1], m[2], o);
    } catch (const Error& e) {
      refused = true;
      EXPECT_EQ(e.arg(), "comm") << e.what();
    }
    EXPECT_TRUE(refused);
  }
  // The absent rank comes only now: its peers' messages are waiting for it, so its call completes.
  MPI_Barrier(MPI_COMM_WORLD);
  if (me() == absent) {
    EXPECT_NO_THROW(moe_distribute_dispatch(comm, m[0], m[1], m[2], o));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
