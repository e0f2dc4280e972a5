// Expert-parallel tests, run under mpirun with 1..4 ranks. Every rank builds every rank's inputs from
// the same seeds, so each can compute the single-process answer on the concatenated tokens locally.
// Checks are non-fatal (EXPECT) after collectives so no rank skips a collective its peers enter.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "ot/ep.h"
#include "ot/error.h"
#include "ot/moe.h"
#include "ot/numeric.h"

using namespace ot;
using namespace ot::ep;

namespace {

int W() { int w; MPI_Comm_size(MPI_COMM_WORLD, &w); return w; }
int me() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
// Experts: two per rank, at least 4 (so K = 3 fits on one rank too).
int64_t two_per_rank() { return std::max<int64_t>(4, 2 * W()); }

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  uint32_t next() { s = s * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(s >> 33); }
  float uni() { return float(next() & 0xffffff) / float(0x1000000); }  // [0, 1)
};

// Shapes of a test; ids: K distinct experts per token, drawn from `pool` (all experts by default).
struct Case {
  int64_t H = 24, K = 3, E = 8;
  DType dtype = DType::f32;
  std::function<int64_t(int)> bs = [](int r) { return int64_t((5 * r + 7) % 11); };  // 7, 1, 6, 0(r=3) ...
  std::function<std::vector<int>(int, int64_t)> pool;  // experts allowed for token (r, t)
};

std::vector<ref::RankInput> views(const std::vector<std::vector<Tensor>>& in) {
  std::vector<ref::RankInput> v;
  for (auto& r : in) v.push_back({r[0].view(), r[1].view(), r[2].view()});
  return v;
}

std::vector<std::vector<Tensor>> make_inputs(const Case& c, int world, uint64_t seed) {
  std::vector<std::vector<Tensor>> all;
  for (int r = 0; r < world; ++r) {
    Rng g(seed * 1000 + uint64_t(r));
    int64_t BS = c.bs(r);
    Tensor x = Tensor::empty(c.dtype, {BS, c.H}), ids = Tensor::empty(DType::i32, {BS, c.K}), w = Tensor::empty(DType::f32, {BS, c.K});
    for (int64_t i = 0; i < BS * c.H; ++i) set_from_double(x, i, 2.0 * g.uni() - 1.0);
    for (int64_t t = 0; t < BS; ++t) {
      std::vector<int> pool;
      if (c.pool) pool = c.pool(r, t);
      else for (int e = 0; e < c.E; ++e) pool.push_back(e);
      for (int64_t k = 0; k < c.K; ++k) {  // partial Fisher-Yates: distinct ids
        size_t j = size_t(k) + g.next() % (pool.size() - size_t(k));
        std::swap(pool[size_t(k)], pool[j]);
        ids.ptr<int32_t>()[t * c.K + k] = pool[size_t(k)];
        w.ptr<float>()[t * c.K + k] = 0.1f + g.uni();
      }
    }
    all.push_back({x, ids, w});
  }
  return all;
}

// Experts: SwiGLU FFN weights for every expert, packed once.
struct Experts {
  int64_t H, I;
  std::vector<gemm::PackedB> gu, dn;
  Experts(int64_t E, int64_t H_, int64_t I_) : H(H_), I(I_) {
    Rng g(777);
    for (int64_t e = 0; e < E; ++e) {
      Tensor a = Tensor::empty(DType::f32, {H, 2 * I}), b = Tensor::empty(DType::f32, {I, H});
      for (int64_t i = 0; i < a.numel(); ++i) a.ptr<float>()[i] = (2 * g.uni() - 1) / std::sqrt(float(H));
      for (int64_t i = 0; i < b.numel(); ++i) b.ptr<float>()[i] = (2 * g.uni() - 1) / std::sqrt(float(I));
      gu.push_back(gemm::prepack(a, gemm::BLayout::KN));
      dn.push_back(gemm::prepack(b, gemm::BLayout::KN));
    }
  }
  ExpertFn local(const Placement& p, int q) const {
    std::vector<const gemm::PackedB*> a, b;
    for (int64_t e : p.local_experts(q)) a.push_back(&gu[size_t(e)]), b.push_back(&dn[size_t(e)]);
    return swiglu_experts(a, b);
  }
  ExpertFn all() const {
    std::vector<const gemm::PackedB*> a, b;
    for (size_t e = 0; e < gu.size(); ++e) a.push_back(&gu[e]), b.push_back(&dn[e]);
    return swiglu_experts(a, b);
  }
};

// The single-process MoE on the concatenated tokens of all ranks: rows sorted by expert (stable in
// (rank, token) order), one grouped SwiGLU FFN over all experts, then out[t] = sum_k w * y in k order.
// Output at column h of special expert s (= id - E: zero, then copy, then const experts, spec 9.3)
// for token t of rank r.
using SpecialFn = std::function<float(int r, int64_t t, int64_t s, int64_t h)>;

