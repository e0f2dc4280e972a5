// Chunked forward against the fp64 token recurrence, and every stage against its own reference.
#include <gtest/gtest.h>

#include "gdn_test_util.h"
#include "ot/cpu.h"
#include "ot/error.h"

namespace test_gdn_chunk {
using namespace gdn_test;
namespace gdn = ot::gdn;

namespace {

double tol(DType dt) { return dt == DType::f32 ? 2e-4 : dt == DType::bf16 ? 1e-2 : 2e-3; }

struct Case {
  Shape s;
  DType dt;
  bool l2;
  float gmin;
  std::vector<int64_t> cu;  // empty: fixed length
  bool init;
};

void run_case(const Case& c, uint32_t seed) {
  ChunkCase cc = make_chunk_case(c.s, c.dt, c.l2, c.gmin, c.cu, c.init, seed);
  const Inputs& in = cc.in;
  const gdn::ChunkOptions& opt = cc.opt;
  gdn::ChunkFwd fast = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, opt);
  gdn::ChunkFwd ref = gdn::ref::recurrence(in.q, in.k, in.v, in.g, in.beta, opt);
  ASSERT_EQ(fast.o.shape(), in.v.shape());
  EXPECT_LT(rel_err(fast.o, ref.o), tol(c.dt)) << "o";
  EXPECT_LT(rel_err(fast.final_state, ref.final_state), 2e-4) << "final state";
  ASSERT_TRUE(fast.g_cumsum.defined() && fast.A.defined());
  // The saved G and A equal the stage references (the path OT_FORCE_REF takes).
  ot::cpu::ScopedForceRef force(true);
  gdn::ChunkFwd r2 = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, opt);
  EXPECT_LT(rel_err(fast.g_cumsum, r2.g_cumsum), 1e-5);
  EXPECT_LT(rel_err(fast.A, r2.A), 1e-4);
  EXPECT_LT(rel_err(r2.o, ref.o), tol(c.dt));
  if (c.l2) {
    EXPECT_LT(rel_err(fast.k_rstd, r2.k_rstd), 1e-5);
  }
}

}  // namespace

TEST(GdnChunkFwd, LengthsAroundTheChunk) {
  for (int64_t T : {1, 63, 64, 65, 200}) {
    Shape s;
    s.T = T;
    run_case({s, DType::f32, false, -1.f, {}, false}, uint32_t(T));
  }
}

TEST(GdnChunkFwd, LongSequence) {
  Shape s;
  s.T = 1000, s.HK = 1, s.HV = 2, s.DK = 16, s.DV = 24;
  run_case({s, DType::f32, true, -0.5f, {}, true}, 11);
}

TEST(GdnChunkFwd, GroupsDimsL2normDtypes) {
  uint32_t seed = 100;
  for (int G : {1, 2, 4})
    for (bool l2 : {false, true})
      for (DType dt : {DType::f32, DType::bf16}) {
        Shape s;
        s.B = 2, s.T = 70, s.HK = 2, s.HV = 2 * G, s.DK = 24, s.DV = 40;
        SCOPED_TRACE(testing::Message() << "G=" << G << " l2=" << l2 << " dt=" << ot::dtype_name(dt));
        run_case({s, dt, l2, -1.f, {}, true}, seed++);
      }
}

TEST(GdnChunkFwd, Fp16AndStrongGates) {
  Shape s;
  s.T = 130;
  run_case({s, DType::f16, true, -1.f, {}, false}, 5);
  run_case({s, DType::f32, true, -20.f, {}, true}, 6);  // decays down to e^-20 per token
}

// The chunk kernels are built once per ISA (chunk_kernels.inc): each build this machine can run,
// on a varlen batch with l2norm, strong gates, an initial state and a chunk tail.
TEST(GdnChunkFwd, EveryIsaBuildOfTheChunkKernels) {
  using ot::cpu::Isa;
  for (Isa cap : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (cap != Isa::scalar && !ot::cpu::has(cap)) continue;
    ot::cpu::ScopedMaxIsa limit(cap);
    SCOPED_TRACE(ot::cpu::isa_name(cap));
    Shape p;
    p.B = 1, p.T = 150, p.HK = 1, p.HV = 2, p.DK = 24, p.DV = 40, p.packed = true;
    run_case({p, DType::f32, true, -4.f, {0, 70, 71, 150}, true}, 23);
  }
}

