// adamw_step and multi_tensor_l2_norm (ot/optim.h) against their fp64 references on every ISA path
// (tensors of 1 element to more than one chunk), the same bits on 1 and 2 threads, and bad
// arguments that leave every tensor as it was.
#include <gtest/gtest.h>

#include "core_test_util.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ot/cpu.h"
#include "ot/optim.h"
#include "ot/parallel.h"

namespace test_optim {
using namespace ot;
using core_test::expect_error;
using core_test::uniform;

namespace {

struct State {
  std::vector<Tensor> p, g, m, v;
  std::vector<TensorView> views(std::vector<Tensor>& ts) {
    std::vector<TensorView> r;
    for (Tensor& t : ts) r.push_back(t.view());
    return r;
  }
};
Tensor random_f32(std::mt19937& rng, int64_t n, float lo, float hi) {
  Tensor t = Tensor::empty(DType::f32, {n});
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = u(rng);
  return t;
}
State make_state(uint32_t seed) {
  std::mt19937 rng(seed);
  State s;
  for (int64_t n : {1, 7, 300, 40000}) {
    s.p.push_back(random_f32(rng, n, -1.f, 1.f));
    s.g.push_back(random_f32(rng, n, -2.f, 2.f));
    s.m.push_back(random_f32(rng, n, -0.1f, 0.1f));
    s.v.push_back(random_f32(rng, n, 0.f, 0.01f));
  }
  return s;
}
double max_rel(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double w = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (int64_t i = 0; i < a[t].numel(); ++i) {
      const double x = a[t].ptr<float>()[i], y = b[t].ptr<float>()[i];
      w = std::max(w, std::fabs(x - y) / std::max(1e-3, std::fabs(y)));
    }
  return w;
}
bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t t = 0; t < a.size(); ++t)
    if (std::memcmp(a[t].view().data, b[t].view().data, a[t].view().nbytes()) != 0) return false;
  return true;
}

}  // namespace

TEST(Optim, AdamWMatchesTheReferenceOnEveryIsa) {
  optim::AdamW c;
  c.lr = 3e-3f, c.beta1 = 0.9f, c.beta2 = 0.95f, c.weight_decay = 0.1f, c.step = 3, c.grad_scale = 0.5f;
  State want = make_state(1);
  optim::ref::adamw_step(want.views(want.p), want.views(want.g), want.views(want.m), want.views(want.v), c);
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (!cpu::has(isa)) continue;
    cpu::ScopedMaxIsa cap(isa);
    SCOPED_TRACE(cpu::isa_name(isa));
    State s = make_state(1);
    optim::adamw_step(s.views(s.p), s.views(s.g), s.views(s.m), s.views(s.v), c);
    EXPECT_LT(max_rel(s.p, want.p), 2e-5);  // fp32 rounding of m b1 + g (1 - b1), near-cancelling
    EXPECT_LT(max_rel(s.m, want.m), 2e-5);
    EXPECT_LT(max_rel(s.v, want.v), 2e-5);
  }
}

TEST(Optim, SameBitsOnOneAndTwoThreads) {
  optim::AdamW c;
  State a = make_state(2), b = make_state(2);
  set_num_threads(1);
  optim::adamw_step(a.views(a.p), a.views(a.g), a.views(a.m), a.views(a.v), c);
  const double n1 = optim::multi_tensor_l2_norm(a.views(a.g));
  set_num_threads(2);
  optim::adamw_step(b.views(b.p), b.views(b.g), b.views(b.m), b.views(b.v), c);
  const double n2 = optim::multi_tensor_l2_norm(b.views(b.g));
  set_num_threads(0);
  EXPECT_TRUE(same_bits(a.p, b.p) && same_bits(a.m, b.m) && same_bits(a.v, b.v));
  EXPECT_EQ(n1, n2);
}

TEST(Optim, L2NormMatchesTheReference) {
  State s = make_state(3);
  const double want = optim::ref::multi_tensor_l2_norm(s.views(s.g));
  EXPECT_NEAR(optim::multi_tensor_l2_norm(s.views(s.g)), want, 1e-12 * want);
  EXPECT_EQ(optim::multi_tensor_l2_norm({}), 0.0);
}

TEST(Optim, BadArgumentsWriteNothing) {
  State s = make_state(4), keep = make_state(4);
  optim::AdamW c;
  std::vector<TensorView> g = s.views(s.g);
  Tensor wrong = Tensor::zeros(DType::f32, {8});
  g[1] = wrong.view();
  expect_error([&] { optim::adamw_step(s.views(s.p), g, s.views(s.m), s.views(s.v), c); }, "grads");
  c.beta2 = 1.f;
  expect_error([&] { optim::adamw_step(s.views(s.p), s.views(s.g), s.views(s.m), s.views(s.v), c); }, "betas");
  c = {};
  c.step = 0;
  expect_error([&] { optim::adamw_step(s.views(s.p), s.views(s.g), s.views(s.m), s.views(s.v), c); }, "step");
  Tensor half = Tensor::zeros(DType::bf16, {7});
  std::vector<TensorView> p = s.views(s.p);
  p[1] = half.view();
  expect_error([&] { optim::multi_tensor_l2_norm(p); }, "tensors");
  EXPECT_TRUE(same_bits(s.p, keep.p) && same_bits(s.m, keep.m) && same_bits(s.v, keep.v));
}

}  // namespace test_optim