std::vector<Tensor> single_process(const std::vector<std::vector<Tensor>>& in, const Experts& ex, int64_t E, DType out_dtype,
                                   const SpecialFn& special = {}) {
  const int64_t H = in[0][0].size(1), K = in[0][1].size(1);
  std::vector<std::tuple<int, int64_t, int64_t>> rows;  // (r, t, k)
  ExpertBatch b;
  for (int64_t e = 0; e < E; ++e) {
    int64_t begin = int64_t(rows.size());
    for (size_t r = 0; r < in.size(); ++r)
      for (int64_t t = 0; t < in[r][0].size(0); ++t)
        for (int64_t k = 0; k < K; ++k)
          if (in[r][1].ptr<int32_t>()[t * K + k] == e) rows.push_back({int(r), t, k});
    b.expert.push_back(e), b.row_begin.push_back(begin), b.rows.push_back(int64_t(rows.size()) - begin);
  }
  const int64_t A = int64_t(rows.size());
  DType dt = in[0][0].dtype();
  Tensor xs = Tensor::empty(dt, {A, H}), ys = Tensor::empty(dt, {A, H});
  for (int64_t i = 0; i < A; ++i) {
    auto [r, t, k] = rows[size_t(i)];
    std::memcpy(static_cast<char*>(xs.view().data) + i * H * int64_t(dtype_size(dt)),
                static_cast<const char*>(in[size_t(r)][0].view().data) + t * H * int64_t(dtype_size(dt)), size_t(H) * dtype_size(dt));
  }
  b.x = xs.view();
  b.y = ys.view();
  ex.all()(b);
  std::vector<std::vector<int64_t>> where(in.size());
  for (size_t r = 0; r < in.size(); ++r) where[r].assign(size_t(in[r][0].size(0) * K), -1);
  for (int64_t i = 0; i < A; ++i) {
    auto [r, t, k] = rows[size_t(i)];
    where[size_t(r)][size_t(t * K + k)] = i;
  }
  // The sum in k order with the MoE layer's combine step (ot::accumulate_f32: acc += w * row).
  std::vector<Tensor> out;
  std::vector<float> acc(static_cast<size_t>(H));
  for (size_t r = 0; r < in.size(); ++r) {
    int64_t BS = in[r][0].size(0);
    Tensor o = Tensor::empty(out_dtype, {BS, H});
    for (int64_t t = 0; t < BS; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = where[r][size_t(t * K + k)];
        const float w = in[r][2].ptr<float>()[t * K + k];
        if (i >= 0) {
          accumulate_f32(static_cast<const char*>(ys.view().data) + i * H * int64_t(dtype_size(dt)), dt, w, acc.data(), H);
        } else {
          for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * special(int(r), t, in[r][1].ptr<int32_t>()[t * K + k] - E, h);
        }
      }
      for (int64_t h = 0; h < H; ++h) set_from_double(o, t * H + h, acc[size_t(h)]);
    }
    out.push_back(o);
  }
  return out;
}

double norm_err(const TensorView& a, const TensorView& b) {
  double m = 0, s = 1e-30;
  for (int64_t i = 0; i < b.numel(); ++i) {
    m = std::max(m, std::fabs(get_as_double(a, i) - get_as_double(b, i)));
    s = std::max(s, std::fabs(get_as_double(b, i)));
  }
  return m / s;
}
bool bit_equal(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype && (a.numel() == 0 || std::memcmp(a.data, b.data, a.nbytes()) == 0);
}

// Runs fn on every rank (each with its own, possibly bad, arguments) and expects every rank to throw
// an ot::Error naming `arg`.
void expect_all_throw(const char* arg, const std::function<void()>& fn) {
  bool threw = false;
  try {
    fn();
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.arg(), arg) << e.what();
  }
  EXPECT_TRUE(threw) << arg;
}

// Runs dispatch -> local experts -> combine (blocking form).
Tensor run_blocking(Comm& comm, const std::vector<Tensor>& mine, const Experts& ex, const DispatchOptions& o, DispatchResult* keep = nullptr) {
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y = Tensor::empty(mine[0].dtype(), {d.expand_x.size(0), mine[0].size(1)});
  ex.local(comm.placement(), comm.ep_rank_id())(batch_of(d, y));
  Tensor out = moe_distribute_combine(comm, y, d);
  if (keep) *keep = std::move(d);
  return out;
}

}  // namespace

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

TEST(EpDispatch, LayoutMatchesReference) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather})
      for (bool quant : {false, true})
        for (int type : {0, 1}) {
          Case c;
          c.dtype = dt;
          c.E = two_per_rank();
          c.K = std::min<int64_t>(3, c.E);
          auto in = make_inputs(c, W(), 1);
          Comm comm(c.E);
          DispatchOptions o;
          o.moe_expert_num = c.E;
          o.dispatcher = disp;
          o.quant_int8 = quant;
          o.expert_token_nums_type = type;
          DispatchResult d = moe_distribute_dispatch(comm, in[size_t(me())][0], in[size_t(me())][1], in[size_t(me())][2], o);
          ref::RankExpand r = ref::dispatch(views(in), comm.placement(), me(), quant);
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << dispatcher_name(disp) << " quant=" << quant << " type=" << type);
          EXPECT_TRUE(bit_equal(d.expand_x, r.expand_x));
          if (quant) {
            EXPECT_TRUE(bit_equal(d.dynamic_scales, r.dynamic_scales));
          }
          EXPECT_EQ(std::vector<int32_t>(d.assist_info_for_combine.ptr<int32_t>(), d.assist_info_for_combine.ptr<int32_t>() + 3 * d.expand_x.size(0)),
                    r.assist);
          int64_t run = 0;
          for (size_t l = 0; l < r.tokens_per_expert.size(); ++l) {
            run += r.tokens_per_expert[l];
            EXPECT_EQ(d.expert_token_nums.ptr<int64_t>()[l], type == 0 ? run : r.tokens_per_expert[l]);
            EXPECT_EQ(d.ep_recv_counts.ptr<int32_t>()[int64_t(l) * W() + W() - 1], run);
          }
        }
}

