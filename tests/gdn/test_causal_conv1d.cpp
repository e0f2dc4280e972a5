// causal_conv1d_fn and causal_conv1d_bwd against the fp64 reference (every ISA path, dtype, width,
// SiLU / bias / initial state on and off, fixed length and varlen with empty and 1-token sequences,
// strided inputs), and the reference's backward against fp64 finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "conv_test_util.h"

namespace test_causal_conv1d {
using namespace conv_test;
using ot::cpu::Isa;

namespace {

void check_fwd(const Case& c, uint32_t seed) {
  ConvIn in = make_conv(c, seed);
  RefFwd r = ref_fwd(c, in);
  for (Isa isa : isa_paths()) {
    ot::cpu::ScopedMaxIsa cap(isa);
    gdn::CausalConv1dOut o = gdn::causal_conv1d_fn(in.x, in.w, in.opt);
    ASSERT_EQ(o.y.view().shape(), in.x.view().shape());
    ASSERT_EQ(o.y.dtype(), c.dt);
    EXPECT_LT(rel_err(o.y, r.y), tol(c.dt)) << ot::cpu::isa_name(isa);
    // The final states are inputs copied (no arithmetic): exact in x's dtype.
    EXPECT_EQ(rel_err(o.final_states, r.fin), 0.0) << ot::cpu::isa_name(isa);
  }
  ot::cpu::ScopedForceRef ref(true);
  gdn::CausalConv1dOut o = gdn::causal_conv1d_fn(in.x, in.w, in.opt);
  EXPECT_LT(rel_err(o.y, r.y), tol(c.dt));
}

// Every width 2-4 with SiLU, bias and initial state each on and off: run(case, seed), seeds from `seed`.
template <class Run>
void each_option(uint32_t seed, Run run) {
  for (int64_t W : {2, 3, 4})
    for (bool silu : {true, false})
      for (bool bias : {true, false})
        for (bool init : {true, false}) {
          Case c;
          c.W = W, c.silu = silu, c.bias = bias, c.init = init;
          SCOPED_TRACE(testing::Message() << "W " << W << " silu " << silu << " bias " << bias << " init " << init);
          run(c, seed++);
        }
}

}  // namespace

TEST(CausalConv1d, ForwardWidthsActivationBias) {
  each_option(1, [](const Case& c, uint32_t seed) { check_fwd(c, seed); });
}

TEST(CausalConv1d, ForwardDtypes) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (DType sdt : {dt, DType::f32}) {
      Case c;
      c.dt = dt, c.state_dt = sdt, c.D = 130, c.T = 20;
      SCOPED_TRACE(testing::Message() << ot::dtype_name(dt) << " state " << ot::dtype_name(sdt));
      check_fwd(c, 11);
    }
}

TEST(CausalConv1d, ForwardVarlen) {
  // Empty sequences (first, middle, last), 1-token ones, ones shorter than W-1, long ones.
  for (std::vector<int64_t> cu : {std::vector<int64_t>{0, 0, 1, 1, 3, 40, 41, 41}, {0, 41}, {0, 1, 2, 3, 41}}) {
    for (int64_t W : {2, 4}) {
      Case c;
      c.B = 1, c.T = 41, c.D = 67, c.W = W, c.cu = cu;
      check_fwd(c, 21);
      c.init = false;
      check_fwd(c, 22);
    }
  }
}

TEST(CausalConv1d, ForwardEdgeShapes) {
  for (int64_t T : {0, 1, 2}) {
    Case c;
    c.T = T, c.D = 9;
    check_fwd(c, 31);
  }
  Case c;
  c.D = 1, c.T = 5;
  check_fwd(c, 32);
  c.D = 64, c.B = 3;
  check_fwd(c, 33);
  c.D = 0;
  check_fwd(c, 34);
  // Several channel blocks (the kernels take 256 channels a job), the last one partial.
  c.D = 600, c.T = 9, c.B = 2;
  check_fwd(c, 35);
  c.dt = DType::bf16, c.state_dt = DType::bf16;
  check_fwd(c, 36);
}

