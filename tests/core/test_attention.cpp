// causal_attention / causal_attention_backward (ot/attention.h) against the fp64 reference:
// prefill (T = S), decode (T = 1 of S), a chunk onto a cache, fp32 and bf16, strided q; the
// backward also against fp64 central differences of the reference's loss; bad arguments.
#include <gtest/gtest.h>

#include "core_test_util.h"

#include <cmath>
#include <random>
#include <string>

#include "ot/attention.h"
#include "ot/cpu.h"
#include "ot/error.h"

namespace test_attention {
using namespace ot;
using core_test::expect_error;
using core_test::uniform;

namespace {
double rel(const TensorView& a, const TensorView& b) {
  double n = 0, d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = get_as_double(a, i), y = get_as_double(b, i);
    n += (x - y) * (x - y), d += y * y;
  }
  return std::sqrt(n / std::max(d, 1e-30));
}
}  // namespace

TEST(CausalAttention, MatchesTheReference) {
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [T, S] : {std::pair<int64_t, int64_t>{9, 9}, {1, 12}, {4, 11}, {70, 70}, {40, 75}}) {  // (70, 40: several query blocks)
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T " << T << " S " << S);
      std::mt19937 rng(uint32_t(T * 31 + S));
      const int64_t B = 2, H = 3, D = 8;
      Tensor qb = uniform(rng, dt, {B, T, H, D}, -1.f, 1.f);  // q as the [B, H, T, D] view of a [B, T, H, D] projection
      TensorView q(qb.view().data, dt, {B, H, T, D}, {T * H * D, D, H * D, 1});
      Tensor k = uniform(rng, dt, {B, H, S, D}, -1.f, 1.f), v = uniform(rng, dt, {B, H, S, D}, -1.f, 1.f);
      Tensor dout = uniform(rng, dt, {B, H, T, D}, -1.f, 1.f);
      Tensor o = Tensor::empty(DType::f32, {B, H, T, D}), lse = Tensor::empty(DType::f32, {B, H, T});
      Tensor dq = Tensor::empty(DType::f32, {B, H, T, D}), dk = Tensor::empty(DType::f32, {B, H, S, D}), dv = Tensor::empty(DType::f32, {B, H, S, D});
      ref::causal_attention(q, k, v, 0.35, o, lse);
      ref::causal_attention_backward(dout, q, k, v, 0.35, dq, dk, dv);
      const double tol = dt == DType::f32 ? 1e-5 : 1.5e-2;
      for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {  // the softmax rows' builds
        if (!cpu::has(isa)) continue;
        cpu::ScopedMaxIsa cap(isa);
        SCOPED_TRACE(cpu::isa_name(isa));
        AttentionOut r = causal_attention(q, k, v, 0.35f);
        EXPECT_LT(rel(r.o, o), tol);
        EXPECT_LT(rel(r.lse, lse), 1e-5);
        AttentionGrads g = causal_attention_backward(dout, q, k, v, r.o, r.lse, 0.35f);
        EXPECT_LT(rel(g.dq, dq), 2 * tol);
        EXPECT_LT(rel(g.dk, dk), 2 * tol);
        EXPECT_LT(rel(g.dv, dv), 2 * tol);
      }
    }
}

TEST(CausalAttention, ReferenceBackwardFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t B = 1, H = 2, T = 3, S = 5, D = 4;
  Tensor q = uniform(rng, DType::f32, {B, H, T, D}, -1.f, 1.f), k = uniform(rng, DType::f32, {B, H, S, D}, -1.f, 1.f);
  Tensor v = uniform(rng, DType::f32, {B, H, S, D}, -1.f, 1.f), dout = uniform(rng, DType::f32, {B, H, T, D}, -1.f, 1.f);
  // loss = sum(o * dout) in fp64 through the reference, o written in fp64 too
  auto loss = [&] {
    Tensor o = Tensor::empty(DType::f32, {B, H, T, D}), lse = Tensor::empty(DType::f32, {B, H, T});
    ref::causal_attention(q, k, v, 0.5, o, lse);
    double L = 0;
    for (int64_t i = 0; i < o.numel(); ++i) L += get_as_double(o, i) * get_as_double(dout, i);
    return L;
  };
  Tensor dq = Tensor::empty(DType::f32, {B, H, T, D}), dk = Tensor::empty(DType::f32, {B, H, S, D}), dv = Tensor::empty(DType::f32, {B, H, S, D});
  ref::causal_attention_backward(dout, q, k, v, 0.5, dq, dk, dv);
  AttentionOut r = causal_attention(q, k, v, 0.5f);
  AttentionGrads g = causal_attention_backward(dout, q, k, v, r.o, r.lse, 0.5f);
  for (auto [x, grad, fast] : {std::tuple{&q, &dq, &g.dq}, {&k, &dk, &g.dk}, {&v, &dv, &g.dv}}) {
    double worst = 0;
    for (int64_t i = 0; i < x->numel(); ++i) {
      float* p = x->ptr<float>() + i;
      const float keep = *p;
      const double h = 4e-3;
      *p = float(keep + h);
      const double lp = loss();
      *p = float(keep - h);
      const double lm = loss();
      *p = keep;
      const double fd = (lp - lm) / (double(float(keep + h)) - double(float(keep - h)));
      worst = std::max({worst, std::fabs(fd - get_as_double(*grad, i)), std::fabs(fd - get_as_double(*fast, i)) / 10});
    }
    EXPECT_LT(worst, 5e-4);  // (the loss through fp32 outputs: ~1e-7 of rounding over 2h)
  }
}

TEST(CausalAttention, Errors) {
  Tensor q = Tensor::zeros(DType::f32, {1, 2, 3, 4}), k = Tensor::zeros(DType::f32, {1, 2, 2, 4}), v = Tensor::zeros(DType::f32, {1, 2, 3, 4});
  Tensor kb = Tensor::zeros(DType::bf16, {1, 2, 3, 4}), lse = Tensor::zeros(DType::f32, {1, 2, 2});
  expect_error([&] { causal_attention(q, k, v, 1.f); }, "'k'");  // S < T
  expect_error([&] { causal_attention(q, kb, v, 1.f); }, "'k'");
  expect_error([&] { causal_attention(q, v, v, 0.f); }, "'scale'");
  expect_error([&] { causal_attention_backward(q, q, v, v, q, lse, 1.f); }, "'lse'");
}

}  // namespace test_attention
