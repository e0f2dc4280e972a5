// rms_norm_gated and its backward against the fp64 reference (every ISA path, norm before / after
// the gate, groups of part and whole vectors (and 192: the AVX-512 gates' 8-vector lockstep and its tail), fp32/bf16/fp16 in and out, rows 0/1/many, N not a multiple of 8, strided x),
// the reference's backward against fp64 finite differences, and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "conv_test_util.h"
#include "src/core/knobs.h"

namespace test_rms_norm_gated {
using namespace conv_test;
using ot::cpu::Isa;

namespace {

struct NCase {
  std::vector<int64_t> shape{5, 3, 64};
  int64_t group = 0;
  bool nbg = true;
  DType xdt = DType::f32, zdt = DType::f32, wdt = DType::f32;
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
    return r;
  }
  int64_t N() const { return shape.back(); }
  int64_t G() const { return group == 0 ? N() : group; }
};
struct NIn {
  Tensor x, z, w, dy;
  gdn::RmsNormGatedOptions o;
};
NIn make_norm(const NCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  NIn in;
  in.x = rand_tensor(rng, c.xdt, c.shape, -2.f, 2.f);
  in.z = rand_tensor(rng, c.zdt, c.shape, -3.f, 3.f);
  in.w = rand_tensor(rng, c.wdt, {c.N()}, 0.5f, 1.5f);
  in.dy = rand_tensor(rng, c.xdt, c.shape, -1.f, 1.f);
  in.o.group_size = c.group, in.o.norm_before_gate = c.nbg, in.o.eps = 1e-5f;
  return in;
}
TensorView rows_of(const TensorView& v, int64_t rows, int64_t N) { return TensorView(v.data, v.dtype, {rows, N}); }

void check(const NCase& c, uint32_t seed) {
  NIn in = make_norm(c, seed);
  const int64_t R = c.rows(), N = c.N(), NG = N == 0 ? 0 : N / c.G();
  Tensor y = Tensor::zeros(DType::f32, c.shape), rstd = Tensor::zeros(DType::f32, {R, NG});
  Tensor dx = Tensor::zeros(DType::f32, c.shape), dz = Tensor::zeros(DType::f32, c.shape), dw = Tensor::zeros(DType::f32, {N});
  if (R * N > 0) {
    gdn::ref::rms_norm_gated(rows_of(in.x, R, N), rows_of(in.z, R, N), in.w, in.o.eps, c.nbg, c.G(), rows_of(y, R, N), rstd);
    gdn::ref::rms_norm_gated_bwd(rows_of(in.dy, R, N), rows_of(in.x, R, N), rows_of(in.z, R, N), in.w, in.o.eps, c.nbg, c.G(),
                                 rows_of(dx, R, N), rows_of(dz, R, N), dw);
  }
  for (Isa isa : isa_paths()) {
    ot::cpu::ScopedMaxIsa cap(isa);
    SCOPED_TRACE(ot::cpu::isa_name(isa));
    gdn::RmsNormGatedOut o = gdn::rms_norm_gated(in.x, in.z, in.w, in.o);
    ASSERT_EQ(o.y.shape(), c.shape);
    ASSERT_EQ(o.y.dtype(), c.xdt);
    ASSERT_EQ(o.rstd.shape(), (std::vector<int64_t>{R, NG}));
    EXPECT_LT(rel_err(o.y, y), tol(c.xdt));
    EXPECT_LT(rel_err(o.rstd, rstd), 2e-6);
    for (bool given : {true, false}) {
      gdn::RmsNormGatedGrads g = gdn::rms_norm_gated_bwd(in.dy, in.x, in.z, in.w, given ? o.rstd.view() : TensorView{}, in.o);
      ASSERT_EQ(g.dx.dtype(), c.xdt);
      ASSERT_EQ(g.dz.dtype(), c.zdt);
      // The input's rounding to bf16 / fp16 is amplified by the normalisation's cancellation; with
      // one value per group, du = rstd gu (1 - uh^2) is all cancellation (1 - uh^2 ~ eps / u^2).
      const bool one = c.G() == 1;
      EXPECT_LT(rel_err(g.dx, dx), one ? 1e-2 : 2 * tol(c.xdt)) << given;
      EXPECT_LT(rel_err(g.dz, dz), one ? 1e-2 : 2 * tol(c.zdt)) << given;
      EXPECT_LT(rel_err(g.dweight, dw), c.xdt == DType::f32 ? 1e-5 : 1e-3) << given;
      gdn::RmsNormGatedGrads g2 = gdn::rms_norm_gated_bwd(in.dy, in.x, in.z, in.w, given ? o.rstd.view() : TensorView{}, in.o);
      EXPECT_EQ(rel_err(g2.dweight, g.dweight), 0.0);
    }
  }
}

}  // namespace

