// Recurrent (decode / speculative) form: against the fp64 recurrence, state caches with slots and
// accepted-token counts, bf16 state, fused gates, and chunk prefill followed by decode.
#include <gtest/gtest.h>

#include <utility>

#include "gdn_test_util.h"
#include "ot/cpu.h"
#include "ot/error.h"

namespace test_gdn_recurrent {
using namespace gdn_test;
namespace gdn = ot::gdn;

TEST(GdnRecurrent, MatchesRecurrenceReference) {
  for (bool l2 : {false, true})
    for (DType dt : {DType::f32, DType::bf16}) {
      Shape s;
      s.B = 3, s.T = 5, s.HK = 2, s.HV = 4, s.DK = 32, s.DV = 48;
      Inputs in = make_inputs(s, dt, 40);
      std::mt19937 rng(41);
      Tensor S0 = rand_tensor(rng, DType::f32, {3, 4, 32, 48}, -0.5f, 0.5f);
      gdn::RecurrentOptions ro = recurrent_opts(l2, S0);
      gdn::RecurrentOut f = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, ro);
      gdn::ChunkFwd r = recurrence_truth(in, l2, S0);
      EXPECT_LT(rel_err(f.o, r.o), dt == DType::f32 ? 1e-5 : 1e-2);
      EXPECT_LT(rel_err(f.final_state, r.final_state), 1e-5);
      ot::cpu::ScopedForceRef force(true);
      gdn::RecurrentOut fr = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, ro);
      EXPECT_LT(rel_err(fr.final_state, r.final_state), 1e-6);
    }
}

TEST(GdnRecurrent, ChunkPrefillThenDecodeEqualsLongerPrefill) {
  Shape s;
  s.B = 2, s.T = 70, s.HK = 1, s.HV = 2, s.DK = 16, s.DV = 32;
  Inputs in = make_inputs(s, DType::f32, 50);
  gdn::ChunkOptions co;
  co.use_qk_l2norm_in_kernel = true;
  co.output_final_state = true;
  gdn::ChunkFwd full = gdn::chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, co);
  const int64_t P = 66;  // prefill 66 tokens, then decode 4 one at a time
  auto sl = [&](const Tensor& x, int64_t b, int64_t n) { return x.view().narrow(1, b, n); };
  gdn::ChunkFwd pre = gdn::chunk_gated_delta_rule_fwd(sl(in.q, 0, P), sl(in.k, 0, P), sl(in.v, 0, P), sl(in.g, 0, P), sl(in.beta, 0, P), co);
  // State cache of 5 slots; the two sequences live in slots 3 and 1.
  Tensor cache = Tensor::zeros(DType::f32, {5, 2, 16, 32});
  for (int n = 0; n < 2; ++n)
    ot::copy_into(pre.final_state.view().select(0, n), cache.view().select(0, n == 0 ? 3 : 1));
  Tensor slots = i32_tensor({3, 1});
  for (int64_t t = P; t < s.T; ++t) {
    gdn::RecurrentOptions ro;
    ro.use_qk_l2norm_in_kernel = true;
    ro.state_cache = cache;
    ro.state_indices = slots;
    gdn::RecurrentOut d = gdn::recurrent_gated_delta_rule(sl(in.q, t, 1), sl(in.k, t, 1), sl(in.v, t, 1), sl(in.g, t, 1), sl(in.beta, t, 1), ro);
    EXPECT_LT(rel_err(d.o, sl(full.o, t, 1)), 1e-4) << t;
  }
  EXPECT_LT(rel_err(cache.view().select(0, 3), full.final_state.view().select(0, 0)), 1e-4);
  EXPECT_LT(rel_err(cache.view().select(0, 1), full.final_state.view().select(0, 1)), 1e-4);
}

