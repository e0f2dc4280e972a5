// rms_norm, add_rms_norm and rms_norm_bwd (ot/norm.h) against the fp64 reference on every ISA path:
// fp32 / bf16 / fp16, rows 0 / 1 / many, N not a multiple of 16 (the AVX-512 tails) or below it,
// strided x; add_rms_norm bit-identical to rms_norm of its x_sum; the backward with and without the
// forward's rstd (the same bits), with dx_extra, deterministic dweight; fp64 finite differences of
// the fast path and the reference; bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "conv_test_util.h"
#include "ot/norm.h"
#include "src/ref/rms_norm_ref.h"

namespace test_rms_norm {
using namespace conv_test;
using ot::cpu::Isa;

namespace {

int64_t rows_of(const std::vector<int64_t>& s) {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}
TensorView as2d(const TensorView& v, int64_t R, int64_t N) { return TensorView(v.data, v.dtype, {R, N}); }
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.view().nbytes() == b.view().nbytes() && std::memcmp(a.view().data, b.view().data, a.view().nbytes()) == 0;
}

void check(const std::vector<int64_t>& shape, DType dt, DType wdt, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t R = rows_of(shape), N = shape.back();
  Tensor x = rand_tensor(rng, dt, shape, -2.f, 2.f), x2 = rand_tensor(rng, dt, shape, -1.f, 1.f);
  Tensor w = rand_tensor(rng, wdt, {N}, 0.5f, 1.5f), dy = rand_tensor(rng, dt, shape, -1.f, 1.f), ex = rand_tensor(rng, dt, shape, -1.f, 1.f);
  const float eps = 1e-5f;
  Tensor y = Tensor::zeros(DType::f32, shape), rstd = Tensor::zeros(DType::f32, {R}), xs = Tensor::zeros(dt, shape);
  Tensor ya = Tensor::zeros(DType::f32, shape), rstda = Tensor::zeros(DType::f32, {R});
  Tensor dx = Tensor::zeros(DType::f32, shape), dxe = Tensor::zeros(DType::f32, shape), dw = Tensor::zeros(DType::f32, {N});
  if (R * N > 0) {
    ot::ref::rms_norm(as2d(x, R, N), {}, w, eps, {}, as2d(y, R, N), rstd);
    ot::ref::rms_norm(as2d(x, R, N), as2d(x2, R, N), w, eps, as2d(xs, R, N), as2d(ya, R, N), rstda);
    ot::ref::rms_norm_bwd(as2d(dy, R, N), as2d(x, R, N), w, eps, {}, as2d(dx, R, N), dw);
    ot::ref::rms_norm_bwd(as2d(dy, R, N), as2d(x, R, N), w, eps, as2d(ex, R, N), as2d(dxe, R, N), dw);
  }
  if (N == 0)
    for (int64_t r = 0; r < R; ++r) rstd.ptr<float>()[r] = rstda.ptr<float>()[r] = 1.f / std::sqrt(eps);
  // One value a row: dx = rstd g (1 - xh^2) is all cancellation (1 - xh^2 ~ eps / x^2).
  const double dx_tol = N == 1 ? 1e-2 : 2 * tol(dt);
  for (Isa isa : isa_paths()) {
    ot::cpu::ScopedMaxIsa cap(isa);
    SCOPED_TRACE(testing::Message() << ot::cpu::isa_name(isa) << " " << ot::dtype_name(dt) << " N " << N);
    ot::RmsNormOut o = ot::rms_norm(x, w, eps);
    ASSERT_EQ(o.y.shape(), shape);
    ASSERT_EQ(o.y.dtype(), dt);
    ASSERT_EQ(o.rstd.shape(), (std::vector<int64_t>{R}));
    EXPECT_LT(rel_err(o.y, y), tol(dt));
    EXPECT_LT(rel_err(o.rstd, rstd), 2e-6);
    ot::RmsNormOut a = ot::add_rms_norm(x, x2, w, eps);
    EXPECT_LT(rel_err(a.x_sum, xs), tol(dt));
    EXPECT_LT(rel_err(a.y, ya), tol(dt));
    ot::RmsNormOut b = ot::rms_norm(a.x_sum, w, eps);  // the fused form is the two calls, bit for bit
    EXPECT_TRUE(same_bits(a.y, b.y));
    EXPECT_TRUE(same_bits(a.rstd, b.rstd));
    ot::RmsNormGrads given = ot::rms_norm_bwd(dy, x, w, o.rstd, eps), again = ot::rms_norm_bwd(dy, x, w, {}, eps);
    ASSERT_EQ(given.dx.dtype(), dt);
    EXPECT_LT(rel_err(given.dx, dx), dx_tol);
    EXPECT_LT(rel_err(given.dweight, dw.view()), dt == DType::f32 ? 1e-5 : 1e-3);
    EXPECT_TRUE(same_bits(given.dx, again.dx));  // the recomputed rstd is the forward's
    EXPECT_TRUE(same_bits(given.dweight, again.dweight));
    ot::RmsNormGrads e = ot::rms_norm_bwd(dy, x, w, o.rstd, eps, ex);
    EXPECT_LT(rel_err(e.dx, dxe), dx_tol);
  }
}

}  // namespace