// dispatch + local experts + combine == the single-process MoE on the concatenated tokens.
TEST(EpEndToEnd, Fp32BitExactAndForms) {
  Case c;
  c.E = 2 * W() + (W() == 1 ? 2 : 0);
  c.K = 3;
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 2);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  DispatchOptions o;
  o.moe_expert_num = c.E;
  o.dedup_combine = false;  // per-slot return, k-order sum: bit-identical
  Tensor got = run_blocking(comm, in[size_t(me())], ex, o);
  EXPECT_TRUE(bit_equal(got, want[size_t(me())])) << norm_err(got, want[size_t(me())]);
  o.dedup_combine = true;  // partial sums on the expert rank: rounding differs
  EXPECT_LE(norm_err(run_blocking(comm, in[size_t(me())], ex, o), want[size_t(me())]), 1e-6);
  o.dispatcher = Dispatcher::all_gather;
  EXPECT_LE(norm_err(run_blocking(comm, in[size_t(me())], ex, o), want[size_t(me())]), 1e-6);
}

TEST(EpEndToEnd, Bf16WithinTolerance) {
  Case c;
  c.dtype = DType::bf16;
  c.E = 4 * W();
  c.K = 4;
  c.H = 32;
  Experts ex(c.E, c.H, 16);
  auto in = make_inputs(c, W(), 3);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather})
    for (bool dedup : {true, false}) {
      DispatchOptions o;
      o.moe_expert_num = c.E;
      o.dispatcher = disp;
      o.dedup_combine = dedup;
      Tensor got = run_blocking(comm, in[size_t(me())], ex, o);
      EXPECT_EQ(got.dtype(), DType::bf16);
      EXPECT_LE(norm_err(got, want[size_t(me())]), 1.5e-2) << dispatcher_name(disp) << " dedup=" << dedup;
    }
}

// x_active_mask: inactive tokens (1-D) or slots (2-D) are not sent; the answer equals the
// single-process MoE with their routing weights zeroed (inactive tokens: zero rows), bit for bit in
// fp32 with the per-slot combine, and no byte leaves a rank for an inactive slot.
TEST(EpMask, InactiveTokensAndSlots) {
  Case c;
  c.E = 2 * W() + (W() == 1 ? 2 : 0);
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 21);
  for (int dims : {1, 2}) {
    auto zeroed = in;
    std::vector<Tensor> masks;
    for (int r = 0; r < W(); ++r) {
      const int64_t BS = in[size_t(r)][0].size(0);
      Tensor m = dims == 1 ? Tensor::empty(DType::u8, {BS}) : Tensor::empty(DType::u8, {BS, c.K});
      Tensor w = Tensor::copy_of(in[size_t(r)][2]);
      for (int64_t t = 0; t < BS; ++t)
        for (int64_t k = 0; k < c.K; ++k) {
          bool on = dims == 1 ? (t + r) % 3 != 0 : (t + k + r) % 4 != 0;
          if (dims == 1 && k == 0) m.ptr<uint8_t>()[t] = on;
          if (dims == 2) m.ptr<uint8_t>()[t * c.K + k] = on;
          if (!on) w.ptr<float>()[t * c.K + k] = 0.f;
        }
      zeroed[size_t(r)][2] = w;
      masks.push_back(m);
    }
    auto want = single_process(zeroed, ex, c.E, DType::f32);
    Comm comm(c.E);
    const auto& mine = in[size_t(me())];
    for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather})
      for (bool dedup : {false, true}) {
        DispatchOptions o;
        o.moe_expert_num = c.E;
        o.dispatcher = disp;
        o.dedup_combine = dedup;
        o.x_active_mask = masks[size_t(me())];
        SCOPED_TRACE(::testing::Message() << dims << "-D mask " << dispatcher_name(disp) << " dedup=" << dedup);
        DispatchResult d;
        Tensor got = run_blocking(comm, mine, ex, o, &d);
        if (disp == Dispatcher::all_to_all && !dedup) EXPECT_TRUE(bit_equal(got, want[size_t(me())])) << norm_err(got, want[size_t(me())]);
        else EXPECT_LE(norm_err(got, want[size_t(me())]), 1e-6);
        // Received rows: only active slots arrive.
        int64_t active_here = 0;
        for (int r = 0; r < W(); ++r)
          for (int64_t t = 0; t < in[size_t(r)][0].size(0); ++t)
            for (int64_t k = 0; k < c.K; ++k) {
              const uint8_t* mm = masks[size_t(r)].ptr<uint8_t>();
              bool on = dims == 1 ? mm[t] != 0 : mm[t * c.K + k] != 0;
              int e = in[size_t(r)][1].ptr<int32_t>()[t * c.K + k];
              active_here += on && comm.placement().destination(r, t, e) == me();
            }
        EXPECT_EQ(d.expand_x.size(0), active_here);
        if (dims == 1) {  // inactive tokens: zero rows, also with a shared expert output given
          Tensor sh = Tensor::empty(DType::f32, {mine[0].size(0), c.H});
          for (int64_t i = 0; i < sh.numel(); ++i) sh.ptr<float>()[i] = 1.f;
          DispatchResult d2 = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
          Tensor y = Tensor::empty(DType::f32, {d2.expand_x.size(0), c.H});
          ex.local(comm.placement(), me())(batch_of(d2, y));
          Tensor out = moe_distribute_combine(comm, y, d2, sh);
          for (int64_t t = 0; t < mine[0].size(0); ++t) {
            if (masks[size_t(me())].ptr<uint8_t>()[t]) continue;
            for (int64_t h = 0; h < c.H; ++h) EXPECT_EQ(out.ptr<float>()[t * c.H + h], 0.f);
          }
        }
      }
    // The pipelined form narrows the mask per chunk.
    FfnOptions f;
    f.dispatch.moe_expert_num = c.E;
    f.dispatch.x_active_mask = masks[size_t(me())];
    f.chunks = 2;
    EXPECT_LE(norm_err(ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f), want[size_t(me())]), 1e-6);
  }
}