TEST(CausalConv1d, StridedInputs) {
  // x as a channel slice of a wider projection (row stride > D), and with the channels not
  // contiguous at all (a transposed view).
  Case c;
  c.D = 40, c.T = 13;
  ConvIn in = make_conv(c, 41);
  std::mt19937 rng(5);
  Tensor wide = rand_tensor(rng, DType::f32, {c.B, c.T, 3 * c.D}, -2.f, 2.f);
  TensorView xs = wide.view().narrow(2, c.D, c.D);
  Tensor xt_store = rand_tensor(rng, DType::f32, {c.B, c.D, c.T}, -2.f, 2.f);
  TensorView xt(xt_store.view().data, DType::f32, {c.B, c.T, c.D}, {c.D * c.T, 1, c.T});
  for (TensorView x : {xs, xt}) {
    gdn::CausalConv1dOut o = gdn::causal_conv1d_fn(x, in.w, in.opt);
    Tensor xc = Tensor::copy_of(x);
    gdn::CausalConv1dOut e = gdn::causal_conv1d_fn(xc, in.w, in.opt);
    EXPECT_EQ(rel_err(o.y, e.y), 0.0);
    EXPECT_EQ(rel_err(o.final_states, e.final_states), 0.0);
    Tensor dy = rand_tensor(rng, DType::f32, {c.B, c.T, c.D}, -1.f, 1.f);
    gdn::CausalConv1dGrads g = gdn::causal_conv1d_bwd(x, in.w, dy, in.opt), h = gdn::causal_conv1d_bwd(xc, in.w, dy, in.opt);
    EXPECT_EQ(rel_err(g.dx, h.dx), 0.0);
    EXPECT_EQ(rel_err(g.dweight, h.dweight), 0.0);
  }
}

namespace {

void check_bwd(const Case& c, uint32_t seed, bool with_dfin) {
  ConvIn in = make_conv(c, seed);
  std::mt19937 rng(seed + 100);
  Tensor dy = rand_tensor(rng, c.dt, {c.B, c.T, c.D}, -1.f, 1.f);
  Tensor dfin;
  if (with_dfin) dfin = rand_tensor(rng, DType::f32, {c.N(), c.D, c.W - 1}, -1.f, 1.f);
  Tensor dx = Tensor::zeros(DType::f32, {c.B, c.T, c.D}), dw = Tensor::zeros(DType::f32, {c.D, c.W});
  Tensor db = Tensor::zeros(DType::f32, {c.D}), ds0 = Tensor::zeros(DType::f32, {c.N(), c.D, c.W - 1});
  gdn::ref::causal_conv1d_bwd(in.x, in.w, in.b, in.s0, c.silu, starts(c), dy, dfin, dx, dw, c.bias ? db.view() : TensorView{},
                              c.init ? ds0.view() : TensorView{});
  for (Isa isa : isa_paths()) {
    ot::cpu::ScopedMaxIsa cap(isa);
    SCOPED_TRACE(ot::cpu::isa_name(isa));
    gdn::CausalConv1dGrads g = gdn::causal_conv1d_bwd(in.x, in.w, dy, in.opt, dfin);
    ASSERT_EQ(g.dx.dtype(), c.dt);
    EXPECT_LT(rel_err(g.dx, dx), tol(c.dt));
    EXPECT_LT(rel_err(g.dweight, dw), 1e-5);
    ASSERT_EQ(g.dbias.defined(), c.bias);
    if (c.bias) {
      EXPECT_LT(rel_err(g.dbias, db), 1e-5);
    }
    ASSERT_EQ(g.dinitial_states.defined(), c.init);
    if (c.init) {
      EXPECT_EQ(g.dinitial_states.dtype(), c.state_dt);
      EXPECT_LT(rel_err(g.dinitial_states, ds0), tol(c.state_dt));
    }
    // Deterministic: a second run is bit-identical.
    gdn::CausalConv1dGrads g2 = gdn::causal_conv1d_bwd(in.x, in.w, dy, in.opt, dfin);
    EXPECT_EQ(rel_err(g2.dx, g.dx), 0.0);
    EXPECT_EQ(rel_err(g2.dweight, g.dweight), 0.0);
  }
}

}  // namespace

