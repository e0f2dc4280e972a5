// rotary_mul / rotary_mul_backward (ot/rotary.h) against the fp64 reference: fp32 / bf16, a strided
// [B, H, T, D] view, T = 1 and D = 2; the backward undoes the forward (a rotation); bad arguments.
#include <gtest/gtest.h>

#include "core_test_util.h"

#include <cmath>
#include <random>
#include <string>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/rotary.h"

namespace test_rotary {
using namespace ot;
using core_test::expect_error;
using core_test::uniform;

namespace {
double max_abs_diff(const TensorView& a, const TensorView& b) {
  double w = 0;
  for (int64_t i = 0; i < a.numel(); ++i) w = std::max(w, std::fabs(get_as_double(a, i) - get_as_double(b, i)));
  return w;
}
}  // namespace

TEST(Rotary, MatchesTheReferenceAndInverts) {
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [T, D] : {std::pair<int64_t, int64_t>{5, 16}, {1, 2}, {7, 34}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T " << T << " D " << D);
      std::mt19937 rng(uint32_t(T * D));
      Tensor base = uniform(rng, dt, {2, T, 3, D}, -1.f, 1.f);  // [B, T, H, D]; x = its [B, H, T, D] view
      TensorView x(base.view().data, dt, {2, 3, T, D}, {T * 3 * D, D, 3 * D, 1});
      Tensor ang = uniform(rng, DType::f32, {T, D}, 0.f, 6.f), cos = Tensor::empty(DType::f32, {T, D}), sin = Tensor::empty(DType::f32, {T, D});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i) {
          const float a = ang.ptr<float>()[t * D + i % (D / 2)];
          cos.ptr<float>()[t * D + i] = std::cos(a), sin.ptr<float>()[t * D + i] = std::sin(a);
        }
      Tensor y = rotary_mul(x, cos, sin);
      Tensor xc = Tensor::copy_of(x), want = Tensor::empty(DType::f32, {6, T, D});
      ref::rotary_mul(TensorView(xc.view().data, dt, {6, T, D}), cos, sin, 1.0, want);
      const double tol = dt == DType::f32 ? 1e-6 : 1e-2;
      EXPECT_LT(max_abs_diff(TensorView(y.view().data, dt, {6, T, D}), want), tol);
      Tensor back = rotary_mul_backward(y, cos, sin);  // a rotation: its transpose is its inverse
      EXPECT_LT(max_abs_diff(back, xc), dt == DType::f32 ? 1e-6 : 2e-2);
      cpu::ScopedForceRef r(true);
      EXPECT_LT(max_abs_diff(rotary_mul(x, cos, sin), y), tol);
    }
}

TEST(Rotary, Errors) {
  Tensor x = Tensor::zeros(DType::f32, {2, 4, 6}), c = Tensor::zeros(DType::f32, {4, 6}), odd = Tensor::zeros(DType::f32, {2, 4, 5});
  Tensor c_bad = Tensor::zeros(DType::f32, {3, 6}), xi = Tensor::zeros(DType::i32, {2, 4, 6});
  expect_error([&] { rotary_mul(x, c_bad, c); }, "'cos'");
  expect_error([&] { rotary_mul(x, c, c_bad); }, "'sin'");
  expect_error([&] { rotary_mul(odd, Tensor::zeros(DType::f32, {4, 5}), Tensor::zeros(DType::f32, {4, 5})); }, "'x'");
  expect_error([&] { rotary_mul(xi, c, c); }, "'x'");
}

}  // namespace test_rotary