// Shared-expert ranks (spec 9): ranks [0, S) hold the shared expert, every token also goes to one of
// them and comes back unweighted. Equals the single-process MoE whose tokens carry one more slot
// (the shared expert, weight 1): bit for bit in fp32 with the per-slot combine.
TEST(EpSharedRanks, SharedExpertOnItsOwnRanks) {
  if (W() < 2) GTEST_SKIP() << "needs a MoE rank besides the shared one";
  for (int S = 1; S < W(); S += 2) {
    Case c;
    c.E = 2 * W() * (W() - S);
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
    Comm comm(c.E);
    comm.set_placement(Placement::shared_ranks(c.E, W(), S));
    const auto& mine = in[size_t(me())];
    DispatchOptions o;
    o.moe_expert_num = c.E;
    o.shared_expert_rank_num = S;
    o.dedup_combine = false;
    SCOPED_TRACE(::testing::Message() << "S=" << S);
    DispatchResult d;
    Tensor got = run_blocking(comm, mine, ex, o, &d);
    EXPECT_TRUE(bit_equal(got, want[size_t(me())])) << norm_err(got, want[size_t(me())]);
    if (me() < S) {  // a shared rank: one local expert, a row for every token routed to it
      int64_t rows = 0;
      for (int r = 0; r < W(); ++r)
        for (int64_t t = 0; t < in[size_t(r)][0].size(0); ++t) rows += comm.placement().destination(r, t, c.E) == me();
      EXPECT_EQ(d.expert_token_nums.numel(), 1);
      EXPECT_EQ(d.expand_x.size(0), rows);
    }
    o.dedup_combine = true;
    EXPECT_LE(norm_err(run_blocking(comm, mine, ex, o), want[size_t(me())]), 1e-6);
    FfnOptions f;
    f.dispatch = o;
    f.chunks = 2;
    EXPECT_LE(norm_err(ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f), want[size_t(me())]), 1e-6);
    // Without the matching placement: every rank fails, naming the option.
    Comm plain(c.E);
    expect_all_throw("moe_expert_num", [&] { moe_distribute_dispatch(plain, mine[0], mine[1], mine[2], o); });
  }
}

// The Comm reuses output storage (expand_x, x_out) once the caller has dropped earlier results, and
// never while the caller still holds them.
TEST(EpComm, ReusesOutputStorageOnlyWhenDropped) {
  Case c;
  c.E = two_per_rank();
  c.bs = [](int) { return int64_t(6); };
  auto in = make_inputs(c, W(), 31);
  const auto& mine = in[size_t(me())];
  Comm comm(c.E);
  DispatchOptions o;
  o.moe_expert_num = c.E;
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

// A token with several experts on one rank crosses the wire once; bytes_sent says so.
TEST(EpDispatch, DedupByteCounts) {
  Case c;
  c.dtype = DType::bf16;
  c.E = 4 * W();
  c.K = 4;
  c.H = 40;
  c.bs = [](int r) { return int64_t(9 + r); };
  auto in = make_inputs(c, W(), 4);
  Comm comm(c.E);
  const Placement& p = comm.placement();
  const int64_t stride_bf16 = ((((8 + 8 * c.K + 15) / 16) * 16 + c.H * 2 + 15) / 16) * 16;
  const int64_t stride_i8 = ((((8 + 8 * c.K + 15) / 16) * 16 + c.H + 15) / 16) * 16;
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
  DispatchOptions o;
  o.moe_expert_num = c.E;
  const auto& mine = in[size_t(me())];
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  EXPECT_EQ(d.bytes_sent, rows_out * stride_bf16);
  if (W() > 1) {
    EXPECT_LT(rows_out, slots_out + 1);
  }
  Tensor y = Tensor::copy_of(d.expand_x);
  PendingCombine pc = moe_distribute_combine_start(comm, y, d);
  EXPECT_EQ(pc.bytes_sent(), rows_in * c.H * 2);  // one partial row per received token
  pc.wait();
  o.quant_int8 = true;
  EXPECT_EQ(moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o).bytes_sent, rows_out * stride_i8);
}

