// Numerical parity with flash-linear-attention's gated delta rule: the carried state's precision
// at long T, initial / final states in any float dtype, and gate gradients where the gates saturate
// or vanish. Metric: fla's ratio rms(ref - ours) / rms(ref) against the fp64 recurrence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gdn_bwd_test_util.h"
#include "gdn_test_util.h"
#include "ot/cpu.h"
#include "ot/gdn.h"
#include "ot/gdn_bwd.h"
#include "ot/trace.h"

namespace test_gdn_precision {
namespace {

using namespace gdn_test;
namespace gdn = ot::gdn;

// The kernel label the last chunk forward ran on (OT_LOG's name for it).
std::string chunk_kernel(const Inputs& in, const gdn::ChunkOptions& o) {
  ot::trace::set_timeline(true);
  ot::trace::take_events();
  gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, o);
  std::string k;
  for (auto& e : ot::trace::take_events())
    if (e.name == "chunk_gated_delta_rule_fwd") k = e.kernel;
  ot::trace::set_timeline(false);
  return k;
}

Tensor as_dtype(const Tensor& x, DType dt) {
  Tensor r = Tensor::empty(dt, x.shape());
  ot::copy_into(x.view(), r.view());
  return r;
}

// bf16 q, k, v over 64 chunks with slow decay (long memory: the state's rounding would accumulate).
TEST(GdnPrecision, Bf16ChunkStateAtT4096) {
  Shape s;
  s.B = 1, s.T = 4096, s.HK = 1, s.HV = 2, s.DK = 64, s.DV = 64;
  Inputs in = make_inputs(s, DType::bf16, 39, -0.05f);
  gdn::ChunkFwd want = recurrence_truth(in, true);
  gdn::ChunkOptions o;
  o.use_qk_l2norm_in_kernel = true;
  o.output_final_state = true;
  o.save_for_backward = false;
  using ot::cpu::Isa;
  for (Isa cap : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (cap != Isa::scalar && !ot::cpu::has(cap)) continue;
    ot::cpu::ScopedMaxIsa limit(cap);
    const std::string kernel = chunk_kernel(in, o);
    SCOPED_TRACE(std::string(ot::cpu::isa_name(cap)) + " " + kernel);
    gdn::ChunkFwd got = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, o);
    const double ht = rel_rms(got.final_state, want.final_state), out = rel_rms(got.o, want.o);
    std::printf("bf16 T=4096 %s (%s): ht ratio %.3g, o ratio %.3g\n", ot::cpu::isa_name(cap), kernel.c_str(), ht, out);
    // o is rounded to bf16 on output (2^-9 relative, rms ~1.1e-3); the state is fp32 throughout.
    EXPECT_LT(ht, 1e-3);
    EXPECT_LT(out, 3e-3);
  }
}

// initial_state in bf16 / fp16 is the same as its exact fp32 widening; the final state comes back
// in fp32 or in the dtype asked for (the fp32 result rounded once).
TEST(GdnPrecision, StateDtypes) {
  Shape s;
  s.B = 2, s.T = 70, s.HK = 1, s.HV = 2, s.DK = 32, s.DV = 32;
  Inputs in = make_inputs(s, DType::f32, 5);
  std::mt19937 rng(6);
  Tensor S0 = rand_tensor(rng, DType::f32, {2, 2, 32, 32}, -0.5f, 0.5f);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(ot::dtype_name(dt));
    Tensor low = as_dtype(S0, dt), wide = as_dtype(low, DType::f32);
    gdn::ChunkOptions a;
    a.output_final_state = true;
    a.initial_state = wide;
    gdn::ChunkFwd want = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, a);
    a.initial_state = low;
    gdn::ChunkFwd got = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, a);
    EXPECT_EQ(got.final_state.dtype(), DType::f32);
    EXPECT_EQ(rel_err(got.o, want.o), 0.0);
    EXPECT_EQ(rel_err(got.final_state, want.final_state), 0.0);
    a.final_state_dtype = dt;
    gdn::ChunkFwd rounded = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, a);
    EXPECT_EQ(rounded.final_state.dtype(), dt);
    EXPECT_EQ(rel_err(rounded.final_state, as_dtype(want.final_state, dt)), 0.0);

    gdn::RecurrentOptions r = recurrent_opts(false, wide);
    gdn::RecurrentOut rw = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r);
    r.initial_state = low;
    r.final_state_dtype = dt;
    gdn::RecurrentOut rl = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r);
    EXPECT_EQ(rel_err(rl.o, rw.o), 0.0);
    EXPECT_EQ(rl.final_state.dtype(), dt);
    EXPECT_EQ(rel_err(rl.final_state, as_dtype(rw.final_state, dt)), 0.0);

    // The backward reads the low-precision initial state the same way; dh0 is fp32.
    Tensor dO = rand_tensor(rng, DType::f32, in.v.shape(), -1.f, 1.f);
    gdn::ChunkOptions f;
    f.initial_state = wide;
    gdn::ChunkFwd fw = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
    gdn::ChunkBwdOptions b;
    b.initial_state = wide;
    b.A = fw.A;
    gdn::ChunkBwd gw = gdn::chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fw.g_cumsum, in.beta, dO, b);
    b.initial_state = low;
    gdn::ChunkBwd gl = gdn::chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fw.g_cumsum, in.beta, dO, b);
    EXPECT_EQ(gl.dh0.dtype(), DType::f32);
    expect_grads_close(gl, gw, 1e-12, "low-precision initial state");
  }
  gdn::ChunkOptions bad;
  Tensor i32 = Tensor::zeros(DType::i32, {2, 2, 32, 32});
  bad.initial_state = i32;
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, bad); }, "initial_state");
  gdn::ChunkOptions badf;
  badf.output_final_state = true;
  badf.final_state_dtype = DType::i32;
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, badf); }, "final_state_dtype");
  gdn::RecurrentOptions badr = recurrent_opts(false, i32);
  expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, badr); }, "initial_state");
}