TEST(RmsNormGated, ShapesGroupsGateOrder) {
  uint32_t seed = 1;
  for (bool nbg : {true, false})
    for (std::vector<int64_t> shape : {std::vector<int64_t>{5, 3, 64}, {1, 128}, {4, 192}, {3, 256}, {130, 5}, {7, 1}, {0, 16}, {3, 0}, {200, 24}, {96}}) {
      NCase c;
      c.shape = shape, c.nbg = nbg;
      SCOPED_TRACE(testing::Message() << "N " << shape.back() << " nbg " << nbg);
      check(c, seed++);
      // Groups of part vectors (8), of whole AVX-512 vectors (16), and the 64 / 128 that it holds in registers.
      for (int64_t g : {8, 16, 64, 128})
        if (shape.back() % g == 0 && shape.back() > g) {
          c.group = g;
          check(c, seed++);
        }
    }
}

// The AVX-512 forward holds groups of 64 and 128 channels in registers (norm before gate, gates in
// lockstep): the same operations as its general loop (lockstep off), so the same bits.
TEST(RmsNormGated, RegisterGroupsEqualTheLoop) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t g : {64, 128}) {
      NCase c;
      c.shape = {70, 512}, c.group = g, c.xdt = c.zdt = dt;
      NIn in = make_norm(c, uint32_t(g));
      gdn::RmsNormGatedOut held = gdn::rms_norm_gated(in.x, in.z, in.w, in.o), loop;
      {
        ot::knobs::ScopedKnob off("norm.gate_lockstep", 0);
        loop = gdn::rms_norm_gated(in.x, in.z, in.w, in.o);
      }
      SCOPED_TRACE(testing::Message() << ot::dtype_name(dt) << " group " << g);
      EXPECT_EQ(std::memcmp(held.y.view().data, loop.y.view().data, held.y.view().nbytes()), 0);
      EXPECT_EQ(std::memcmp(held.rstd.view().data, loop.rstd.view().data, held.rstd.view().nbytes()), 0);
    }
}

TEST(RmsNormGated, Dtypes) {
  for (DType xdt : {DType::f32, DType::bf16, DType::f16})
    for (DType zdt : {xdt, DType::f32})
      for (DType wdt : {DType::f32, DType::bf16}) {
        NCase c;
        c.shape = {70, 128}, c.xdt = xdt, c.zdt = zdt, c.wdt = wdt;
        SCOPED_TRACE(testing::Message() << ot::dtype_name(xdt) << " z " << ot::dtype_name(zdt) << " w " << ot::dtype_name(wdt));
        check(c, 40);
      }
}

TEST(RmsNormGated, StridedInputs) {
  // x and z as head slices of wider rows ([T, H, 2 D] -> [T, H, D]) and as a transposed view.
  std::mt19937 rng(3);
  Tensor wide = rand_tensor(rng, DType::bf16, {9, 4, 64}, -2.f, 2.f), zw = rand_tensor(rng, DType::bf16, {9, 4, 64}, -2.f, 2.f);
  Tensor w = rand_tensor(rng, DType::f32, {32}, 0.5f, 1.5f), dy = rand_tensor(rng, DType::bf16, {9, 4, 32}, -1.f, 1.f);
  TensorView x = wide.view().narrow(2, 32, 32), z = zw.view().narrow(2, 0, 32);
  TensorView xt(wide.view().data, DType::bf16, {4, 9, 32}, {64, 256, 1});  // [H, T, D] of the first half
  for (TensorView xv : {x, xt}) {
    TensorView zv = xv.sizes[0] == 9 ? z : TensorView(zw.view().data, DType::bf16, {4, 9, 32}, {64, 256, 1});
    Tensor xc = Tensor::copy_of(xv), zc = Tensor::copy_of(zv);
    gdn::RmsNormGatedOut a = gdn::rms_norm_gated(xv, zv, w), b = gdn::rms_norm_gated(xc, zc, w);
    EXPECT_EQ(rel_err(a.y, b.y), 0.0);
    TensorView dyv(dy.view().data, DType::bf16, xv.shape());
    gdn::RmsNormGatedGrads ga = gdn::rms_norm_gated_bwd(dyv, xv, zv, w, a.rstd), gb = gdn::rms_norm_gated_bwd(dyv, xc, zc, w, b.rstd);
    EXPECT_EQ(rel_err(ga.dx, gb.dx), 0.0);
    EXPECT_EQ(rel_err(ga.dz, gb.dz), 0.0);
    EXPECT_EQ(rel_err(ga.dweight, gb.dweight), 0.0);
  }
}