TEST(GdnChunkFwd, EveryLayout) {
  for (Layout l : {Layout::BTHD, Layout::BHTD}) {
    Shape s;
    s.B = 2, s.T = 80, s.layout = l;
    run_case({s, DType::f32, true, -1.f, {}, true}, 21);
    Shape p = s;  // packed varlen: TND / NTD
    p.B = 1, p.T = 150, p.packed = true;
    run_case({p, DType::bf16, true, -1.f, {0, 70, 71, 71, 150}, true}, 22);
  }
}

TEST(GdnChunkFwd, VarlenEqualsSeparateSequences) {
  // cu = [0, 70, 71, 71, 135]: a 1-token and a 0-token sequence; each sequence alone gives the same.
  Shape s;
  s.T = 135;
  std::vector<int64_t> cu = {0, 70, 71, 71, 135};
  Inputs in = make_inputs(s, DType::f32, 3);
  gdn::ChunkOptions opt;
  opt.output_final_state = true;
  Tensor cut = cu_tensor(cu);
  opt.cu_seqlens = cut;
  gdn::SeqInfo info = gdn::make_seq_info(1, s.T, cut);
  EXPECT_EQ(info.num_chunks(), 2 + 1 + 0 + 1);
  opt.seq = &info;
  gdn::ChunkFwd all = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, opt);
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    int64_t b = cu[n], L = cu[n + 1] - cu[n];
    gdn::ChunkOptions one;
    one.output_final_state = true;
    gdn::ChunkFwd r = gdn::chunk_gated_delta_rule_fwd(in.q.view().narrow(1, b, L), in.k.view().narrow(1, b, L), in.v.view().narrow(1, b, L),
                                                      in.g.view().narrow(1, b, L), in.beta.view().narrow(1, b, L), one);
    EXPECT_LT(rel_err(r.final_state, all.final_state.view().narrow(0, int64_t(n), 1)), 1e-6);
    if (L > 0) EXPECT_LT(rel_err(r.o, all.o.view().narrow(1, b, L)), 1e-6);
    else EXPECT_EQ(max_abs(all.final_state.view().narrow(0, int64_t(n), 1)), 0.0);
  }
}

TEST(GdnChunkFwd, PositiveGatesAreAllowed) {
  Shape s;
  s.T = 40;
  Inputs in = make_inputs(s, DType::f32, 8);
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.ptr<float>()[i] = 0.01f;
  gdn::ChunkFwd f = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta);
  gdn::ChunkFwd r = gdn::ref::recurrence(in.q, in.k, in.v, in.g, in.beta);
  EXPECT_LT(rel_err(f.o, r.o), 1e-4);
}

TEST(GdnStages, EachStageAgainstItsReference) {
  for (Layout l : {Layout::BTHD, Layout::BHTD}) {
    Shape s;
    s.B = 1, s.T = 150, s.layout = l, s.packed = true;
    Inputs in = make_inputs(s, DType::bf16, 31);
    Tensor cu = cu_tensor({0, 1, 100, 150});
    gdn::Common c;
    c.layout = l;
    c.cu_seqlens = cu;
    auto both = [&](auto fn) {
      auto f = fn();
      ot::cpu::ScopedForceRef force(true);
      return std::make_pair(f, fn());
    };
    auto G = both([&] { return gdn::chunk_local_cumsum(in.g, false, 1.f, c); });
    EXPECT_LT(rel_err(G.first, G.second), 1e-6);
    auto R = both([&] { return gdn::chunk_local_cumsum(in.g, true, 0.5f, c); });
    EXPECT_LT(rel_err(R.first, R.second), 1e-6);
    auto M = both([&] { return gdn::chunk_scaled_dot_kkt_fwd(in.k, G.second, in.beta, c); });
    EXPECT_LT(rel_err(M.first, M.second), 1e-5);
    auto A = both([&] { return gdn::solve_tril(M.second, c); });
    EXPECT_LT(rel_err(A.first, A.second), 1e-5);
    auto WU = both([&] { return gdn::recompute_w_u_fwd(in.k, in.v, in.beta, A.second, G.second, c); });
    EXPECT_LT(rel_err(WU.first.w, WU.second.w), 1e-5);
    EXPECT_LT(rel_err(WU.first.u, WU.second.u), 1e-5);
    auto H = both([&] { return gdn::chunk_gated_delta_rule_fwd_h(in.k, WU.second.w, WU.second.u, G.second, {}, true, c); });
    EXPECT_LT(rel_err(H.first.h, H.second.h), 1e-5);
    EXPECT_LT(rel_err(H.first.v_new, H.second.v_new), 1e-5);
    EXPECT_LT(rel_err(H.first.final_state, H.second.final_state), 1e-5);
    auto O = both([&] { return gdn::chunk_fwd_o(in.q, in.k, H.second.v_new, H.second.h, G.second, std::nullopt, c); });
    EXPECT_LT(rel_err(O.first, O.second), 1e-2);  // o in bf16
    // The stage chain is the chunked algorithm: it reproduces the token recurrence.
    gdn::ChunkOptions opt;
    opt.layout = l;
    opt.cu_seqlens = cu;
    opt.output_final_state = true;
    gdn::ChunkFwd rec = gdn::ref::recurrence(in.q, in.k, in.v, in.g, in.beta, opt);
    EXPECT_LT(rel_err(O.first, rec.o), 1e-2);
    EXPECT_LT(rel_err(H.first.final_state, rec.final_state), 1e-4);
  }
}

