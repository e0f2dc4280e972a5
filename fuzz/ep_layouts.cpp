// Expert-parallel dispatch and combine on one rank (MPI singleton): x dtype, shapes, expert ids
// (masked -1, out of range), scales, dispatcher (all-to-all / all-gather), int8 quantisation and
// the count form of expert_token_nums from the input. A call either throws an ot::Error naming an
// argument, or its rows, counts, scales and combined output equal ot::ep::ref's, and no input or
// guard is touched. (Messages between ranks are checked by tests/ep/test_ep_wire.cpp under mpirun.)
#include <mpi.h>

#include <map>

#include "fuzz/fuzz_util.h"
#include "ot/ep.h"

using namespace ot;
using namespace ot::ep;

namespace {
Comm& comm_for(int64_t E) {  // one per expert count, kept for the process (collective to create)
  static const bool init = [] {
    int on = 0;
    MPI_Initialized(&on);
    if (!on) MPI_Init(nullptr, nullptr);
    return true;
  }();
  (void)init;
  static auto* comms = new std::map<int64_t, Comm*>;
  Comm*& c = (*comms)[E];
  if (!c) {
    CommOptions o;
    o.threads = 0;  // the target picks the thread count
    c = new Comm(MPI_COMM_WORLD, E, o);
  }
  return *c;
}
}  // namespace

OT_FUZZ_TARGET(in, ar) {
  const int64_t E = in.range(1, 6), T = in.range(0, 7), H = in.byte() < 8 ? 0 : in.range(1, 12);
  const int64_t K = in.byte() < 8 ? in.range(1, E + 1) : in.range(1, std::min<int64_t>(E, 4));
  Comm& comm = comm_for(E);
  const DType t = in.byte() < 16 ? DType::i32 : in.pick({DType::f32, DType::bf16, DType::f16});
  fz::Buf& x = ar.values(in, "x", t, {T, in.byte() < 6 ? H + 1 : H});
  fz::Buf& ids = ar.add("expert_ids", in.byte() < 252 ? DType::i32 : DType::i64, {T, in.byte() < 250 ? K : K + 1});
  // Distinct ids per row (a rotation of a chosen start and stride), now and then one out of range or repeated.
  for (int64_t r = 0; r < ids.view().size(0); ++r) {
    const int64_t start = in.range(0, E - 1), kk = ids.view().size(1);
    for (int64_t k = 0; k < kk; ++k) ids.set(r * kk + k, double((start + k) % E));
  }
  if (ids.numel() > 0 && in.byte() < 24) ids.set(in.range(0, ids.numel() - 1), double(in.pick<int64_t>({-1, E, E + 7, 0})));
  fz::Buf& sc = ar.add("expert_scales", in.byte() < 252 ? DType::f32 : DType::bf16, {T, in.byte() < 250 ? K : K + 1});
  for (int64_t i = 0; i < sc.numel(); ++i) sc.set(i, in.grid(8, 0, 1));
  DispatchOptions o;
  o.moe_expert_num = in.byte() < 250 ? E : E + 1;
  o.dispatcher = in.flag() ? Dispatcher::all_gather : Dispatcher::all_to_all;
  o.quant_int8 = in.byte() < 64;
  o.expert_token_nums_type = in.byte() < 128 ? 0 : 1;
  ar.seal();
  DispatchResult d;
  try {
    d = moe_distribute_dispatch(comm, x, ids, sc, o);
  } catch (const Error& e) {
    FZ_ASSERT(!e.arg().empty() && !e.expected().empty(), "moe_distribute_dispatch: an ot::Error without arg/expected: ", e.what());
    fz::count_outcome("moe_distribute_dispatch", e.what());
    ar.check();
    return;
  }
  fz::count_outcome("moe_distribute_dispatch", "");
  ar.check();
  const std::vector<ref::RankInput> ranks{{x.view(), ids.view(), sc.view()}};
  const ref::RankExpand want = ref::dispatch(ranks, comm.placement(), 0, o.quant_int8);
  fz::expect_close("expand_x", d.expand_x, want.expand_x);
  if (o.quant_int8) fz::expect_close("dynamic_scales", d.dynamic_scales, want.dynamic_scales, 1e-6, 0);
  const int64_t L = int64_t(want.tokens_per_expert.size());
  FZ_ASSERT(d.expert_token_nums.numel() == L, "expert_token_nums: ", d.expert_token_nums.numel(), " entries, ", L, " local experts");
  int64_t run = 0;
  for (int64_t l = 0; l < L; ++l) {
    run += want.tokens_per_expert[size_t(l)];
    const int64_t got = d.expert_token_nums.ptr<int64_t>()[l], exp = o.expert_token_nums_type == 0 ? run : want.tokens_per_expert[size_t(l)];
    FZ_ASSERT(got == exp, "expert_token_nums[", l, "] = ", got, ", reference ", exp);
  }
  for (size_t i = 0; i < want.assist.size(); ++i)
    FZ_ASSERT(d.assist_info_for_combine.ptr<int32_t>()[i] == want.assist[i], "assist_info_for_combine[", i, "]");
  // Combine: the experts' outputs are the rows widened to fp32 (dequantised when int8).
  const int64_t A = d.expand_x.size(0), Hx = x.view().size(1);  // x of T = 0 rows may have another H
  const DType yt = in.pick({DType::f32, DType::bf16, DType::f16});  // the output's dtype too
  Tensor y = Tensor::empty(yt, {A, Hx});
  for (int64_t r = 0; r < A; ++r)
    for (int64_t h = 0; h < Hx; ++h)
      set_from_double(y, r * Hx + h, get_as_double(d.expand_x, r * Hx + h) * (o.quant_int8 ? d.dynamic_scales.ptr<float>()[r] : 1.0));
  Tensor got = moe_distribute_combine(comm, y.view(), d);
  Tensor exp = Tensor::empty(yt, {T, Hx});
  ref::combine(ranks, comm.placement(), {y.view()}, 0, exp.view());
  fz::expect_close("combine", got, exp, fz::rtol_of(yt), fz::rtol_of(yt) * 8.0 * double(K));
  ar.check();
}