// Split form: own rows are computed before the remote rows arrive; same answer as blocking.
TEST(EpOverlap, SplitFormMatchesBlocking) {
  Case c;
  c.E = two_per_rank();
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 5);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  ExpertFn fn = ex.local(comm.placement(), me());
  for (bool dedup : {false, true}) {
    DispatchOptions o;
    o.moe_expert_num = c.E;
    o.dedup_combine = dedup;
    const auto& mine = in[size_t(me())];
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
    // Remaining rows: everything not in a local block.
    ExpertBatch rest = batch_of(d, y.view());
    ExpertBatch remote = local;
    remote.expert.clear(), remote.row_begin.clear(), remote.rows.clear();
    for (size_t g = 0; g < rest.expert.size(); ++g) {
      const auto& blk = pd.local_blocks()[size_t(rest.expert[g])];
      int64_t b0 = rest.row_begin[g], b1 = b0 + rest.rows[g];
      if (blk.begin > b0) remote.expert.push_back(rest.expert[g]), remote.row_begin.push_back(b0), remote.rows.push_back(blk.begin - b0);
      if (b1 > blk.begin + blk.count)
        remote.expert.push_back(rest.expert[g]), remote.row_begin.push_back(blk.begin + blk.count), remote.rows.push_back(b1 - blk.begin - blk.count);
    }
    fn(remote);
    PendingCombine pc = moe_distribute_combine_start(comm, y, d);
    while (!pc.test()) comm.progress();
    Tensor got = pc.wait();
    EXPECT_LE(norm_err(got, want[size_t(me())]), dedup ? 1e-6 : 0.0) << "dedup=" << dedup;
  }
}

TEST(EpOverlap, PipelinedFfnMatchesSingleProcess) {
  Case c;
  c.E = two_per_rank();
  c.bs = [](int r) { return int64_t(r == 1 ? 0 : 6 + 3 * r); };
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 6);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  const auto& mine = in[size_t(me())];
  Tensor shared = Tensor::empty(DType::f32, {mine[0].size(0), c.H});
  for (int64_t i = 0; i < shared.numel(); ++i) shared.ptr<float>()[i] = 0.25f * float(i % 7);
  for (int chunks : {1, 2, 3})
    for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather}) {
      FfnOptions f;
      f.dispatch.moe_expert_num = c.E;
      f.dispatch.dispatcher = disp;
      f.dispatch.dedup_combine = false;
      f.chunks = chunks;
      Tensor got = ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f);
      EXPECT_LE(norm_err(got, want[size_t(me())]), disp == Dispatcher::all_to_all ? 0.0 : 1e-6) << chunks;
      Tensor with_shared = ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f, shared);
      Tensor expect = Tensor::copy_of(want[size_t(me())]);
      for (int64_t i = 0; i < expect.numel(); ++i) expect.ptr<float>()[i] += shared.ptr<float>()[i];
      EXPECT_LE(norm_err(with_shared, expect), 1e-6) << chunks;
    }
}

TEST(EpQuant, Int8RowsWithinTolerance) {
  Case c;
  c.dtype = DType::bf16;
  c.E = two_per_rank();
  c.H = 32;
  Experts ex(c.E, c.H, 16);
  auto in = make_inputs(c, W(), 7);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  FfnOptions f;
  f.dispatch.moe_expert_num = c.E;
  f.dispatch.quant_int8 = true;
  const auto& mine = in[size_t(me())];
  Tensor got = ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f);
  EXPECT_LE(norm_err(got, want[size_t(me())]), 3e-2);
}

// comm_quant_mode 2: combine rows travel as int8 with a per-row scale (dedup and per-slot forms);
// within int8 tolerance of the single-process answer, fewer combine bytes.
TEST(EpQuant, CombineInt8RowsWithinTolerance) {
  Case c;
  c.dtype = DType::bf16;
  c.E = two_per_rank();
  c.H = 64;
  Experts ex(c.E, c.H, 16);
  auto in = make_inputs(c, W(), 9);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  const auto& mine = in[size_t(me())];
  for (bool dedup : {true, false}) {
    DispatchOptions o;
    o.moe_expert_num = c.E;
    o.dedup_combine = dedup;
    int64_t bytes[2] = {0, 0};
    for (int q : {0, 2}) {
      o.comm_quant_mode = q;
      DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
      Tensor y = Tensor::empty(DType::bf16, {d.expand_x.size(0), c.H});
      ex.local(comm.placement(), me())(batch_of(d, y));
      PendingCombine pc = moe_distribute_combine_start(comm, y, d);
      Tensor got = pc.wait();
      bytes[q / 2] = pc.bytes_sent();
      EXPECT_LE(norm_err(got, want[size_t(me())]), q ? 3e-2 : 1.5e-2) << "dedup=" << dedup << " comm_quant_mode=" << q;
    }
    if (bytes[0] > 0) {
      EXPECT_LT(bytes[1], bytes[0] * 2 / 3) << "int8 rows: about half of bf16";
    }
  }
  DispatchOptions bad;
  bad.moe_expert_num = c.E;
  bad.comm_quant_mode = me() == W() - 1 ? 1 : 0;
  expect_all_throw("comm_quant_mode", [&] { moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], bad); });
}

