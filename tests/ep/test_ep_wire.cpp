// Receiver-side checks of the dispatch wire: a peer whose message is malformed (played by the test
// hook that rewrites a packed message before it leaves) is rejected by the rank that gets it, with
// an ot::Error naming "message" and the sender; the other ranks complete, and a good call works
// everywhere afterwards (nothing is left pending, no window slot stays held).
#include <string>

#include "ep_test_util.h"
#include "src/ep/internal.h"

namespace {

enum class Tamper { none, expert_range, expert_elsewhere, token_range, count_plus_one, count_negative, rows_beyond_batch };
Tamper g_mode = Tamper::none;
constexpr int kVictim = 0;

// Rank 0's experts are 0 and 1 (contiguous placement, two per rank): every token of every rank
// picks 0, 1 and 2, so each message to rank 0 carries every token with the slots [0, 1, -1].
void tamper(int dest, char* msg, size_t bytes, const RowFormat& fmt) {
  if (dest != kVictim) return;
  int64_t* rec = reinterpret_cast<int64_t*>(msg);
  const int64_t n_extra = rec[ot::ep::kRecHead - 1];
  int64_t* extra = rec + ot::ep::kRecHead;
  char* row = msg + ot::ep::record_bytes(size_t(n_extra));
  ASSERT_GE(bytes, ot::ep::record_bytes(size_t(n_extra)) + fmt.stride) << "the message carries no row";
  switch (g_mode) {
    case Tamper::none: break;
    case Tamper::expert_range: RowFormat::ids(row)[0] = 1 << 20; break;
    case Tamper::expert_elsewhere: RowFormat::ids(row)[0] = 2; break;  // rank 1's expert
    case Tamper::token_range: RowFormat::token(row) = 1 << 30; break;
    case Tamper::count_plus_one: extra[1] += 1; break;
    case Tamper::count_negative: extra[1] = -5; break;
    case Tamper::rows_beyond_batch: rec[2] = 1; break;  // meta BS: one token, yet several rows
  }
}

struct Expect {
  Tamper mode;
  const char* says;  // part of the error's `got`
};

}  // namespace

TEST(EpWire, MalformedMessageIsRejectedByItsReceiver) {
  if (W() < 2) GTEST_SKIP() << "needs a peer";
  Case c = two_per_rank_case();
  const int64_t BS = 4;
  c.bs = [=](int) { return BS; };
  CommOptions copt;
  copt.node_window = false;  // the rows travel in the message, where the hook can reach them
  Comm comm(MPI_COMM_WORLD, c.E, copt);
  auto in = make_inputs(c, W(), 5);
  const auto& m = mine_of(in);
  Tensor ids = Tensor::empty(DType::i32, {BS, c.K});
  for (int64_t t = 0; t < BS; ++t)
    for (int64_t k = 0; k < c.K; ++k) ids.ptr<int32_t>()[t * c.K + k] = int32_t(k);
  const DispatchOptions o = options_for(c);
  const int sender = W() - 1;
  const Expect cases[] = {{Tamper::expert_range, "expert 1048576"},
                          {Tamper::expert_elsewhere, "which is not on rank 0"},
                          {Tamper::token_range, "token 1073741824"},
                          {Tamper::count_plus_one, "its record says 5"},
                          {Tamper::count_negative, "-5 slots"},
                          {Tamper::rows_beyond_batch, "rows of a batch of 1"}};
  for (const Expect& x : cases) {
    g_mode = x.mode;
    if (me() == sender) ot::ep::dispatch_wire_tamper = tamper;
    bool threw = false;
    try {
      moe_distribute_dispatch(comm, m[0], ids, m[2], o);
    } catch (const Error& e) {
      threw = true;
      EXPECT_EQ(e.arg(), "message") << e.what();
      EXPECT_NE(e.got().find("rank " + std::to_string(sender)), std::string::npos) << e.what();
      EXPECT_NE(e.got().find(x.says), std::string::npos) << e.what();
    }
    ot::ep::dispatch_wire_tamper = nullptr;
    EXPECT_EQ(threw, me() == kVictim) << "mode " << int(x.mode);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // The same call, untouched, completes everywhere: rank 0 gets every token of every rank twice.
  DispatchResult d = moe_distribute_dispatch(comm, m[0], ids, m[2], o);
  if (me() == kVictim) {
    EXPECT_EQ(d.expand_x.size(0), 2 * BS * W());
  }
}
