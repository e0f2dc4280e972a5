// Every bad input raises ot::Error naming the argument, before any output is written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "gdn_test_util.h"
#include "ot/error.h"

namespace test_gdn_errors {
using namespace gdn_test;
namespace gdn = ot::gdn;

namespace {
Shape small() {
  Shape s;
  s.T = 10, s.packed = true, s.HK = 1, s.HV = 2, s.DK = 8, s.DV = 8;
  return s;
}
}  // namespace

TEST(GdnErrors, CuSeqlens) {
  Inputs in = make_inputs(small(), DType::f32, 1);
  for (std::vector<int64_t> cu : {std::vector<int64_t>{1, 5, 10}, {0, 6, 5, 10}, {0, 5, 9}, {0, 5, 11}}) {
    Tensor c = cu_tensor(cu);
    gdn::ChunkOptions o;
    o.cu_seqlens = c;
    expect_error([&] { gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, o); }, "cu_seqlens");
    gdn::RecurrentOptions r;
    r.cu_seqlens = c;
    expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r); }, "cu_seqlens");
    gdn::Common cc;
    cc.cu_seqlens = c;
    expect_error([&] { gdn::chunk_local_cumsum(in.g, false, 1.f, cc); }, "cu_seqlens");
  }
}

TEST(GdnErrors, HeadGroupsAndShapes) {
  Shape s = small();
  s.HK = 2, s.HV = 3;
  Inputs in = make_inputs(s, DType::f32, 2);
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta); }, "v");
  expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta); }, "v");
  Inputs ok = make_inputs(small(), DType::f32, 3);
  std::mt19937 rng(1);
  Tensor k2 = rand_tensor(rng, DType::f32, {10, 1, 16}, -1, 1);
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(ok.q, k2, ok.v, ok.g, ok.beta); }, "k");
  Tensor v2 = Tensor::zeros(DType::f32, {9, 2, 8});
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(ok.q, ok.k, v2, ok.g, ok.beta); }, "v");
  Tensor g2 = Tensor::zeros(DType::f32, {10, 3});
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(ok.q, ok.k, ok.v, g2, ok.beta); }, "g");
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(ok.q, ok.k, ok.v, ok.g, g2); }, "beta");
  Tensor s0 = Tensor::zeros(DType::f32, {1, 2, 8, 4});
  gdn::ChunkOptions o;
  o.initial_state = s0;
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(ok.q, ok.k, ok.v, ok.g, ok.beta, o); }, "initial_state");
  Tensor i64 = Tensor::zeros(DType::i64, {10, 1, 8});
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(i64, ok.k, ok.v, ok.g, ok.beta); }, "q");
  Tensor big = Tensor::zeros(DType::f32, {10, 1, 300});
  expect_error([&] { gdn::chunk_gated_delta_rule_fwd(big, big, ok.v, ok.g, ok.beta); }, "q");
}

TEST(GdnErrors, NonFiniteInputs) {
  const char* names[] = {"q", "k", "v", "g", "beta"};
  for (int which = 0; which < 5; ++which)
    for (float bad : {NAN, INFINITY}) {
      Inputs in = make_inputs(small(), DType::bf16, 4);
      Tensor* t[] = {&in.q, &in.k, &in.v, &in.g, &in.beta};
      ot::set_from_double(*t[which], 3, bad);
      expect_error([&] { gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta); }, names[which]);
      expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta); }, names[which]);
    }
}

TEST(GdnErrors, Slots) {
  Shape s;
  s.B = 3, s.T = 1, s.HK = 1, s.HV = 2, s.DK = 8, s.DV = 8;
  Inputs in = make_inputs(s, DType::f32, 5);
  Tensor cache = Tensor::zeros(DType::f32, {4, 2, 8, 8});
  Tensor before = Tensor::copy_of(cache);
  for (std::vector<int32_t> sl : {std::vector<int32_t>{0, 4, 1}, {0, -1, 1}, {2, 1, 2}, {0, 1}}) {
    Tensor st = i32_tensor(sl);
    gdn::RecurrentOptions r;
    r.state_cache = cache;
    r.state_indices = st;
    expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r); }, "state_indices");
  }
  EXPECT_EQ(rel_err(cache, before), 0.0);  // nothing written
  Tensor st = i32_tensor({0, 1, 2}), na = i32_tensor({0, 2, 1});
  gdn::RecurrentOptions r;
  r.state_cache = cache;
  r.state_indices = st;
  r.num_accepted_tokens = na;
  expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r); }, "num_accepted_tokens");
  Tensor wrong = Tensor::zeros(DType::f32, {4, 2, 8, 4});
  r.num_accepted_tokens = {};
  r.state_cache = wrong;
  expect_error([&] { gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, r); }, "state_cache");
}

}  // namespace test_gdn_errors