// Smooth-quant scales (spec 9.2): each expand_x row is int8(x * scales[e + shared_expert_num]) with
// its own dynamic scale, i.e. quantised per (token, expert); equal to the plain reference bit for
// bit in every form. Given without quant_int8 on one rank: every rank fails.
TEST(EpQuant, SmoothScalesPerTokenAndExpert) {
  Case c;
  c.dtype = DType::bf16;
  c.E = two_per_rank();
  c.K = std::min<int64_t>(3, c.E);
  c.H = 32;
  auto in = make_inputs(c, W(), 13);
  const auto& mine = in[size_t(me())];
  Comm comm(c.E);
  for (int shared_num : {0, 1}) {
    Tensor smooth = Tensor::empty(DType::f32, {c.E + shared_num, c.H});
    Rng g(99);
    for (int64_t i = 0; i < smooth.numel(); ++i) smooth.ptr<float>()[i] = 0.25f + 2 * g.uni();
    for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather})
      for (bool split : {false, true}) {
        DispatchOptions o;
        o.moe_expert_num = c.E;
        o.dispatcher = disp;
        o.quant_int8 = true;
        o.smooth_scales = smooth;
        o.shared_expert_num = shared_num;
        SCOPED_TRACE(::testing::Message() << dispatcher_name(disp) << " split=" << split << " shared_expert_num=" << shared_num);
        DispatchResult d = split ? moe_distribute_dispatch_start(comm, mine[0], mine[1], mine[2], o).wait()
                                 : moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
        ref::RankExpand r = ref::dispatch(views(in), comm.placement(), me(), true, smooth, shared_num);
        EXPECT_TRUE(bit_equal(d.expand_x, r.expand_x));
        EXPECT_TRUE(bit_equal(d.dynamic_scales, r.dynamic_scales));
        EXPECT_EQ(std::vector<int32_t>(d.assist_info_for_combine.ptr<int32_t>(), d.assist_info_for_combine.ptr<int32_t>() + 3 * d.expand_x.size(0)),
                  r.assist);
      }
  }
  DispatchOptions bad;
  bad.moe_expert_num = c.E;
  Tensor smooth = Tensor::empty(DType::f32, {c.E, c.H});
  for (int64_t i = 0; i < smooth.numel(); ++i) smooth.ptr<float>()[i] = 1.f;
  if (me() == W() - 1) bad.smooth_scales = smooth;  // without quant_int8
  expect_all_throw("smooth_scales", [&] { moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], bad); });
}

// Zero, copy and const experts (spec 9.3): ids past the routed ones, never sent, computed at
// combine on the token's own rank. Equals the single-process MoE with those experts' outputs, bit
// for bit in fp32 with the per-slot combine; also pipelined; a missing ori_x fails everywhere.
TEST(EpSpecial, ZeroCopyConstExperts) {
  Case c;
  c.E = 2 * W() + (W() == 1 ? 2 : 0);
  const int64_t Z = 1, C = 1, Q = 2;
  c.pool = [&](int, int64_t) {
    std::vector<int> p(static_cast<size_t>(c.E + Z + C + Q));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int(i);
    return p;
  };
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 51);
  Tensor a1 = Tensor::empty(DType::f32, {Q}), a2 = Tensor::empty(DType::f32, {Q}), v = Tensor::empty(DType::f32, {Q, c.H});
  Rng g(5);
  for (int64_t i = 0; i < Q; ++i) a1.ptr<float>()[i] = 2 * g.uni() - 1, a2.ptr<float>()[i] = 2 * g.uni() - 1;
  for (int64_t i = 0; i < v.numel(); ++i) v.ptr<float>()[i] = 2 * g.uni() - 1;
  auto special = [&](int r, int64_t t, int64_t s, int64_t h) -> float {
    if (s < Z) return 0.f;
    const float ox = in[size_t(r)][0].ptr<float>()[t * c.H + h];
    if (s < Z + C) return ox;
    const int64_t q = s - Z - C;
    return a1.ptr<float>()[q] * ox + a2.ptr<float>()[q] * v.ptr<float>()[q * c.H + h];
  };
  auto want = single_process(in, ex, c.E, DType::f32, special);
  Comm comm(c.E);
  const auto& mine = in[size_t(me())];
  DispatchOptions o;
  o.moe_expert_num = c.E;
  o.zero_expert_num = Z, o.copy_expert_num = C, o.const_expert_num = Q;
  CombineInputs ci;
  ci.ori_x = mine[0];
  ci.const_expert_alpha_1 = a1, ci.const_expert_alpha_2 = a2, ci.const_expert_v = v;
  int64_t routed_here = 0;  // only routed slots arrive
  for (int r = 0; r < W(); ++r)
    for (int64_t t = 0; t < in[size_t(r)][0].size(0); ++t)
      for (int64_t k = 0; k < c.K; ++k) {
        const int e = in[size_t(r)][1].ptr<int32_t>()[t * c.K + k];
        routed_here += e < c.E && comm.placement().destination(r, t, e) == me();
      }
  for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather})
    for (bool dedup : {false, true}) {
      o.dispatcher = disp;
      o.dedup_combine = dedup;
      SCOPED_TRACE(::testing::Message() << dispatcher_name(disp) << " dedup=" << dedup);
      DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
      EXPECT_EQ(d.expand_x.size(0), routed_here);
      Tensor y = Tensor::empty(DType::f32, {d.expand_x.size(0), c.H});
      ex.local(comm.placement(), me())(batch_of(d, y));
      Tensor got = moe_distribute_combine(comm, y, d, ci);
      if (disp == Dispatcher::all_to_all && !dedup) EXPECT_TRUE(bit_equal(got, want[size_t(me())])) << norm_err(got, want[size_t(me())]);
      else EXPECT_LE(norm_err(got, want[size_t(me())]), 1e-6);
    }
  FfnOptions f;
  f.dispatch = o;
  f.chunks = 2;
  f.const_expert_alpha_1 = a1, f.const_expert_alpha_2 = a2, f.const_expert_v = v;
  EXPECT_LE(norm_err(ep_moe_ffn(comm, mine[0], mine[1], mine[2], ex.local(comm.placement(), me()), f), want[size_t(me())]), 1e-6);
  DispatchResult d = moe_distribute_dispatch(comm, mine[0], mine[1], mine[2], o);
  Tensor y = Tensor::zeros(DType::f32, {d.expand_x.size(0), c.H});
  CombineInputs missing = ci;
  if (me() == W() - 1) missing.ori_x = TensorView();
  expect_all_throw("ori_x", [&] { moe_distribute_combine(comm, y, d, missing); });
}