namespace {

// Test-local fp64 loss sum(y * gy) of one row set, with the formulas of ot/gdn_layer.h.
struct NormFd {
  int64_t R, N, G;
  bool nbg;
  double eps;
  std::vector<double> x, z, w, gy;
  double loss() const {
    double L = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g0 = 0; g0 < N; g0 += G) {
        std::vector<double> u(static_cast<size_t>(G));
        double ss = 0;
        for (int64_t i = 0; i < G; ++i) {
          const double zi = z[size_t(r * N + g0 + i)], sz = zi / (1 + std::exp(-zi));
          u[size_t(i)] = x[size_t(r * N + g0 + i)] * (nbg ? 1.0 : sz);
          ss += u[size_t(i)] * u[size_t(i)];
        }
        const double rs = 1 / std::sqrt(ss / double(G) + eps);
        for (int64_t i = 0; i < G; ++i) {
          const double zi = z[size_t(r * N + g0 + i)], sz = zi / (1 + std::exp(-zi));
          L += u[size_t(i)] * rs * w[size_t(g0 + i)] * (nbg ? sz : 1.0) * gy[size_t(r * N + g0 + i)];
        }
      }
    return L;
  }
};

}  // namespace

TEST(RmsNormGated, BackwardFiniteDifferences) {
  for (bool nbg : {true, false})
    for (int64_t G : {12, 4}) {
      NormFd f{3, 12, G, nbg, 1e-5, {}, {}, {}, {}};
      std::mt19937 rng(uint32_t(G + nbg));
      std::uniform_real_distribution<float> u(-1.5f, 1.5f);
      auto fill = [&](std::vector<double>& v, int64_t n, float shift) {
        v.resize(size_t(n));
        for (double& e : v) e = double(u(rng) + shift);
      };
      fill(f.x, f.R * f.N, 0.f), fill(f.z, f.R * f.N, 0.f), fill(f.w, f.N, 1.5f), fill(f.gy, f.R * f.N, 0.f);
      Tensor x = f32_tensor(f.x, {f.R, f.N}), z = f32_tensor(f.z, {f.R, f.N}), w = f32_tensor(f.w, {f.N}), gy = f32_tensor(f.gy, {f.R, f.N});
      gdn::RmsNormGatedOptions o;
      o.eps = 1e-5f, o.norm_before_gate = nbg, o.group_size = G == f.N ? 0 : G;
      for (bool ref : {true, false}) {
        ot::cpu::ScopedForceRef fr(ref);
        SCOPED_TRACE(testing::Message() << (ref ? "reference" : "fast path") << " nbg " << nbg << " G " << G);
        gdn::RmsNormGatedGrads g = gdn::rms_norm_gated_bwd(gy, x, z, w, {}, o);
        expect_fd(f, f.x, g.dx, 5e-5, "dx");
        expect_fd(f, f.z, g.dz, 5e-5, "dz");
        expect_fd(f, f.w, g.dweight, 5e-5, "dweight");
      }
    }
}

TEST(RmsNormGated, Errors) {
  NCase c;
  c.shape = {4, 16};
  NIn in = make_norm(c, 5);
  Tensor z_bad = Tensor::zeros(DType::f32, {4, 15}), w_bad = Tensor::zeros(DType::f32, {15}), xi = Tensor::zeros(DType::i32, {4, 16});
  expect_error([&] { gdn::rms_norm_gated(in.x, z_bad, in.w); }, "z", "rms_norm_gated");
  expect_error([&] { gdn::rms_norm_gated(in.x, in.z, w_bad); }, "weight");
  expect_error([&] { gdn::rms_norm_gated(xi, xi, in.w); }, "x");
  gdn::RmsNormGatedOptions o;
  o.group_size = 5;
  expect_error([&] { gdn::rms_norm_gated(in.x, in.z, in.w, o); }, "group_size");
  o.group_size = -1;
  expect_error([&] { gdn::rms_norm_gated(in.x, in.z, in.w, o); }, "group_size");
  o = {};
  o.eps = -1.f;
  expect_error([&] { gdn::rms_norm_gated(in.x, in.z, in.w, o); }, "eps");
  Tensor dy_bad = Tensor::zeros(DType::f32, {3, 16}), rstd_bad = Tensor::zeros(DType::f32, {4, 2});
  expect_error([&] { gdn::rms_norm_gated_bwd(dy_bad, in.x, in.z, in.w, {}); }, "dy", "rms_norm_gated_bwd");
  expect_error([&] { gdn::rms_norm_gated_bwd(in.dy, in.x, in.z, in.w, rstd_bad); }, "rstd");
}

}  // namespace test_rms_norm_gated