TEST(GdnStages, L2norm) {
  std::mt19937 rng(4);
  Tensor x = rand_tensor(rng, DType::f32, {3, 5, 2, 24}, -1.f, 1.f);
  gdn::L2Norm f = gdn::l2norm_fwd(x);
  gdn::L2Norm r;
  {
    ot::cpu::ScopedForceRef force(true);
    r = gdn::l2norm_fwd(x);
  }
  EXPECT_LT(rel_err(f.y, r.y), 1e-6);
  EXPECT_LT(rel_err(f.rstd, r.rstd), 1e-6);
  // Backward against central differences of sum(y * dy).
  Tensor dy = rand_tensor(rng, DType::f32, x.shape(), -1.f, 1.f);
  Tensor dx = gdn::l2norm_bwd(f.y, f.rstd, dy);
  Tensor x64 = Tensor::copy_of(x);
  for (int64_t i : {0, 7, 100, 239}) {
    auto loss = [&](float d) {
      Tensor xp = Tensor::copy_of(x);
      xp.ptr<float>()[i] += d;
      gdn::L2Norm y = gdn::l2norm_fwd(xp);
      double s = 0;
      for (int64_t j = 0; j < y.y.numel(); ++j) s += double(y.y.ptr<float>()[j]) * dy.ptr<float>()[j];
      return s;
    };
    double fd = (loss(1e-3f) - loss(-1e-3f)) / 2e-3;
    EXPECT_NEAR(dx.ptr<float>()[i], fd, 2e-3) << i;
  }
}

TEST(GdnChunkFwd, LargestHeadDims) {
  // DK = 256 (the limit) and DV = 200: scratch sizing of the chunk and recurrent paths.
  Shape s;
  s.T = 66, s.HK = 1, s.HV = 1, s.DK = 256, s.DV = 200;
  run_case({s, DType::f32, true, -1.f, {}, true}, 90);
  Inputs in = make_inputs(s, DType::f32, 91);
  gdn::RecurrentOut f = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, recurrent_opts(true));
  gdn::ChunkFwd r = recurrence_truth(in, true);
  EXPECT_LT(rel_err(f.o, r.o), 1e-5);
  EXPECT_LT(rel_err(f.final_state, r.final_state), 1e-5);
}

TEST(GdnChunkFwd, PooledOutputsAreNeverShared) {
  // Outputs >= 1 MiB come from a pool of earlier outputs: one still held is never handed out
  // again, one released is (same shape), and results do not depend on the buffer's history.
  Shape s;
  s.T = 512, s.HK = 4, s.HV = 8, s.DK = 32, s.DV = 128;  // o: 2 MiB fp32
  Inputs in1 = make_inputs(s, DType::f32, 41), in2 = make_inputs(s, DType::f32, 42);
  gdn::ChunkFwd a = gdn::chunk_gated_delta_rule_fwd(in1.q, in1.k, in1.v, in1.g, in1.beta);
  Tensor keep = Tensor::copy_of(a.o);
  gdn::ChunkFwd b = gdn::chunk_gated_delta_rule_fwd(in2.q, in2.k, in2.v, in2.g, in2.beta);
  EXPECT_NE(a.o.ptr<void>(), b.o.ptr<void>());
  EXPECT_EQ(rel_err(a.o, keep), 0.0);
  const void* pa = a.o.ptr<void>();
  a = {};
  gdn::ChunkFwd c = gdn::chunk_gated_delta_rule_fwd(in1.q, in1.k, in1.v, in1.g, in1.beta);
  EXPECT_EQ(c.o.ptr<void>(), pa);
  EXPECT_EQ(rel_err(c.o, keep), 0.0);
}

}  // namespace test_gdn_chunk