// A hot expert copied on every rank: its tokens are split between copies; results unchanged.
TEST(EpPlacement, RedundantCopiesSplitTokens) {
  Case c;
  c.E = two_per_rank();
  c.K = 2;
  c.bs = [](int r) { return int64_t(10 + r); };
  c.pool = [](int, int64_t t) { return std::vector<int>{0, int(1 + t % 3)}; };
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 8);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  std::vector<std::vector<int>> copies;
  for (int64_t e = 0; e < c.E; ++e) copies.push_back({int(e / (c.E / W()))});
  for (int q = 1; q < W(); ++q) copies[0].push_back(q);
  comm.set_placement(Placement::from_copies(c.E, W(), copies));
  DispatchOptions o;
  o.moe_expert_num = c.E;
  DispatchResult d;
  Tensor got = run_blocking(comm, in[size_t(me())], ex, o, &d);
  EXPECT_LE(norm_err(got, want[size_t(me())]), 1e-6);
  int64_t hot = d.expert_token_nums.ptr<int64_t>()[comm.placement().local_index(me(), 0)];
  EXPECT_GT(hot, 0);  // every copy receives part of expert 0's tokens
}

TEST(EpEdge, AllTokensToOneRankAndEmptyRanks) {
  Case c;
  c.E = two_per_rank();
  c.K = 2;
  c.bs = [](int r) { return int64_t(r % 2 == 0 ? 0 : 5 + r); };
  c.pool = [](int, int64_t) { return std::vector<int>{0, 1}; };  // rank 0's experts only
  Experts ex(c.E, c.H, 8);
  auto in = make_inputs(c, W(), 9);
  auto want = single_process(in, ex, c.E, DType::f32);
  Comm comm(c.E);
  for (Dispatcher disp : {Dispatcher::all_to_all, Dispatcher::all_gather}) {
    DispatchOptions o;
    o.moe_expert_num = c.E;
    o.dispatcher = disp;
    DispatchResult d;
    Tensor got = run_blocking(comm, in[size_t(me())], ex, o, &d);
    EXPECT_LE(norm_err(got, want[size_t(me())]), 1e-6);
    if (me() != 0) {
      EXPECT_EQ(d.expand_x.size(0), 0);
    }
  }
}