TEST(CausalConv1d, BackwardVsReference) {
  each_option(50, [](const Case& c, uint32_t seed) { check_bwd(c, seed, c.init); });
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c;
    c.dt = dt, c.state_dt = dt, c.D = 100, c.T = 17;
    check_bwd(c, 70, true);
  }
  Case v;
  v.B = 1, v.T = 41, v.D = 67, v.cu = {0, 0, 1, 1, 3, 40, 41, 41};
  check_bwd(v, 71, true);
  check_bwd(v, 72, false);
  v.T = 0, v.cu = {0, 0};
  check_bwd(v, 73, true);
  Case wide;
  wide.D = 600, wide.T = 9;
  check_bwd(wide, 74, true);
}

namespace {

// Test-local fp64 loss of the conv: sum(y * gy) + sum(final * gf) over a varlen batch (B = 1).
struct Fd {
  int64_t T, D, W;
  std::vector<int64_t> cu;
  bool silu;
  std::vector<double> x, w, b, s0, gy, gf;
  double loss() const {
    double L = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const int64_t bos = cu[n], len = cu[n + 1] - cu[n];
      for (int64_t d = 0; d < D; ++d) {
        std::vector<double> s(size_t(W - 1 + len));
        for (int64_t j = 0; j < W - 1; ++j) s[size_t(j)] = s0[size_t((int64_t(n) * D + d) * (W - 1) + j)];
        for (int64_t t = 0; t < len; ++t) s[size_t(W - 1 + t)] = x[size_t((bos + t) * D + d)];
        for (int64_t t = 0; t < len; ++t) {
          double a = b[size_t(d)];
          for (int64_t k = 0; k < W; ++k) a += w[size_t(d * W + k)] * s[size_t(t + k)];
          if (silu) a = a / (1 + std::exp(-a));
          L += a * gy[size_t((bos + t) * D + d)];
        }
        for (int64_t j = 0; j < W - 1; ++j) L += s[size_t(len + j)] * gf[size_t((int64_t(n) * D + d) * (W - 1) + j)];
      }
    }
    return L;
  }
};

}  // namespace

TEST(CausalConv1d, BackwardFiniteDifferences) {
  for (bool silu : {true, false})
    for (int64_t W : {2, 4}) {
      Fd f{9, 5, W, {0, 2, 2, 3, 9}, silu, {}, {}, {}, {}, {}, {}};
      const int64_t N = int64_t(f.cu.size()) - 1;
      // Inputs representable in fp32, so the operator sees exactly what the fp64 loss sees.
      std::mt19937 rng(W + 10 * silu);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      auto fill = [&](std::vector<double>& v, int64_t n) {
        v.resize(size_t(n));
        for (double& e : v) e = double(u(rng));
      };
      fill(f.x, f.T * f.D), fill(f.w, f.D * W), fill(f.b, f.D), fill(f.s0, N * f.D * (W - 1));
      fill(f.gy, f.T * f.D), fill(f.gf, N * f.D * (W - 1));
      Tensor x = f32_tensor(f.x, {1, f.T, f.D}), w = f32_tensor(f.w, {f.D, W}), b = f32_tensor(f.b, {f.D});
      Tensor s0 = f32_tensor(f.s0, {N, f.D, W - 1}), gy = f32_tensor(f.gy, {1, f.T, f.D}), gf = f32_tensor(f.gf, {N, f.D, W - 1});
      Tensor cu = cu_tensor(f.cu);
      gdn::CausalConv1dOptions o;
      o.bias = b, o.initial_states = s0, o.cu_seqlens = cu, o.return_final_states = true;
      o.activation = silu ? gdn::Activation::silu : gdn::Activation::none;
      for (bool ref : {true, false}) {
        ot::cpu::ScopedForceRef fr(ref);
        SCOPED_TRACE(ref ? "reference" : "fast path");
        gdn::CausalConv1dGrads g = gdn::causal_conv1d_bwd(x, w, gy, o, gf);
        expect_fd(f, f.x, g.dx, 2e-5, "dx");
        expect_fd(f, f.w, g.dweight, 2e-5, "dweight");
        expect_fd(f, f.b, g.dbias, 2e-5, "dbias");
        expect_fd(f, f.s0, g.dinitial_states, 2e-5, "dinitial_states");
      }
    }
}

}  // namespace test_causal_conv1d
