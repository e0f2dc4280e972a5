// causal_conv1d_update: against its fp64 reference, equal to causal_conv1d_fn run token by token on a
// slot cache (permuted slots, a padded row), and the bad inputs of the conv operators (ot::Error
// naming the argument, nothing the caller owns modified).
#include <gtest/gtest.h>

#include <cstring>

#include "conv_test_util.h"

namespace test_causal_conv1d_update {
using namespace conv_test;
using ot::cpu::Isa;

namespace {

// Bytes of a tensor, to check that nothing was written.
std::vector<char> bytes(const TensorView& t) {
  const char* p = static_cast<const char*>(t.data);
  return std::vector<char>(p, p + t.nbytes());
}

}  // namespace

TEST(CausalConv1dUpdate, MatchesReference) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (DType sdt : {dt, DType::f32})
      for (int64_t S : {1, 3})
        for (int64_t W : {2, 4}) {
          SCOPED_TRACE(testing::Message() << ot::dtype_name(dt) << " state " << ot::dtype_name(sdt) << " S " << S << " W " << W);
          const int64_t B = 3, D = 75 + 300 * (S == 3), slots = 5;  // S 3: two channel blocks
          std::mt19937 rng(uint32_t(S * 10 + W));
          Tensor x = rand_tensor(rng, dt, {B, S, D}, -2.f, 2.f), w = rand_tensor(rng, dt, {D, W}, -1.f, 1.f);
          Tensor b = rand_tensor(rng, DType::f32, {D}, -0.5f, 0.5f);
          Tensor cache = rand_tensor(rng, sdt, {slots, D, W - 1}, -2.f, 2.f);
          Tensor idx = i32_tensor({4, -1, 1});
          gdn::CausalConv1dUpdateOptions o;
          o.bias = b, o.conv_state_indices = idx;
          Tensor ref_cache = Tensor::copy_of(cache), ref_y = Tensor::zeros(DType::f32, {B, S, D});
          gdn::ref::causal_conv1d_update(x, ref_cache, w, b, true, {4, -1, 1}, ref_y);
          for (Isa isa : isa_paths()) {
            ot::cpu::ScopedMaxIsa cap(isa);
            Tensor c = Tensor::copy_of(cache);
            Tensor y = gdn::causal_conv1d_update(x, c, w, o);
            EXPECT_LT(rel_err(y, ref_y), tol(dt));
            EXPECT_EQ(rel_err(c, ref_cache), 0.0);  // the state is a shift of inputs
            // The padded row's output is zeros; the slots no row names are untouched.
            for (int64_t i = 0; i < S * D; ++i) EXPECT_EQ(ot::get_as_double(y.view().select(0, 1), i), 0.0);
            for (int64_t s : {0, 2, 3}) EXPECT_EQ(rel_err(c.view().select(0, s), cache.view().select(0, s)), 0.0);
          }
        }
}

TEST(CausalConv1dUpdate, EqualsFnStepByStep) {
  // The decode steps from a conv state equal the prefill of the same tokens from that state.
  for (DType dt : {DType::f32, DType::bf16})
    for (bool silu : {true, false}) {
      const int64_t B = 3, T = 7, D = 130, W = 4, slots = 6;
      std::mt19937 rng(3 + silu);
      Tensor x = rand_tensor(rng, dt, {B, T, D}, -2.f, 2.f), w = rand_tensor(rng, dt, {D, W}, -1.f, 1.f);
      Tensor b = rand_tensor(rng, dt, {D}, -0.5f, 0.5f), s0 = rand_tensor(rng, dt, {B, D, W - 1}, -2.f, 2.f);
      gdn::CausalConv1dOptions fo;
      fo.bias = b, fo.initial_states = s0, fo.return_final_states = true;
      fo.activation = silu ? gdn::Activation::silu : gdn::Activation::none;
      gdn::CausalConv1dOut full = gdn::causal_conv1d_fn(x, w, fo);
      // Rows 0, 1, 2 live in slots 5, 0, 3; a fourth, padded row rides along.
      const std::vector<int32_t> slot_of{5, 0, 3};
      Tensor cache = Tensor::zeros(dt, {slots, D, W - 1});
      for (int64_t r = 0; r < B; ++r) std::memcpy(cache.view().select(0, slot_of[size_t(r)]).data, s0.view().select(0, r).data, size_t(D * (W - 1)) * ot::dtype_size(dt));
      Tensor idx = i32_tensor({5, 0, 3, -1});
      gdn::CausalConv1dUpdateOptions uo;
      uo.bias = b, uo.activation = fo.activation, uo.conv_state_indices = idx;
      for (int64_t t = 0; t < T; ++t) {
        Tensor xt = Tensor::zeros(dt, {B + 1, D});
        for (int64_t r = 0; r < B; ++r) std::memcpy(xt.view().select(0, r).data, x.view().select(0, r).select(0, t).data, size_t(D) * ot::dtype_size(dt));
        Tensor yt = gdn::causal_conv1d_update(xt, cache, w, uo);
        ASSERT_EQ(yt.view().shape(), (std::vector<int64_t>{B + 1, D}));
        for (int64_t r = 0; r < B; ++r)
          EXPECT_LT(rel_err(yt.view().select(0, r), full.y.view().select(0, r).select(0, t)), dt == DType::f32 ? 1e-6 : 8e-3) << t;
      }
      for (int64_t r = 0; r < B; ++r)
        EXPECT_EQ(rel_err(cache.view().select(0, slot_of[size_t(r)]), full.final_states.view().select(0, r)), 0.0);
    }
}