TEST(GdnRecurrent, AcceptedCountsEqualTruncatedInput) {
  // Varlen speculative batch: sequences of 3, 4 and 2 draft tokens.
  Shape s;
  s.T = 9, s.packed = true, s.HK = 2, s.HV = 2, s.DK = 16, s.DV = 16;
  Inputs in = make_inputs(s, DType::f32, 60);
  std::vector<int64_t> cu = {0, 3, 7, 9};
  std::vector<int32_t> acc = {2, 4, 0};
  std::mt19937 rng(61);
  Tensor cache0 = rand_tensor(rng, DType::f32, {4, 2, 16, 16}, -0.5f, 0.5f);
  Tensor cache = Tensor::copy_of(cache0);
  Tensor cut = cu_tensor(cu), slots = i32_tensor({2, 0, 3}), na = i32_tensor(acc);
  gdn::RecurrentOptions ro;
  ro.cu_seqlens = cut;
  ro.state_cache = cache;
  ro.state_indices = slots;
  ro.num_accepted_tokens = na;
  gdn::RecurrentOut all = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, ro);
  for (int n = 0; n < 3; ++n) {
    int64_t L = acc[size_t(n)];
    int32_t slot = slots.ptr<int32_t>()[n];
    if (L == 0) {
      EXPECT_EQ(rel_err(cache.view().select(0, slot), cache0.view().select(0, slot)), 0.0);
      continue;
    }
    auto sl = [&](const Tensor& x) { return x.view().narrow(0, cu[size_t(n)], L); };
    gdn::RecurrentOptions one;
    Tensor s0 = Tensor::copy_of(cache0.view().narrow(0, slot, 1));
    one.initial_state = s0;
    one.output_final_state = true;
    gdn::RecurrentOut t = gdn::recurrent_gated_delta_rule(sl(in.q), sl(in.k), sl(in.v), sl(in.g), sl(in.beta), one);
    EXPECT_LT(rel_err(cache.view().narrow(0, slot, 1), t.final_state), 1e-6) << n;
    EXPECT_LT(rel_err(all.o.view().narrow(0, cu[size_t(n)], L), t.o), 1e-6) << n;
  }
}

TEST(GdnRecurrent, PerTokenSnapshotsAndAcceptedReadSlot) {
  // Step 1 writes a snapshot after every draft token; step 2 resumes from the accepted one.
  Shape s;
  s.T = 6, s.packed = true, s.HK = 1, s.HV = 2, s.DK = 16, s.DV = 8;
  Inputs in = make_inputs(s, DType::f32, 70);
  Tensor cut = cu_tensor({0, 3, 6});
  Tensor cache = Tensor::zeros(DType::f32, {8, 2, 16, 8});
  Tensor tok_slots = i32_tensor({0, 1, 2, 4, 5, 6});
  gdn::RecurrentOptions ro;
  ro.cu_seqlens = cut;
  ro.state_cache = cache;
  ro.state_indices = tok_slots;
  gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, ro);
  // Snapshot of token 1 of sequence 0 == the state after its first two tokens.
  auto sl = [&](const Tensor& x, int64_t b, int64_t n) { return x.view().narrow(0, b, n); };
  gdn::RecurrentOptions one;
  one.output_final_state = true;
  gdn::RecurrentOut t = gdn::recurrent_gated_delta_rule(sl(in.q, 0, 2), sl(in.k, 0, 2), sl(in.v, 0, 2), sl(in.g, 0, 2), sl(in.beta, 0, 2), one);
  EXPECT_LT(rel_err(cache.view().select(0, 1), t.final_state.view().select(0, 0)), 1e-6);
  // Next step for sequence 0 only (3 new tokens) with 2 accepted: reads slot tok_slots[bos + 1].
  Tensor slots2 = i32_tensor({0, 1, 3}), na = i32_tensor({2}), cu2 = cu_tensor({0, 3});
  gdn::RecurrentOptions r2;
  r2.cu_seqlens = cu2;
  r2.state_cache = cache;
  r2.state_indices = slots2;
  r2.num_accepted_tokens = na;
  Tensor snap1 = Tensor::copy_of(cache.view().narrow(0, 1, 1));
  gdn::RecurrentOut o2 = gdn::recurrent_gated_delta_rule(sl(in.q, 3, 3), sl(in.k, 3, 3), sl(in.v, 3, 3), sl(in.g, 3, 3), sl(in.beta, 3, 3), r2);
  gdn::RecurrentOptions ref;
  ref.initial_state = snap1;
  gdn::RecurrentOut e = gdn::recurrent_gated_delta_rule(sl(in.q, 3, 3), sl(in.k, 3, 3), sl(in.v, 3, 3), sl(in.g, 3, 3), sl(in.beta, 3, 3), ref);
  EXPECT_LT(rel_err(o2.o, e.o), 1e-6);
}

