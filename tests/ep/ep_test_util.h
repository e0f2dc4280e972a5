// Shared set-up of the expert-parallel tests (run under mpirun with 1..4 ranks). Every rank builds
// every rank's inputs from the same seeds, so each can compute the single-process answer on the
// concatenated tokens locally. Checks are non-fatal (EXPECT) after collectives so no rank skips a
// collective its peers enter.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <vector>

#include "ot/ep.h"
#include "ot/error.h"
#include "ot/moe.h"

namespace ot::ep::test {

int W();
int me();
// Experts: two per rank, at least 4 (so K = 3 fits on one rank too).
int64_t two_per_rank();
// This rank's entry of a per-rank list.
template <class T> const T& mine_of(const std::vector<T>& v) { return v[size_t(me())]; }

inline constexpr Dispatcher kDispatchers[] = {Dispatcher::all_to_all, Dispatcher::all_gather};

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  uint32_t next() { s = s * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(s >> 33); }
  float uni() { return float(next() & 0xffffff) / float(0x1000000); }  // [0, 1)
};
// An fp32 tensor of uniform values in [lo, hi).
Tensor uniform(const std::vector<int64_t>& shape, Rng& g, float lo, float hi);
Tensor full(const std::vector<int64_t>& shape, float value);

// Shapes of a test; ids: K distinct experts per token, drawn from `pool` (all experts by default).
struct Case {
  int64_t H = 24, K = 3, E = 8;
  DType dtype = DType::f32;
  std::function<int64_t(int)> bs = [](int r) { return int64_t((5 * r + 7) % 11); };  // 7, 1, 6, 0(r=3) ...
  std::function<std::vector<int>(int, int64_t)> pool;  // experts allowed for token (r, t)
};
// The usual case: the defaults with two experts per rank.
inline Case two_per_rank_case() {
  Case c;
  c.E = two_per_rank();
  return c;
}
// bf16 rows of width H, four experts per rank and K = 4 (several of a token's experts share a rank).
inline Case bf16_four_per_rank_case(int64_t H) {
  Case c;
  c.dtype = DType::bf16;
  c.E = 4 * W();
  c.K = 4;
  c.H = H;
  return c;
}
// Options naming c's experts, everything else at its default.
inline DispatchOptions options_for(const Case& c) {
  DispatchOptions o;
  o.moe_expert_num = c.E;
  return o;
}
inline FfnOptions ffn_options_for(const Case& c) {
  FfnOptions f;
  f.dispatch = options_for(c);
  return f;
}

// Per rank: {x [BS, H], expert_ids [BS, K] i32, expert_scales [BS, K] f32}.
using Inputs = std::vector<std::vector<Tensor>>;
Inputs make_inputs(const Case& c, int world, uint64_t seed);
std::vector<ref::RankInput> views(const Inputs& in);
// Rows that arrive on this rank: slots (r, t, k) with expert e placed here for which keep(r, t, k, e).
int64_t rows_arriving(const Inputs& in, const Placement& p, const std::function<bool(int, int64_t, int64_t, int)>& keep);
std::vector<int32_t> assist_of(const DispatchResult& d);

// SwiGLU FFN weights for every expert, packed once.
struct Experts {
  int64_t H, I;
  std::vector<gemm::PackedB> gu, dn;
  Experts(int64_t E, int64_t H_, int64_t I_);
  ExpertFn local(const Placement& p, int q) const;
  ExpertFn all() const;
};

// Output at column h of special expert s (= id - E: zero, then copy, then const experts, spec 9.3)
// for a token whose x (their ori_x) is ori_x at that column.
using SpecialFn = std::function<float(int64_t s, float ori_x, int64_t h)>;
// The single-process MoE on the concatenated tokens of all ranks: rows sorted by expert (stable in
// (rank, token) order), one grouped SwiGLU FFN over all experts, then out[t] = sum_k w * y in k order.
std::vector<Tensor> single_process(const Inputs& in, const Experts& ex, int64_t E, DType out_dtype, const SpecialFn& special = {});

// The usual set-up of an end-to-end test: every rank's inputs, experts of intermediate size I, the
// single-process answer and a Comm (options `copt`) with the contiguous placement.
struct Scenario {
  Scenario(const Case& c, int64_t I, uint64_t seed, const SpecialFn& special = {}, const CommOptions& copt = {});
  Case c;
  Experts ex;
  Inputs in;
  std::vector<Tensor> want;
  Comm comm;
  const std::vector<Tensor>& mine() const { return mine_of(in); }
  const Tensor& mine_want() const { return mine_of(want); }
};

// Bytes of the record at the head of every message (bytes_sent counts it): fault code, value, 20
// meta fields, a count and n_extra values of 8 bytes, padded to 64.
inline int64_t record_bytes(int64_t n_extra) { return (8 * (23 + n_extra) + 63) / 64 * 64; }

double norm_err(const TensorView& a, const TensorView& b);
bool bit_equal(const TensorView& a, const TensorView& b);

// Runs fn on every rank (each with its own, possibly bad, arguments) and expects every rank to throw
// an ot::Error naming `arg`.
void expect_all_throw(const char* arg, const std::function<void()>& fn);

// dispatch -> this rank's experts -> combine (blocking form); `keep` receives the dispatch result.
Tensor run_blocking(Comm& comm, const std::vector<Tensor>& mine, const Experts& ex, const DispatchOptions& o,
                    DispatchResult* keep = nullptr, const CombineInputs& ci = {});
// The pipelined form (ep_moe_ffn) on this rank's experts.
Tensor run_pipelined(Comm& comm, const std::vector<Tensor>& mine, const Experts& ex, const FfnOptions& f,
                     const TensorView& shared_expert_x = {});

}  // namespace ot::ep::test

// Every test file of this binary works in these namespaces (a test header, included by tests only).
using namespace ot;
using namespace ot::ep;
using namespace ot::ep::test;