TEST(CausalConv1dUpdate, StridedStateAndInput) {
  // The state as W-1 columns of a wider per-channel row, x with strided channels: the same result
  // as the contiguous forms.
  const int64_t B = 2, D = 300, W = 4, slots = 3;
  std::mt19937 rng(12);
  Tensor wide = rand_tensor(rng, DType::bf16, {slots, D, W + 2}, -1.f, 1.f), w = rand_tensor(rng, DType::f32, {D, W}, -1.f, 1.f);
  Tensor xt_store = rand_tensor(rng, DType::bf16, {D, B}, -1.f, 1.f);
  TensorView state = wide.view().narrow(2, 1, W - 1), x(xt_store.view().data, DType::bf16, {B, D}, {1, B});
  Tensor state_c = Tensor::copy_of(state), x_c = Tensor::copy_of(x), idx = i32_tensor({2, 0});
  gdn::CausalConv1dUpdateOptions o;
  o.conv_state_indices = idx;
  Tensor y = gdn::causal_conv1d_update(x, state, w, o), yc = gdn::causal_conv1d_update(x_c, state_c, w, o);
  EXPECT_EQ(rel_err(y, yc), 0.0);
  EXPECT_EQ(rel_err(state, state_c), 0.0);
}

TEST(CausalConv1dUpdate, WithoutIndices) {
  const int64_t B = 2, D = 16, W = 3;
  std::mt19937 rng(9);
  Tensor x = rand_tensor(rng, DType::f32, {B, D}, -1.f, 1.f), w = rand_tensor(rng, DType::f32, {D, W}, -1.f, 1.f);
  Tensor cache = rand_tensor(rng, DType::f32, {B, D, W - 1}, -1.f, 1.f);
  Tensor ref_cache = Tensor::copy_of(cache), ref_y = Tensor::zeros(DType::f32, {B, 1, D});
  gdn::ref::causal_conv1d_update(TensorView(x.view().data, DType::f32, {B, 1, D}), ref_cache, w, {}, true, {0, 1}, ref_y);
  Tensor y = gdn::causal_conv1d_update(x, cache, w);
  EXPECT_LT(rel_err(y, ref_y), 1e-6);
  EXPECT_EQ(rel_err(cache, ref_cache), 0.0);
}