// dg and dbeta against the fp64 BPTT of the token recurrence (itself checked against finite
// differences in test_gdn_bwd_ref.cpp) with gates that saturate (decay 1e-13..1e-35 per token: the
// true dg is ~1e-14 and below, so the error must be absolutely tiny) or vanish (|g| <= 1e-6:
// e^G ~ 1, dg O(1..10) and summed from O(1) terms, so fp32 rounding relative to the largest dg).
struct GateCase {
  float lo, hi;
  const char* name;
  double abs, rel;  // allowed error per element of dg and dbeta: abs + rel * max |true|
};
void check_gate_grads(const GateCase& gc, bool l2, unsigned seed) {
  SCOPED_TRACE(std::string(gc.name) + (l2 ? " l2norm" : ""));
  Shape s;
  s.B = 1, s.T = 150, s.HK = 1, s.HV = 2, s.DK = 32, s.DV = 32, s.packed = true;
  Inputs in = make_inputs(s, DType::f32, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> u(gc.lo, gc.hi);
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.ptr<float>()[i] = u(rng);
  Tensor cu = cu_tensor({0, 1, 70, 150});
  Tensor S0 = rand_tensor(rng, DType::f32, {3, 2, 32, 32}, -1.f, 1.f), dht = rand_tensor(rng, DType::f32, {3, 2, 32, 32}, -1.f, 1.f);
  Tensor dO = rand_tensor(rng, DType::f32, in.v.shape(), -1.f, 1.f);
  gdn::ChunkOptions f;
  f.cu_seqlens = cu, f.initial_state = S0, f.use_qk_l2norm_in_kernel = l2;
  gdn::ChunkFwd fw = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
  gdn::ChunkBwdOptions b;
  b.cu_seqlens = cu, b.initial_state = S0, b.dht = dht, b.use_qk_l2norm_in_kernel = l2;
  gdn::ChunkBwd want = gdn::ref::recurrence_bwd(in.q, in.k, in.v, in.g, in.beta, dO, b);
  b.A = fw.A;
  gdn::ChunkBwd got = gdn::chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fw.g_cumsum, in.beta, dO, b);
  const double dg_max = max_abs(want.dg), db_max = max_abs(want.dbeta);
  double dg_err = 0, db_err = 0;
  for (int64_t i = 0; i < got.dg.numel(); ++i) {
    double w = ot::get_as_double(want.dg, i), e = std::fabs(ot::get_as_double(got.dg, i) - w);
    dg_err = std::max(dg_err, e);
    EXPECT_LE(e, gc.abs + gc.rel * dg_max) << "dg[" << i << "] = " << w;
    double wb = ot::get_as_double(want.dbeta, i), eb = std::fabs(ot::get_as_double(got.dbeta, i) - wb);
    db_err = std::max(db_err, eb);
    EXPECT_LE(eb, 1e-6 + 2e-6 * db_max) << "dbeta[" << i << "] = " << wb;
  }
  std::printf("%s%s: max |dg| %.3g, max dg error %.3g, max |dbeta| %.3g, max dbeta error %.3g\n", gc.name, l2 ? " l2" : "", dg_max,
              dg_err, db_max, db_err);
  // The other gradients as in test_gdn_bwd.cpp; dg's ratio is over values of ~1e-14 at saturation
  // (fp32 relative rounding of tiny products, ~3e-5), its absolute error is checked above.
  expect_grads_close(got, want, 1e-4, "fp32 chunked vs fp64 recurrence");
}

// Saturated: dg within 1e-12 (the issue asks 1e-6; measured ~1e-18). q . dq - k . dk with the
// cancelling O(1) pairs left in gave 1.8e-7 here (DK = DV = 32) and 1.5e-6 in fla's D = 100 case.
TEST(GdnPrecision, GateGradientsAtSaturatedGates) {
  check_gate_grads({-80.f, -30.f, "log-gates in [-80, -30]", 1e-12, 0.0}, false, 1);
  check_gate_grads({-80.f, -30.f, "log-gates in [-80, -30]", 1e-12, 0.0}, true, 2);
}

TEST(GdnPrecision, GateGradientsAtNearZeroGates) {
  check_gate_grads({-1e-6f, 0.f, "log-gates in [-1e-6, 0]", 1e-6, 2e-6}, false, 3);
  check_gate_grads({-1e-6f, 0.f, "log-gates in [-1e-6, 0]", 1e-6, 2e-6}, true, 4);
}

}  // namespace

}  // namespace test_gdn_precision