// The seam to the MoE layer: ep_moe_ffn on moe::moe_expert_ffn over this rank's slice of the
// expert store equals the MoE layer's own single-process path on the concatenated tokens.
TEST(EpMoeSeam, MoeExpertFfnMatchesSingleProcessMoe) {
  Case c;
  c.E = two_per_rank();
  c.bs = [](int r) { return int64_t(r == 2 ? 0 : 5 + 2 * r); };
  const int64_t I = 8, L = c.E / W();
  Tensor gu = Tensor::empty(DType::f32, {c.E, c.H, 2 * I}), dn = Tensor::empty(DType::f32, {c.E, I, c.H});
  Rng g(4242);
  for (int64_t i = 0; i < gu.numel(); ++i) gu.ptr<float>()[i] = (2 * g.uni() - 1) / std::sqrt(float(c.H));
  for (int64_t i = 0; i < dn.numel(); ++i) dn.ptr<float>()[i] = (2 * g.uni() - 1) / std::sqrt(float(I));
  moe::MoeExperts all = moe::MoeExperts::from_fused(gu, dn, moe::WeightLayout::EHI);
  moe::MoeExperts local = moe::MoeExperts::from_fused(gu.view().narrow(0, me() * L, L), dn.view().narrow(0, me() * L, L), moe::WeightLayout::EHI);
  auto in = make_inputs(c, W(), 12);
  // Single process: all tokens, the MoE layer's routing plan and expert FFN.
  int64_t N = 0, mine0 = 0;
  for (int r = 0; r < W(); ++r) {
    if (r == me()) mine0 = N;
    N += c.bs(r);
  }
  Tensor x = Tensor::empty(DType::f32, {N, c.H}), ids = Tensor::empty(DType::i32, {N, c.K}), w = Tensor::empty(DType::f32, {N, c.K});
  for (int r = 0, o = 0; r < W(); o += int(c.bs(r)), ++r) {
    std::memcpy(x.ptr<float>() + o * c.H, in[size_t(r)][0].ptr<float>(), size_t(c.bs(r) * c.H) * 4);
    std::memcpy(ids.ptr<int32_t>() + o * c.K, in[size_t(r)][1].ptr<int32_t>(), size_t(c.bs(r) * c.K) * 4);
    std::memcpy(w.ptr<float>() + o * c.K, in[size_t(r)][2].ptr<float>(), size_t(c.bs(r) * c.K) * 4);
  }
  Comm comm(c.E);
  moe::RoutingPlan plan = moe::moe_routing_plan(ids, w, c.E);
  Tensor want = Tensor::zeros(DType::f32, {N, c.H});
  moe::moe_expert_ffn(x, all, plan.rows(), want, true);
  for (bool dedup : {false, true})
    for (bool quant : {false, true}) {  // int8 rows go into the grouped GEMM as its int8 A operand
      FfnOptions f;
      f.dispatch.moe_expert_num = c.E;
      f.dispatch.dedup_combine = dedup;
      f.dispatch.quant_int8 = quant;
      const auto& mine = in[size_t(me())];
      Tensor got = ep_moe_ffn(comm, mine[0], mine[1], mine[2], moe_experts(local), f);
      EXPECT_LE(norm_err(got, want.view().narrow(0, mine0, c.bs(me()))), quant ? 3e-2 : 1e-5) << "dedup=" << dedup << " quant=" << quant;
    }
}

// Each bad argument on ONE rank makes every rank throw; afterwards a good call still works.
TEST(EpErrors, BadArgumentOnOneRankFailsEverywhere) {
  Case c;
  c.E = two_per_rank();
  Comm comm(c.E);
  const int bad = W() - 1;
  DispatchOptions o;
  o.moe_expert_num = c.E;
  Case c2 = c;  // every rank has tokens, so the bad rank can hold a bad id

  c2.bs = [](int) { return int64_t(4); };
  auto in2 = make_inputs(c2, W(), 11);
  const auto& m2 = in2[size_t(me())];
  {
    Tensor ids = Tensor::copy_of(m2[1]);
    if (me() == bad) ids.ptr<int32_t>()[1] = int32_t(c.E + 3);
    expect_all_throw("expert_ids", [&] { moe_distribute_dispatch(comm, m2[0], ids, m2[2], o); });
  }
  {  // K mismatch across ranks
    Tensor ids = m2[1], w = m2[2];
    if (me() == bad) {
      ids = Tensor::empty(DType::i32, {4, c.K - 1});
      w = Tensor::empty(DType::f32, {4, c.K - 1});
      for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = int32_t(i % (c.K - 1)), w.ptr<float>()[i] = 1;
    }
    if (W() > 1) expect_all_throw("expert_ids", [&] { moe_distribute_dispatch(comm, m2[0], ids, w, o); });
  }
  {  // world size not matching the communicator
    DispatchOptions ob = o;
    if (me() == bad) ob.ep_world_size = W() + 1;
    expect_all_throw("ep_world_size", [&] { moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], ob); });
  }
  if (W() > 1) {  // moe_expert_num not divisible by the world size (on one rank)
    DispatchOptions ob = o;
    if (me() == bad) ob.moe_expert_num = c.E + 1;
    expect_all_throw("moe_expert_num", [&] { moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], ob); });
  }
  {  // a mask of the wrong shape on one rank
    DispatchOptions ob = o;
    Tensor m = Tensor::zeros(DType::u8, {me() == bad ? 3 : 4});
    ob.x_active_mask = m;
    expect_all_throw("x_active_mask", [&] { moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], ob); });
  }
  {  // combine: wrong expert_out shape on one rank
    DispatchResult d = moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], o);
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
    expect_all_throw("experts", [&] { ep_moe_ffn(comm, m2[0], m2[1], m2[2], fn, f); });
  }
  if (W() > 1) {  // the blocking form on one rank, the split form on the others
    expect_all_throw("call", [&] {
      if (me() == bad) moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], o);
      else moe_distribute_dispatch_start(comm, m2[0], m2[1], m2[2], o).wait();
    });
  }
  // Nobody is left hanging: a good call completes everywhere.
  DispatchResult d = moe_distribute_dispatch(comm, m2[0], m2[1], m2[2], o);
  EXPECT_EQ(d.expert_token_nums.numel(), comm.num_local_experts());
}

// Ranks other than 0 print only their failures (rank-prefixed).
struct FailurePrinter : ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", me(), r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (me() != 0) {  // one rank prints the progress; failures on any rank still fail the run
    auto& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new FailurePrinter);
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc != 0) std::fprintf(stderr, "rank %d: tests failed\n", me());
  MPI_Finalize();
  return any;
}
