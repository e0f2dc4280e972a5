// The AVX2 epilogue's vector exp / silu / erf / gelu (src/gemm/vec_math_avx2.h) against the scalar
// formulas in double at special values (0, +-inf, NaN, the clamp edges, +-100, denormals) and over
// a sweep: the contract the fused activations rely on.
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gemm_test_util.h"
#include "src/gemm/epilogue_math.h"
#include "vec_math_probe.h"

namespace test_vec_math {
using namespace ot;
using namespace ot::gemm;
using namespace ot::gemm::testing;

namespace {

const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> inputs() {
  std::vector<float> x = {0.f, -0.f, kInf, -kInf, kNaN, 88.f, -88.f, 100.f, -100.f, 87.3f, -87.3f, 88.3762626647949f, -87.3365447504f, 88.38f, -87.34f,
                          1e-40f, -1e-40f, 1e-45f, FLT_MIN, -FLT_MIN, 0.5f, -0.5f, 1.f, -1.f, 3.f, -3.f, 10.f, -10.f, 20.f, -20.f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-90.f, 90.f), s(-6.f, 6.f);
  for (int i = 0; i < 2000; ++i) x.push_back(i % 2 ? d(rng) : s(rng));
  return x;
}

std::vector<float> eval(VecFn f, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  vec_math_avx2(f, x.data(), y.data(), int64_t(x.size()));
  return y;
}

// got vs ref: both NaN, both the same infinity, or |got - ref| <= atol + rtol |ref|.
void expect_close(const char* fn, float x, float got, double ref, double atol, double rtol) {
  if (std::isnan(ref)) {
    EXPECT_TRUE(std::isnan(got)) << fn << "(" << x << ") = " << got << ", want NaN";
  } else if (std::isinf(ref)) {
    EXPECT_EQ(double(got), ref) << fn << "(" << x << ")";
  } else {
    EXPECT_LE(std::fabs(double(got) - ref), atol + rtol * std::fabs(ref)) << fn << "(" << x << ") = " << got << ", want " << ref;
  }
}

bool have_avx2() { return cpu::detected_isa() >= cpu::Isa::avx2; }

}  // namespace

// e^x of x clamped to [ln FLT_MIN, 127.5 ln2] (so never inf or denormal), NaN kept, within ~2 ulp.
TEST(VecMathAvx2, ExpIsTheClampedExp) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  const std::vector<float> x = inputs();
  const std::vector<float> y = eval(VecFn::exp, x);
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::isnan(x[i]) ? NAN : std::exp(std::clamp(double(x[i]), double(-87.3365447504f), double(88.3762626647949f)));
    expect_close("exp", x[i], y[i], ref, 0, 2.5e-7);
  }
  EXPECT_EQ(eval(VecFn::exp, {0.f, 1e-40f})[1], 1.f);
  EXPECT_GE(eval(VecFn::exp, {kInf})[0], 2e38f);
  EXPECT_GT(eval(VecFn::exp, {-kInf})[0], 0.f);
}

TEST(VecMathAvx2, SiluErfGeluMatchTheScalarFormulas) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  const std::vector<float> x = inputs();
  const std::vector<float> s = eval(VecFn::silu, x), e = eval(VecFn::erf, x), g = eval(VecFn::gelu, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i];
    // silu(-inf): the scalar formula gives -inf / inf = NaN, the vector one -inf / 2.4e38 = -inf
    // (as vm::exp's AVX-512 form); the limit is -0. Neither is used for a finite accumulator.
    if (x[i] == -kInf) EXPECT_EQ(s[i], -kInf);
    else expect_close("silu", x[i], s[i], silu(xd), 1e-36, 4e-7);
    // Abramowitz-Stegun's 1.5e-7 plus the fp32 evaluation's rounding (the cancellation in 1 - p e near 0).
    expect_close("erf", x[i], e[i], std::erf(xd), 4e-7, 0);
    expect_close("gelu", x[i], g[i], gelu(xd), 1e-37 + 2e-7 * std::min(std::fabs(xd), 1e30), 1e-6);
  }
}

}  // namespace test_vec_math
