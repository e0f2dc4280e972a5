// gated_delta_net_decode (ot/gdn_layer.h) against the layer's operators called one by one on copies
// of the same states (in-projection, conv update, recurrent step with fused gates, gated norm,
// out-projection): the same outputs and states, fp32 and bf16, B = 1 and 3; and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "conv_test_util.h"
#include "ot/gdn.h"
#include "ot/gemm.h"

namespace test_gdn_layer_decode {
using namespace conv_test;

namespace {

struct Layer {
  int64_t H = 48, HK = 2, HV = 4, DK = 16, DV = 8, W = 4;
  int64_t C() const { return 2 * HK * DK + HV * DV; }
  int64_t Np() const { return C() + HV * DV + 2 * HV; }
  Tensor in_w, out_w, conv_w, A_log, dt_bias, norm_w;
  ot::gemm::PackedB in, out;
};

Layer make_layer(DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  Layer L;
  L.in_w = rand_tensor(rng, dt, {L.Np(), L.H}, -0.3f, 0.3f);
  L.out_w = rand_tensor(rng, dt, {L.H, L.HV * L.DV}, -0.3f, 0.3f);
  L.conv_w = rand_tensor(rng, dt, {L.C(), L.W}, -0.5f, 0.5f);
  L.A_log = rand_tensor(rng, DType::f32, {L.HV}, 0.f, 2.f);
  L.dt_bias = rand_tensor(rng, DType::f32, {L.HV}, 0.5f, 1.5f);
  L.norm_w = rand_tensor(rng, dt, {L.DV}, 0.5f, 1.5f);
  L.in = ot::gemm::prepack(L.in_w, ot::gemm::BLayout::NK);
  L.out = ot::gemm::prepack(L.out_w, ot::gemm::BLayout::NK);
  return L;
}

gdn::GdnDecodeLayer args(const Layer& L) {
  gdn::GdnDecodeLayer a;
  a.in_proj = &L.in, a.out_proj = &L.out;
  a.conv_weight = L.conv_w, a.A_log = L.A_log, a.dt_bias = L.dt_bias, a.norm_weight = L.norm_w;
  a.HK = L.HK, a.HV = L.HV, a.DK = L.DK, a.DV = L.DV;
  return a;
}

// The step as the layer's operators, one by one (the op-by-op path of GatedDeltaNet).
Tensor op_by_op(const Layer& L, const TensorView& x, const TensorView& conv_state, Tensor& state) {
  const int64_t B = x.sizes[0], C = L.C(), Np = L.Np(), HV = L.HV, DV = L.DV;
  const DType dt = x.dtype;
  Tensor proj = Tensor::empty(dt, {B, Np});
  ot::gemm::gemm(B, {x.data, dt, L.H}, L.in, {proj.view().data, dt, Np});
  auto cols = [&](int64_t c0, std::vector<int64_t> s, std::vector<int64_t> st) {
    return TensorView(static_cast<char*>(proj.view().data) + c0 * int64_t(ot::dtype_size(dt)), dt, std::move(s), std::move(st));
  };
  Tensor mixed = gdn::causal_conv1d_update(cols(0, {B, C}, {Np, 1}), conv_state, L.conv_w);
  Tensor mc = Tensor::copy_of(mixed.view());
  auto part = [&](int64_t c0, int64_t h, int64_t d) {
    return TensorView(static_cast<char*>(mc.view().data) + c0 * int64_t(ot::dtype_size(dt)), dt, {B, 1, h, d}, {C, C, d, 1});
  };
  gdn::RecurrentOptions ro;
  ro.use_qk_l2norm_in_kernel = true, ro.A_log = L.A_log, ro.dt_bias = L.dt_bias, ro.beta_sigmoid = true;
  ro.initial_state = state, ro.output_final_state = true;
  const int64_t cb = C + HV * DV, ca = cb + HV;
  gdn::RecurrentOut r = gdn::recurrent_gated_delta_rule(part(0, L.HK, L.DK), part(L.HK * L.DK, L.HK, L.DK), part(2 * L.HK * L.DK, HV, DV),
                                                        cols(ca, {B, 1, HV}, {Np, Np, 1}), cols(cb, {B, 1, HV}, {Np, Np, 1}), ro);
  state = r.final_state;
  Tensor z = Tensor::copy_of(cols(C, {B, HV, DV}, {Np, DV, 1}));
  Tensor o = gdn::rms_norm_gated(r.o.view().reshape({B, HV, DV}), z, L.norm_w).y;
  Tensor y = Tensor::empty(dt, {B, L.H});
  ot::gemm::gemm(B, {o.view().data, dt, HV * DV}, L.out, {y.view().data, dt, L.H});
  return y;
}

}  // namespace

TEST(GdnLayerDecode, EqualsTheOperatorsOneByOne) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t B : {1, 3}) {
      SCOPED_TRACE(testing::Message() << ot::dtype_name(dt) << " B " << B);
      Layer L = make_layer(dt, uint32_t(B));
      std::mt19937 rng(7);
      Tensor cs = rand_tensor(rng, dt, {B, L.C(), L.W - 1}, -1.f, 1.f), cs2 = Tensor::copy_of(cs.view());
      Tensor st = rand_tensor(rng, DType::f32, {B, L.HV, L.DK, L.DV}, -0.5f, 0.5f), st2 = Tensor::copy_of(st.view());
      for (int step = 0; step < 3; ++step) {
        Tensor x = rand_tensor(rng, dt, {B, L.H}, -1.f, 1.f);
        Tensor y = gdn::gated_delta_net_decode(x, args(L), cs, st);
        Tensor y2 = op_by_op(L, x, cs2, st2);
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{B, L.H}));
        EXPECT_EQ(rel_err(y, y2), 0.0) << step;
        EXPECT_EQ(rel_err(cs, cs2), 0.0) << step;
        EXPECT_EQ(rel_err(st, st2), 0.0) << step;
      }
    }
}

