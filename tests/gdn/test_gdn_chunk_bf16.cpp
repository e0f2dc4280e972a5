// The bf16-compute chunk forward (bf16 q/k/v, head dims multiples of 32, AVX512-BF16) against
// the fp64 token recurrence, and against the fp32-compute path of the same inputs; both forms of
// its products (vdpbf16ps, and bf16 widened to fp32 FMAs), whichever this CPU would choose.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "gdn_test_util.h"
#include "ot/cpu.h"
#include "ot/trace.h"
#include "src/core/knobs.h"

namespace test_gdn_chunk_bf16 {
using namespace gdn_test;
namespace gdn = ot::gdn;

namespace {

struct Bf16Case {
  Shape s;
  bool l2;
  float gmin;
  std::vector<int64_t> cu;
  bool init;
};

// Errors measured on these inputs (OT_TEST_VERBOSE=1 prints them): o 2-3.4e-3 (bf16 output
// rounding included), final state 0.5-3.1e-3 (operands rounded to bf16 every chunk). A wrong
// term gives O(1) errors; the bounds sit ~3x above the measured values.
void run_bf16(const Bf16Case& c, uint32_t seed) {
  ChunkCase cc = make_chunk_case(c.s, DType::bf16, c.l2, c.gmin, c.cu, c.init, seed);
  const Inputs& in = cc.in;
  gdn::ChunkOptions& opt = cc.opt;  // switched to fp32 compute below
  gdn::ChunkFwd fast = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, opt);
  gdn::ChunkFwd ref = gdn::ref::recurrence(in.q, in.k, in.v, in.g, in.beta, opt);
  double eo = rel_err(fast.o, ref.o), es = rel_err(fast.final_state, ref.final_state);
  if (std::getenv("OT_TEST_VERBOSE")) std::printf("bf16 compute: o %.2e, final state %.2e\n", eo, es);
  EXPECT_LT(eo, 1e-2) << "o";
  EXPECT_LT(es, 8e-3) << "final state";
  // A, G and the norms are computed in fp32 from the exact bf16 inputs: as tight as the fp32 path.
  opt.bf16_compute = false;
  gdn::ChunkFwd f32 = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, opt);
  EXPECT_LT(rel_err(fast.A, f32.A), 1e-5);
  EXPECT_LT(rel_err(fast.g_cumsum, f32.g_cumsum), 1e-6);
  if (c.l2) {
    EXPECT_LT(rel_err(fast.k_rstd, f32.k_rstd), 1e-6);
  }
  EXPECT_LT(rel_err(f32.final_state, ref.final_state), 2e-4);
}

bool have_bf16() { return ot::cpu::has(ot::cpu::Isa::avx512_bf16); }

// fn() once per form of the products: the knob the GEMM's bf16 kernel choice reads (1: vdpbf16ps,
// 2: widening), restored after.
template <class Fn>
void for_each_product(Fn&& fn) {
  const int64_t prev = ot::knobs::get("gemm.bf16_kernel");
  for (int form : {1, 2}) {
    SCOPED_TRACE(form == 1 ? "vdpbf16ps" : "widening");
    ot::knobs::set("gemm.bf16_kernel", form);
    fn(form);
  }
  ot::knobs::set("gemm.bf16_kernel", prev);
}

}  // namespace

TEST(GdnChunkBf16, TakesTheBf16Path) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  Shape s;
  s.T = 70, s.HK = 1, s.HV = 2, s.DK = 64, s.DV = 32;
  Inputs in = make_inputs(s, DType::bf16, 1);
  for_each_product([&](int form) {
    ot::trace::set_timeline(true);
    ot::trace::take_events();
    gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta);
    gdn::ChunkOptions f32;
    f32.bf16_compute = false;
    gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f32);
    std::vector<ot::trace::Event> ev;
    for (auto& e : ot::trace::take_events())
      if (e.name == "chunk_gated_delta_rule_fwd") ev.push_back(e);
    ot::trace::set_timeline(false);
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].kernel, form == 1 ? "gdn_chunk:avx512_bf16" : "gdn_chunk:avx512_bf16_widen");
    EXPECT_EQ(ev[1].kernel.rfind("gdn_chunk:", 0), std::string::npos);
  });
}

TEST(GdnChunkBf16, LengthsAroundTheChunk) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  for_each_product([](int) {
    for (int64_t T : {1, 63, 64, 65, 200}) {
      Shape s;
      s.T = T, s.HK = 1, s.HV = 2, s.DK = 64, s.DV = 64;
      SCOPED_TRACE(T);
      run_bf16({s, true, -1.f, {}, T % 2 == 1}, uint32_t(T));
    }
  });
}

TEST(GdnChunkBf16, LongSequenceQwenDims) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  Shape s;
  s.T = 1000, s.HK = 1, s.HV = 2, s.DK = 128, s.DV = 128;
  for_each_product([&](int) { run_bf16({s, true, -0.5f, {}, true}, 11); });
}

TEST(GdnChunkBf16, GroupsDimsGates) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  for_each_product([](int) {
    uint32_t seed = 200;
    for (int G : {1, 2, 4})
      for (bool l2 : {false, true}) {
        Shape s;
        s.B = 2, s.T = 130, s.HK = 2, s.HV = 2 * G, s.DK = G == 2 ? 128 : 32, s.DV = G == 2 ? 64 : 96;
        SCOPED_TRACE(testing::Message() << "G=" << G << " l2=" << l2);
        run_bf16({s, l2, G == 4 ? -20.f : -1.f, {}, true}, seed++);
      }
  });
}

TEST(GdnChunkBf16, EveryLayoutAndVarlen) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  for_each_product([](int) {
    for (Layout l : {Layout::BTHD, Layout::BHTD}) {
      Shape s;
      s.B = 2, s.T = 80, s.HK = 2, s.HV = 4, s.DK = 64, s.DV = 32, s.layout = l;
      run_bf16({s, true, -1.f, {}, true}, 21);
      Shape p = s;
      p.B = 1, p.T = 150, p.packed = true;
      run_bf16({p, true, -1.f, {0, 70, 71, 71, 150}, true}, 22);
    }
  });
}

// Found by fuzz_gdn_chunk (clang UBSan): the fused task measured its scratch by carving it from a
// null base, i.e. offsets applied to a null pointer (UB; GCC's UBSan does not flag a null base, so
// only the fuzz preset saw it). The smallest shape of the path, both product forms, one token.
TEST(FuzzRegressions, GdnChunkBf16ScratchMeasuredFromNullBase) {
  if (!have_bf16()) GTEST_SKIP() << "no AVX512-BF16";
  for_each_product([](int) {
    Shape s;
    s.T = 1, s.HK = 1, s.HV = 1, s.DK = 32, s.DV = 32;
    run_bf16({s, false, -1.f, {}, false}, 7);
  });
}

}  // namespace test_gdn_chunk_bf16