TEST(CausalConv1dErrors, Fn) {
  Case c;
  c.B = 1, c.T = 10, c.D = 8, c.cu = {0, 4, 10};
  ConvIn in = make_conv(c, 1);
  auto fn = [&](const gdn::CausalConv1dOptions& o) { return [&, o] { gdn::causal_conv1d_fn(in.x, in.w, o); }; };
  auto bwd = [&](const gdn::CausalConv1dOptions& o) {
    return [&, o] { gdn::causal_conv1d_bwd(in.x, in.w, in.x, o); };
  };
  for (std::vector<int64_t> cu : {std::vector<int64_t>{1, 4, 10}, {0, 6, 4, 10}, {0, 4, 9}, {0, 4, 11}}) {
    Tensor t = cu_tensor(cu);
    gdn::CausalConv1dOptions o = in.opt;
    o.cu_seqlens = t;
    o.initial_states = {};
    expect_error(fn(o), "cu_seqlens", "causal_conv1d_fn");
    expect_error(bwd(o), "cu_seqlens", "causal_conv1d_bwd");
  }
  Tensor fcu = Tensor::zeros(DType::f32, {3});
  gdn::CausalConv1dOptions o = in.opt;
  o.cu_seqlens = fcu;
  expect_error(fn(o), "cu_seqlens");
  // Initial states of the wrong count (3 sequences, 2 states), width or dtype.
  Tensor cu3 = cu_tensor({0, 2, 4, 10});
  o = in.opt;
  o.cu_seqlens = cu3;
  expect_error(fn(o), "initial_states");
  Tensor s_w = Tensor::zeros(DType::f32, {2, 8, 2}), s_i = Tensor::zeros(DType::i32, {2, 8, 3});
  o = in.opt, o.initial_states = s_w;
  expect_error(fn(o), "initial_states");
  o.initial_states = s_i;
  expect_error(fn(o), "initial_states");
  Tensor b9 = Tensor::zeros(DType::f32, {9});
  o = in.opt, o.bias = b9;
  expect_error(fn(o), "bias");
  Tensor w_d = Tensor::zeros(DType::f32, {7, 4}), w_9 = Tensor::zeros(DType::f32, {8, 9}), w_1 = Tensor::zeros(DType::f32, {8, 1});
  for (Tensor* w : {&w_d, &w_9, &w_1}) expect_error([&] { gdn::causal_conv1d_fn(in.x, *w, in.opt); }, "weight");
  Tensor xi = Tensor::zeros(DType::i32, {1, 10, 8}), x2 = Tensor::zeros(DType::f32, {10, 8});
  expect_error([&] { gdn::causal_conv1d_fn(xi, in.w, in.opt); }, "x");
  expect_error([&] { gdn::causal_conv1d_fn(x2, in.w, in.opt); }, "x");
  Tensor dy = Tensor::zeros(DType::f32, {1, 9, 8});
  expect_error([&] { gdn::causal_conv1d_bwd(in.x, in.w, dy, in.opt); }, "dy");
  Tensor dfin = Tensor::zeros(DType::f32, {2, 8, 2});
  expect_error([&] { gdn::causal_conv1d_bwd(in.x, in.w, in.x, in.opt, dfin); }, "dfinal_states");
  // A fixed-length batch of 2 with cu_seqlens.
  Case c2;
  c2.B = 2, c2.T = 5, c2.D = 8, c2.init = false;
  ConvIn in2 = make_conv(c2, 2);
  Tensor cu2 = cu_tensor({0, 5});
  o = in2.opt, o.cu_seqlens = cu2;
  expect_error([&] { gdn::causal_conv1d_fn(in2.x, in2.w, o); }, "cu_seqlens");
}

TEST(CausalConv1dErrors, Update) {
  const int64_t B = 3, D = 8, W = 4, slots = 4;
  std::mt19937 rng(2);
  Tensor x = rand_tensor(rng, DType::f32, {B, D}, -1.f, 1.f), w = rand_tensor(rng, DType::f32, {D, W}, -1.f, 1.f);
  Tensor cache = rand_tensor(rng, DType::f32, {slots, D, W - 1}, -1.f, 1.f);
  const std::vector<char> before = bytes(cache);
  auto call = [&](const TensorView& idx) {
    return [&, idx] {
      gdn::CausalConv1dUpdateOptions o;
      o.conv_state_indices = idx;
      gdn::causal_conv1d_update(x, cache, w, o);
    };
  };
  // Out of range, a slot used twice, the wrong count, the wrong dtype.
  Tensor oob = i32_tensor({0, 4, 1}), dup = i32_tensor({2, 1, 2}), few = i32_tensor({0, 1}), fl = Tensor::zeros(DType::f32, {3});
  for (Tensor* idx : {&oob, &dup, &few, &fl}) expect_error(call(*idx), "conv_state_indices", "causal_conv1d_update");
  // No indices: one slot per row is required.
  expect_error(call({}), "conv_state");
  Tensor bad_w = Tensor::zeros(DType::f32, {D, 3}), cache_bf = Tensor::zeros(DType::bf16, {slots, D, W - 1});
  Tensor idx = i32_tensor({0, 1, 2});
  gdn::CausalConv1dUpdateOptions o;
  o.conv_state_indices = idx;
  expect_error([&] { gdn::causal_conv1d_update(x, cache, bad_w, o); }, "conv_state");
  expect_error([&] { gdn::causal_conv1d_update(x, cache_bf, w, o); }, "conv_state");
  Tensor x4 = Tensor::zeros(DType::f32, {1, 3, 1, D}), xd = Tensor::zeros(DType::f32, {B, D + 1});
  expect_error([&] { gdn::causal_conv1d_update(x4, cache, w, o); }, "x");
  expect_error([&] { gdn::causal_conv1d_update(xd, cache, w, o); }, "weight");
  EXPECT_EQ(bytes(cache), before);
}

}  // namespace test_causal_conv1d_update
