// A rank that dies inside a dispatch (its messages packed, not yet sent). Run by the ep_rank_exit
// CTest only, which sets OT_EP_TEST_EXIT_RANK and passes when mpirun ends the whole job within the
// test's timeout and names the rank that exited; the peers are waiting for that rank's messages
// when it goes. Skipped in the other suites.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "ep_test_util.h"
#include "src/ep/internal.h"

TEST(EpFault, RankExitsInsideDispatch) {
  const char* env = std::getenv("OT_EP_TEST_EXIT_RANK");
  if (!env || W() < 2) GTEST_SKIP() << "run by the ep_rank_exit test (OT_EP_TEST_EXIT_RANK, 2+ ranks)";
  const int victim = std::atoi(env);
  Case c = two_per_rank_case();
  CommOptions copt;
  copt.node_window = false;  // the one-round message form, where the hook runs
  Comm comm(MPI_COMM_WORLD, c.E, copt);
  auto in = make_inputs(c, W(), 3);
  const auto& m = mine_of(in);
  if (me() == victim)
    ot::ep::dispatch_wire_tamper = [](int, char*, size_t, const RowFormat&) {
      std::fflush(nullptr);
      _exit(7);
    };
  moe_distribute_dispatch(comm, m[0], m[1], m[2], options_for(c));
  ADD_FAILURE() << "rank " << me() << " finished a dispatch whose peer rank " << victim << " exited inside it";
}