TEST(RmsNorm, ShapesDtypesIsas) {
  uint32_t seed = 1;
  for (std::vector<int64_t> shape : {std::vector<int64_t>{5, 3, 64}, {1, 1024}, {130, 37}, {2, 1000}, {7, 1}, {4, 15}, {0, 16}, {3, 0}, {96}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) check(shape, dt, DType::f32, seed++);
  check({9, 80}, DType::bf16, DType::bf16, seed++);
}

TEST(RmsNorm, BackwardDeterministicAcrossRowBlocks) {
  // 300 rows: five blocks of 64, summed in order whatever the threads (and the same bits run to run).
  std::mt19937 rng(11);
  Tensor x = rand_tensor(rng, DType::bf16, {300, 256}, -2.f, 2.f), dy = rand_tensor(rng, DType::bf16, {300, 256}, -1.f, 1.f);
  Tensor w = rand_tensor(rng, DType::f32, {256}, 0.5f, 1.5f);
  ot::RmsNormGrads a = ot::rms_norm_bwd(dy, x, w), b = ot::rms_norm_bwd(dy, x, w);
  EXPECT_TRUE(same_bits(a.dweight, b.dweight));
  EXPECT_TRUE(same_bits(a.dx, b.dx));
}

TEST(RmsNorm, StridedInputs) {
  std::mt19937 rng(3);
  Tensor wide = rand_tensor(rng, DType::bf16, {9, 4, 96}, -2.f, 2.f), w = rand_tensor(rng, DType::f32, {48}, 0.5f, 1.5f);
  Tensor dy = rand_tensor(rng, DType::bf16, {9, 4, 48}, -1.f, 1.f);
  TensorView x = wide.view().narrow(2, 48, 48);
  TensorView xt(wide.view().data, DType::bf16, {4, 9, 48}, {96, 384, 1});  // a transposed view
  for (TensorView xv : {x, xt}) {
    Tensor xc = Tensor::copy_of(xv);
    EXPECT_TRUE(same_bits(ot::rms_norm(xv, w).y, ot::rms_norm(xc, w).y));
    TensorView dyv(dy.view().data, DType::bf16, xv.shape());
    ot::RmsNormGrads ga = ot::rms_norm_bwd(dyv, xv, w), gb = ot::rms_norm_bwd(dyv, xc, w);
    EXPECT_TRUE(same_bits(ga.dx, gb.dx));
    EXPECT_TRUE(same_bits(ga.dweight, gb.dweight));
  }
}

namespace {
// Test-local fp64 loss sum(y * gy), y = rms_norm(x) * w of R rows of N.
struct RmsFd {
  int64_t R, N;
  double eps;
  std::vector<double> x, w, gy;
  double loss() const {
    double L = 0;
    for (int64_t r = 0; r < R; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < N; ++i) ss += x[size_t(r * N + i)] * x[size_t(r * N + i)];
      const double rs = 1 / std::sqrt(ss / double(N) + eps);
      for (int64_t i = 0; i < N; ++i) L += x[size_t(r * N + i)] * rs * w[size_t(i)] * gy[size_t(r * N + i)];
    }
    return L;
  }
};
}  // namespace

TEST(RmsNorm, BackwardFiniteDifferences) {
  for (int64_t N : {5, 19, 40}) {
    RmsFd f{3, N, 1e-5, {}, {}, {}};
    std::mt19937 rng{uint32_t(N)};
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    auto fill = [&](std::vector<double>& v, int64_t n, float shift) {
      v.resize(size_t(n));
      for (double& e : v) e = double(u(rng) + shift);
    };
    fill(f.x, f.R * N, 0.f), fill(f.w, N, 1.5f), fill(f.gy, f.R * N, 0.f);
    Tensor x = f32_tensor(f.x, {f.R, N}), w = f32_tensor(f.w, {N}), gy = f32_tensor(f.gy, {f.R, N});
    for (bool ref : {true, false})
      for (Isa isa : isa_paths()) {
        ot::cpu::ScopedMaxIsa cap(isa);
        ot::cpu::ScopedForceRef fr(ref);
        SCOPED_TRACE(testing::Message() << (ref ? "reference" : ot::cpu::isa_name(isa)) << " N " << N);
        ot::RmsNormGrads g = ot::rms_norm_bwd(gy, x, w, {}, 1e-5f);
        expect_fd(f, f.x, g.dx, 5e-5, "dx");
        expect_fd(f, f.w, g.dweight, 5e-5, "dweight");
      }
  }
}

TEST(RmsNorm, Errors) {
  std::mt19937 rng(5);
  Tensor x = rand_tensor(rng, DType::f32, {4, 16}, -1.f, 1.f), w = rand_tensor(rng, DType::f32, {16}, 0.5f, 1.5f);
  Tensor w_bad = Tensor::zeros(DType::f32, {15}), xi = Tensor::zeros(DType::i32, {4, 16}), x_short = Tensor::zeros(DType::f32, {3, 16});
  Tensor xb = Tensor::zeros(DType::bf16, {4, 16}), rstd_bad = Tensor::zeros(DType::f32, {5});
  expect_error([&] { ot::rms_norm(x, w_bad); }, "weight", "rms_norm");
  expect_error([&] { ot::rms_norm(xi, w); }, "x", "rms_norm");
  expect_error([&] { ot::rms_norm(x, w, -1.f); }, "eps");
  expect_error([&] { ot::rms_norm(x, w, NAN); }, "eps");
  expect_error([&] { ot::add_rms_norm(x, x_short, w); }, "x2", "add_rms_norm");
  expect_error([&] { ot::add_rms_norm(x, xb, w); }, "x2", "add_rms_norm");
  expect_error([&] { ot::add_rms_norm(x, {}, w); }, "x2", "add_rms_norm");
  expect_error([&] { ot::rms_norm_bwd(x_short, x, w); }, "dy", "rms_norm_bwd");
  expect_error([&] { ot::rms_norm_bwd(x, x, w, rstd_bad); }, "rstd");
  expect_error([&] { ot::rms_norm_bwd(x, x, w, {}, 1e-6f, x_short); }, "dx_extra");
}

}  // namespace test_rms_norm