TEST(GdnLayerDecode, Errors) {
  Layer L = make_layer(DType::f32, 1);
  std::mt19937 rng(2);
  Tensor x = rand_tensor(rng, DType::f32, {1, L.H}, -1.f, 1.f), xb = rand_tensor(rng, DType::bf16, {1, L.H}, -1.f, 1.f);
  Tensor cs = Tensor::zeros(DType::f32, {1, L.C(), L.W - 1}), st = Tensor::zeros(DType::f32, {1, L.HV, L.DK, L.DV});
  Tensor st_bad = Tensor::zeros(DType::bf16, {1, L.HV, L.DK, L.DV});
  gdn::GdnDecodeLayer a = args(L);
  expect_error([&] { gdn::gated_delta_net_decode(xb, a, cs, st); }, "x", "gated_delta_net_decode");
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st_bad); }, "state");
  a.HV = 3;
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st); }, "layer");
  a = args(L);
  a.DK = 8;
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st); }, "in_proj");
  // Arguments the later steps read are checked before conv_state is written.
  Tensor cs0 = Tensor::copy_of(cs.view()), x_nan = Tensor::copy_of(x.view()), A_bad = Tensor::zeros(DType::f32, {L.HV + 1});
  x_nan.ptr<float>()[5] = NAN;
  a = args(L);
  expect_error([&] { gdn::gated_delta_net_decode(x_nan, a, cs, st); }, "x");
  a.A_log = A_bad;
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st); }, "A_log");
  a = args(L);
  a.norm_weight = A_bad;
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st); }, "norm_weight");
  EXPECT_EQ(rel_err(cs, cs0), 0.0);
  a = args(L);
  a.out_proj = nullptr;
  expect_error([&] { gdn::gated_delta_net_decode(x, a, cs, st); }, "layer");
}

}  // namespace test_gdn_layer_decode