TEST(GdnRecurrent, Bf16StateAndFusedGates) {
  Shape s;
  s.B = 4, s.T = 1, s.HK = 2, s.HV = 4, s.DK = 32, s.DV = 32;
  Inputs in = make_inputs(s, DType::bf16, 80);
  std::mt19937 rng(81);
  Tensor a = rand_tensor(rng, DType::f32, {4, 1, 4}, -3.f, 3.f), b = rand_tensor(rng, DType::f32, {4, 1, 4}, -3.f, 3.f);
  Tensor A_log = rand_tensor(rng, DType::f32, {4}, -1.f, 1.f), dt_bias = rand_tensor(rng, DType::f32, {4}, -1.f, 1.f);
  Tensor cache32 = rand_tensor(rng, DType::f32, {6, 4, 32, 32}, -0.5f, 0.5f);
  Tensor cache16 = Tensor::empty(DType::bf16, cache32.shape());
  ot::copy_into(cache32, cache16);
  Tensor slots = i32_tensor({5, 0, 2, 3});
  gdn::RecurrentOptions ro;
  ro.use_qk_l2norm_in_kernel = true;
  ro.A_log = A_log, ro.dt_bias = dt_bias, ro.beta_sigmoid = true;
  ro.state_indices = slots;
  ro.state_cache = cache16;
  gdn::RecurrentOut f16 = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, a, b, ro);
  ro.state_cache = cache32;
  Tensor c32_before = Tensor::copy_of(cache32);
  gdn::RecurrentOut f32 = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, a, b, ro);
  // Explicit gates through the plain path give the same (fp32 state).
  Tensor g = Tensor::empty(DType::f32, {4, 1, 4}), be = Tensor::empty(DType::f32, {4, 1, 4});
  for (int i = 0; i < 16; ++i) {
    float x = a.ptr<float>()[i] + dt_bias.ptr<float>()[i % 4];
    float sp = x > 20 ? x : std::log1p(std::exp(x));
    g.ptr<float>()[i] = -std::exp(A_log.ptr<float>()[i % 4]) * sp;
    be.ptr<float>()[i] = 1.f / (1.f + std::exp(-b.ptr<float>()[i]));
  }
  gdn::RecurrentOptions plain;
  plain.use_qk_l2norm_in_kernel = true;
  plain.state_cache = c32_before;
  plain.state_indices = slots;
  gdn::RecurrentOut p = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, g, be, plain);
  EXPECT_LT(rel_err(f32.o, p.o), 1e-5);
  EXPECT_LT(rel_err(cache32, c32_before), 1e-6);
  // bf16 state: same result to bf16 accuracy.
  EXPECT_LT(rel_err(f16.o, f32.o), 2e-2);
  EXPECT_LT(rel_err(cache16, cache32), 1e-2);
  EXPECT_GT(rel_err(cache16, cache32), 0.0);
}

// The vector step kernels take whole 32-column tiles (DV % 32 == 0) with a state to read: DK 33 (an
// odd row left after the row pairs), DV 64 (two tiles: the next tile's prefetch), fp32 state through
// initial / final state and bf16 state through a cache, at every ISA this machine has.
TEST(GdnRecurrent, TiledStepAtEveryIsaMatchesReference) {
  using ot::cpu::Isa;
  Shape s;
  s.B = 2, s.T = 3, s.HK = 1, s.HV = 2, s.DK = 33, s.DV = 64;
  Inputs in = make_inputs(s, DType::f32, 90);
  std::mt19937 rng(91);
  Tensor S0 = rand_tensor(rng, DType::f32, {2, 2, 33, 64}, -0.5f, 0.5f);
  Tensor cache32 = rand_tensor(rng, DType::f32, {3, 2, 33, 64}, -0.5f, 0.5f);
  Tensor slots = i32_tensor({2, 0});
  auto decode_bf16 = [&] {
    Tensor cache = Tensor::empty(DType::bf16, cache32.shape());
    ot::copy_into(cache32, cache);
    gdn::RecurrentOptions ro;
    ro.state_cache = cache;
    ro.state_indices = slots;
    auto one = [](const Tensor& x) { return x.view().narrow(1, 0, 1); };
    gdn::RecurrentOut d = gdn::recurrent_gated_delta_rule(one(in.q), one(in.k), one(in.v), one(in.g), one(in.beta), ro);
    return std::make_pair(Tensor::copy_of(d.o), cache);
  };
  gdn::ChunkFwd truth = recurrence_truth(in, false, S0);
  std::pair<Tensor, Tensor> ref16;
  {
    ot::cpu::ScopedForceRef force(true);
    ref16 = decode_bf16();
  }
  for (Isa cap : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (cap != Isa::scalar && !ot::cpu::has(cap)) continue;
    ot::cpu::ScopedMaxIsa limit(cap);
    gdn::RecurrentOut f = gdn::recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, recurrent_opts(false, S0));
    EXPECT_LT(rel_err(f.o, truth.o), 1e-5) << ot::cpu::isa_name(cap);
    EXPECT_LT(rel_err(f.final_state, truth.final_state), 1e-5) << ot::cpu::isa_name(cap);
    std::pair<Tensor, Tensor> got = decode_bf16();
    EXPECT_LT(rel_err(got.first, ref16.first), 1e-2) << ot::cpu::isa_name(cap);
    EXPECT_LT(rel_err(got.second, ref16.second), 1e-2) << ot::cpu::isa_name(cap);
  }
}

}  // namespace test_gdn_recurrent
