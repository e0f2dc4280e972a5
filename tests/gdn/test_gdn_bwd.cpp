// chunk_gated_delta_rule_bwd against the fp64 ground truth (the token recurrence differentiated
// exactly) and against central finite differences of loss = sum(o * dO) + sum(S_T * dht).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "ot/cpu.h"
#include "ot/gdn.h"
#include "ot/gdn_bwd.h"
#include "gdn_bwd_test_util.h"
#include "gdn_test_util.h"
#include "src/ref/gdn_bwd_ref.h"
#include "src/gdn/gdn_internal.h"

namespace test_gdn_bwd {
namespace {

using namespace ot;
using namespace ot::gdn;
namespace gd = ot::gdn::detail;
using gd::Tok;
using std::vector;
using gdn_test::expect_grads_close;

struct Case {
  int64_t B, T;
  vector<int64_t> cu;  // empty: fixed length
  int64_t HK, HV, DK, DV;
  bool l2, s0, dht;
  DType dt;
  Layout layout;
  float gmin = -2.f;  // gates uniform in [gmin, 0], every 7th exactly 0
};

struct Inputs {
  Tensor q, k, v, g, beta, dO, h0, dht, cu;
  int64_t N = 0;
};

Tensor vec_tensor(const Case& c, DType dt, int64_t H, int64_t D) {
  bool packed = !c.cu.empty();
  std::vector<int64_t> s = c.layout == Layout::BTHD ? std::vector<int64_t>{c.B, c.T, H, D} : std::vector<int64_t>{c.B, H, c.T, D};
  if (packed) s.erase(s.begin());
  return Tensor::empty(dt, s);
}
Tensor scal_tensor(const Case& c, int64_t H) {
  bool packed = !c.cu.empty();
  std::vector<int64_t> s = c.layout == Layout::BTHD ? std::vector<int64_t>{c.B, c.T, H} : std::vector<int64_t>{c.B, H, c.T};
  if (packed) s.erase(s.begin());
  return Tensor::empty(DType::f32, s);
}

Inputs make_inputs(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01;
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  Inputs in;
  in.N = c.cu.empty() ? c.B : int64_t(c.cu.size()) - 1;
  if (!c.cu.empty()) {
    in.cu = Tensor::empty(DType::i64, {int64_t(c.cu.size())});
    for (size_t i = 0; i < c.cu.size(); ++i) in.cu.ptr<int64_t>()[i] = c.cu[i];
  }
  // Without the in-kernel l2norm keys are scaled to unit-ish norm so I + M stays well conditioned.
  float ks = c.l2 ? 1.f : 1.f / std::sqrt(float(c.DK));
  auto fill = [&](Tensor& t, float s) {
    for (int64_t i = 0; i < t.numel(); ++i) set_from_double(t.view(), i, s * n01(rng));
  };
  in.q = vec_tensor(c, c.dt, c.HK, c.DK), fill(in.q, ks);
  in.k = vec_tensor(c, c.dt, c.HK, c.DK), fill(in.k, ks);
  in.v = vec_tensor(c, c.dt, c.HV, c.DV), fill(in.v, 1.f);
  in.dO = vec_tensor(c, c.dt, c.HV, c.DV), fill(in.dO, 1.f);
  in.g = scal_tensor(c, c.HV);
  in.beta = scal_tensor(c, c.HV);
  for (int64_t i = 0; i < in.g.numel(); ++i) {
    in.g.ptr<float>()[i] = i % 7 == 3 ? 0.f : c.gmin * u01(rng);
    in.beta.ptr<float>()[i] = u01(rng);
  }
  if (c.s0) in.h0 = Tensor::empty(DType::f32, {in.N, c.HV, c.DK, c.DV}), fill(in.h0, 1.f);
  if (c.dht) in.dht = Tensor::empty(DType::f32, {in.N, c.HV, c.DK, c.DV}), fill(in.dht, 1.f);
  return in;
}

// What the forward and backward options share: layout, cu_seqlens, initial state, l2norm.
template <class O> O options(const Case& c, const Inputs& in) {
  O o;
  o.layout = c.layout;
  if (in.cu.defined()) o.cu_seqlens = in.cu;
  if (in.h0.defined()) o.initial_state = in.h0;
  o.use_qk_l2norm_in_kernel = c.l2;
  return o;
}

ChunkBwdOptions bwd_options(const Case& c, const Inputs& in) {
  auto o = options<ChunkBwdOptions>(c, in);
  if (in.dht.defined()) o.dht = in.dht;
  return o;
}

ChunkFwd run_fwd(const Case& c, const Inputs& in) {
  auto f = options<ChunkOptions>(c, in);
  f.save_for_backward = true;
  return chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
}

std::string name_of(const Case& c) {
  return ot::detail::cat("B", c.B, " T", c.T, " cu", c.cu.size(), " HK", c.HK, " HV", c.HV, " DK", c.DK, " DV", c.DV, " l2", c.l2, " s0", c.s0,
                     " dht", c.dht, " ", dtype_name(c.dt), " ", layout_name(c.layout));
}

void check_against_truth(const Case& c, unsigned seed) {
  SCOPED_TRACE(name_of(c));
  Inputs in = make_inputs(c, seed);
  ChunkFwd fwd = run_fwd(c, in);
  ChunkBwdOptions o = bwd_options(c, in);
  ChunkBwd want = ref::recurrence_bwd(in.q, in.k, in.v, in.g, in.beta, in.dO, o);
  o.A = fwd.A;
  ChunkBwd got = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  // bf16 inputs: both sides read the same rounded inputs; what remains is fp32 arithmetic and the
  // bf16 rounding of dq, dk, dv (2^-9 relative) where
  // an element lands on the other side of a rounding boundary. Measured: fp32 <= 3e-6, bf16 <= 4e-4.
  double tol = c.dt == DType::f32 ? 2e-5 : 2e-3;
  expect_grads_close(got, want, tol, "chunked vs fp64 recurrence");
}

TEST(GdnBwd, FixedLengthShapes) {
  // T not a multiple of 64, T < 64, T == 64; HV/HK in {1, 2, 4}; DK != DV; l2norm on/off; states.
  check_against_truth({1, 100, {}, 1, 1, 16, 8, false, false, false, DType::f32, Layout::BTHD}, 1);
  check_against_truth({2, 130, {}, 2, 4, 16, 24, true, true, true, DType::f32, Layout::BTHD}, 2);
  check_against_truth({1, 64, {}, 1, 2, 32, 32, true, false, true, DType::f32, Layout::BTHD}, 3);
  check_against_truth({2, 37, {}, 2, 8, 8, 16, false, true, false, DType::f32, Layout::BTHD}, 4);
  check_against_truth({1, 1, {}, 1, 2, 8, 8, true, true, true, DType::f32, Layout::BTHD}, 5);
}

TEST(GdnBwd, HeadMajorLayout) {
  check_against_truth({2, 90, {}, 2, 4, 16, 16, true, true, true, DType::f32, Layout::BHTD}, 6);
}

TEST(GdnBwd, Bf16Inputs) {
  check_against_truth({1, 150, {}, 2, 4, 32, 16, true, true, true, DType::bf16, Layout::BTHD}, 7);
  check_against_truth({2, 70, {}, 1, 1, 16, 16, false, false, true, DType::bf16, Layout::BHTD}, 8);
  // Qwen3.5 head dims (128) over several chunks; a varlen batch with weak decays (gates in [-0.05, 0]).
  check_against_truth({1, 300, {}, 1, 2, 128, 128, true, true, true, DType::bf16, Layout::BTHD}, 15);
  Case weak{1, 200, {0, 1, 130, 200}, 1, 1, 64, 128, true, false, true, DType::bf16, Layout::BTHD};
  weak.gmin = -0.05f;
  check_against_truth(weak, 16);
}

TEST(GdnBwd, Bf16ProductsOptIn) {
  // bf16_compute: every product on bf16-rounded operands; within 1e-2 of the fp64 gradients
  // (measured <= 6e-3), and not the fp32-product result (the option is taken).
  for (Case c : {Case{1, 300, {}, 1, 2, 128, 128, true, true, true, DType::bf16, Layout::BTHD},
                 Case{1, 140, {0, 1, 65, 140}, 1, 2, 32, 64, false, true, true, DType::bf16, Layout::BHTD}}) {
    SCOPED_TRACE(name_of(c));
    Inputs in = make_inputs(c, 31);
    ChunkFwd fwd = run_fwd(c, in);
    ChunkBwdOptions o = bwd_options(c, in);
    ChunkBwd want = ref::recurrence_bwd(in.q, in.k, in.v, in.g, in.beta, in.dO, o);
    o.A = fwd.A;
    ChunkBwd fp32 = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
    o.bf16_compute = true;
    ChunkBwd got = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
    expect_grads_close(got, want, 1e-2, "bf16 products vs fp64 recurrence");
    EXPECT_GT(gdn_test::rel_rms(got.dk.view(), fp32.dk.view()), 1e-4);
  }
}

TEST(GdnBwd, Varlen) {
  // Packed batch with a 1-token and a 0-token sequence and a partial last chunk.
  check_against_truth({1, 205, {0, 70, 71, 71, 205}, 2, 4, 16, 8, true, true, true, DType::f32, Layout::BTHD}, 9);
  check_against_truth({1, 140, {0, 1, 65, 140}, 1, 2, 16, 16, false, true, false, DType::bf16, Layout::BHTD}, 10);
}

TEST(GdnBwd, StrongDecay) {
  Case c{1, 200, {}, 1, 2, 16, 16, true, true, true, DType::f32, Layout::BTHD};
  c.gmin = -20.f;
  check_against_truth(c, 11);
}

TEST(GdnBwd, VarlenEqualsSeparateSequences) {
  // The packed run equals fixed-length runs of each sequence (here: two of 70 tokens).
  Case packed{1, 140, {0, 70, 140}, 2, 4, 16, 16, true, true, true, DType::f32, Layout::BTHD};
  Case fixed{2, 70, {}, 2, 4, 16, 16, true, true, true, DType::f32, Layout::BTHD};
  Inputs p = make_inputs(packed, 12);
  Inputs f = make_inputs(fixed, 12);
  // Same values: the packed [T,H,D] tensors are the fixed [B,T,H,D] ones in the same memory order.
  for (auto [dst, src] : {std::pair{&p.q, &f.q}, {&p.k, &f.k}, {&p.v, &f.v}, {&p.dO, &f.dO}, {&p.g, &f.g}, {&p.beta, &f.beta},
                          {&p.h0, &f.h0}, {&p.dht, &f.dht}})
    std::memcpy(dst->view().data, src->view().data, src->view().nbytes());
  ChunkFwd fp = run_fwd(packed, p), ff = run_fwd(fixed, f);
  ChunkBwdOptions op = bwd_options(packed, p), of = bwd_options(fixed, f);
  op.A = fp.A, of.A = ff.A;
  ChunkBwd a = chunk_gated_delta_rule_bwd(p.q, p.k, p.v, fp.g_cumsum, p.beta, p.dO, op);
  ChunkBwd b = chunk_gated_delta_rule_bwd(f.q, f.k, f.v, ff.g_cumsum, f.beta, f.dO, of);
  for (auto [x, y] : {std::pair{&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}, {&a.dg, &b.dg}, {&a.dbeta, &b.dbeta}, {&a.dh0, &b.dh0}})
    EXPECT_EQ(0, std::memcmp(x->view().data, y->view().data, y->view().nbytes()));
}

TEST(GdnBwd, RecomputedAEqualsSavedA) {
  Case c{1, 130, {}, 1, 2, 16, 16, true, true, true, DType::f32, Layout::BTHD};
  Inputs in = make_inputs(c, 13);
  ChunkFwd fwd = run_fwd(c, in);
  ChunkBwdOptions o = bwd_options(c, in);
  ChunkBwd recomputed = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  o.A = fwd.A;
  ChunkBwd saved = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  expect_grads_close(recomputed, saved, 1e-6, "recomputed A vs saved A");
}

// The forward's saved h and v_new (save_states) replace the backward's recompute: the states
// themselves equal the fp64 stage references, and the gradients equal the recomputing backward's
// and the ground truth (fp32 and the bf16 fused forward; varlen with an empty sequence; groups).
void check_saved_states(const Case& c, unsigned seed) {
  SCOPED_TRACE(name_of(c));
  Inputs in = make_inputs(c, seed);
  auto f = options<ChunkOptions>(c, in);
  f.save_states = true;
  ChunkFwd fwd = chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
  ASSERT_TRUE(fwd.h.defined() && fwd.v_new.defined());
  ChunkFwd want_states;
  {
    cpu::ScopedForceRef force(true);
    want_states = chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
  }
  // The bf16 fused forward's W, U take bf16 K, V exactly, so its states are fp32-accurate too.
  EXPECT_LT(gdn_test::rel_rms(fwd.h.view(), want_states.h.view()), 1e-4);
  EXPECT_LT(gdn_test::rel_rms(fwd.v_new.view(), want_states.v_new.view()), 1e-4);
  ChunkBwdOptions o = bwd_options(c, in);
  o.A = fwd.A;
  ChunkBwd recomputed = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  o.h = fwd.h, o.v_new = fwd.v_new;
  ChunkBwd saved = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  const double tol = c.dt == DType::f32 ? 2e-5 : 2e-3;
  expect_grads_close(saved, recomputed, tol, "saved states vs recomputed");
  expect_grads_close(saved, ref::recurrence_bwd(in.q, in.k, in.v, in.g, in.beta, in.dO, bwd_options(c, in)), tol, "saved states vs fp64");
  // The saved states are what it reads: scaled ones move the gradients.
  Tensor h2 = Tensor::empty(DType::f32, fwd.h.view().shape());
  for (int64_t i = 0; i < h2.numel(); ++i) h2.ptr<float>()[i] = 1.5f * fwd.h.ptr<float>()[i];
  o.h = h2;
  ChunkBwd tampered = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  EXPECT_GT(gdn_test::rel_rms(tampered.dq.view(), saved.dq.view()), 1e-2);
}

TEST(GdnBwd, SavedStatesReplaceTheRecompute) {
  check_saved_states({1, 205, {0, 70, 71, 71, 205}, 2, 4, 16, 8, true, true, true, DType::f32, Layout::BTHD}, 21);
  check_saved_states({2, 130, {}, 1, 2, 32, 16, false, false, true, DType::f32, Layout::BHTD}, 22);
  check_saved_states({1, 150, {}, 1, 2, 128, 128, true, true, true, DType::bf16, Layout::BTHD}, 23);
  check_saved_states({1, 140, {0, 1, 65, 140}, 1, 2, 32, 64, false, true, false, DType::bf16, Layout::BHTD}, 24);
}

TEST(GdnBwd, SavedStatesAreCheckedBeforeUse) {
  Case c{1, 100, {}, 1, 2, 16, 16, false, false, false, DType::f32, Layout::BTHD};
  Inputs in = make_inputs(c, 25);
  auto f = options<ChunkOptions>(c, in);
  f.save_states = true;
  ChunkFwd fwd = chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta, f);
  ChunkBwdOptions o = bwd_options(c, in);
  o.h = fwd.h;  // v_new missing
  gdn_test::expect_error([&] { chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "v_new");
  o.h = TensorView{}, o.v_new = fwd.v_new;
  gdn_test::expect_error([&] { chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "h");
  o.h = fwd.A, o.v_new = fwd.v_new;  // not a chunk-state tensor
  gdn_test::expect_error([&] { chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "h");
  o.h = fwd.h, o.v_new = fwd.A;  // [.., 64] instead of [.., DV]
  gdn_test::expect_error([&] { chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "v_new");
}

TEST(GdnBwd, ForceRefRoutesToTheRecurrence) {
  Case c{1, 80, {}, 1, 2, 8, 8, true, true, true, DType::f32, Layout::BTHD};
  Inputs in = make_inputs(c, 14);
  ChunkFwd fwd = run_fwd(c, in);
  ChunkBwdOptions o = bwd_options(c, in);
  ChunkBwd want = ref::recurrence_bwd(in.q, in.k, in.v, in.g, in.beta, in.dO, o);
  cpu::ScopedForceRef force(true);
  ChunkBwd got = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
  // Only the raw gate differs (recovered from the fp32 cumsum).
  expect_grads_close(got, want, 1e-5, "forced reference");
}

// ---- finite differences of the fp64 loss, against the chunked (fp32) gradients ---------------

// loss = sum(o * dO) + sum(S_T * dht) in fp64, o and S_T from the ground-truth forward.
double loss64(const Case& c, const Inputs& in) {
  Tok q = gd::tok_vec(in.q, c.layout, "t", "q"), k = gd::tok_vec(in.k, c.layout, "t", "k"), v = gd::tok_vec(in.v, c.layout, "t", "v");
  Tok dO = gd::tok_vec(in.dO, c.layout, "t", "dO"), g = gd::tok_scal(in.g, c.layout, "t", "g");
  Tok be = gd::tok_scal(in.beta, c.layout, "t", "beta");
  SeqInfo s = make_seq_info(q.B, q.T, in.cu.defined() ? in.cu.view() : TensorView{});
  const int64_t K = c.DK, V = c.DV, G = c.HV / c.HK;
  double l = 0;
  for (int64_t n = 0; n < s.num_seqs(); ++n)
    for (int64_t hv = 0; hv < c.HV; ++hv) {
      int64_t b = s.row[size_t(n)], bos = s.bos[size_t(n)], L = s.len[size_t(n)];
      vector<double> qv(size_t(L * K)), kv(size_t(L * K)), vv(size_t(L * V)), bv(static_cast<size_t>(L)), gv(static_cast<size_t>(L)), S0(size_t(K * V));
      vector<double> o(size_t(L * V)), ST(size_t(K * V));
      for (int64_t t = 0; t < L; ++t) {
        for (int64_t d = 0; d < K; ++d) qv[size_t(t * K + d)] = q.get(b, bos + t, hv / G, d), kv[size_t(t * K + d)] = k.get(b, bos + t, hv / G, d);
        for (int64_t e = 0; e < V; ++e) vv[size_t(t * V + e)] = v.get(b, bos + t, hv, e);
        bv[size_t(t)] = be.get(b, bos + t, hv, 0), gv[size_t(t)] = g.get(b, bos + t, hv, 0);
      }
      if (in.h0.defined())
        for (int64_t i = 0; i < K * V; ++i) S0[size_t(i)] = in.h0.ptr<float>()[(n * c.HV + hv) * K * V + i];
      bwdref::Head h;
      h.L = L, h.K = K, h.V = V, h.q = qv.data(), h.k = kv.data(), h.v = vv.data(), h.beta = bv.data(), h.g = gv.data();
      h.S0 = in.h0.defined() ? S0.data() : nullptr, h.scale = 1.0 / std::sqrt(double(K)), h.l2norm = c.l2;
      bwdref::head_fwd(h, o.data(), ST.data());
      for (int64_t t = 0; t < L; ++t)
        for (int64_t e = 0; e < V; ++e) l += o[size_t(t * V + e)] * dO.get(b, bos + t, hv, e);
      if (in.dht.defined())
        for (int64_t i = 0; i < K * V; ++i) l += ST[size_t(i)] * in.dht.ptr<float>()[(n * c.HV + hv) * K * V + i];
    }
  return l;
}

// Central differences at `samples` random elements of x (fp32 storage) vs the analytic gradient.
void expect_fd(const Case& c, Inputs& in, Tensor& x, const Tensor& grad, const char* name, std::mt19937& rng) {
  const int samples = 12;
  double gscale = 0;
  for (int64_t i = 0; i < grad.numel(); ++i) gscale = std::max(gscale, std::fabs(get_as_double(grad.view(), i)));
  std::uniform_int_distribution<int64_t> pick(0, x.numel() - 1);
  for (int s = 0; s < samples; ++s) {
    int64_t i = pick(rng);
    float* p = x.ptr<float>() + i;
    float x0 = *p, h = 1e-3f * std::max(1.f, std::fabs(x0));
    *p = x0 + h;
    double hp = double(*p) - x0, lp = loss64(c, in);
    *p = x0 - h;
    double hm = x0 - double(*p), lm = loss64(c, in);
    *p = x0;
    double fd = (lp - lm) / (hp + hm), an = get_as_double(grad.view(), i);
    EXPECT_NEAR(an, fd, 2e-3 * std::max(1.0, gscale)) << name << " element " << i;
  }
}

TEST(GdnBwd, FiniteDifferences) {
  for (bool l2 : {false, true}) {
    // Varlen with a 1-token sequence and a partial chunk, GVA 2, initial state and dht.
    Case c{1, 103, {0, 37, 38, 103}, 1, 2, 8, 8, l2, true, true, DType::f32, Layout::BTHD};
    SCOPED_TRACE(name_of(c));
    Inputs in = make_inputs(c, 20 + l2);
    ChunkFwd fwd = run_fwd(c, in);
    ChunkBwdOptions o = bwd_options(c, in);
    o.A = fwd.A;
    ChunkBwd r = chunk_gated_delta_rule_bwd(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, o);
    std::mt19937 rng(99);
    expect_fd(c, in, in.q, r.dq, "dq", rng);
    expect_fd(c, in, in.k, r.dk, "dk", rng);
    expect_fd(c, in, in.v, r.dv, "dv", rng);
    expect_fd(c, in, in.beta, r.dbeta, "dbeta", rng);
    expect_fd(c, in, in.g, r.dg, "dg", rng);
    expect_fd(c, in, in.h0, r.dh0, "dh0", rng);
  }
}

// The two independent fp64 forwards (the forward's recurrence and this ground truth) agree.
TEST(GdnBwd, GroundTruthForwardMatchesForwardReference) {
  Case c{1, 90, {0, 40, 90}, 1, 2, 8, 8, true, true, true, DType::f32, Layout::BTHD};
  Inputs in = make_inputs(c, 30);
  ChunkOptions f;
  f.cu_seqlens = in.cu, f.initial_state = in.h0, f.use_qk_l2norm_in_kernel = true, f.output_final_state = true;
  ChunkFwd theirs = ref::recurrence(in.q, in.k, in.v, in.g, in.beta, f);
  // loss64 built from theirs must equal ours.
  double l = 0;
  for (int64_t i = 0; i < theirs.o.numel(); ++i) l += double(theirs.o.ptr<float>()[i]) * in.dO.ptr<float>()[i];
  for (int64_t i = 0; i < theirs.final_state.numel(); ++i) l += double(theirs.final_state.ptr<float>()[i]) * in.dht.ptr<float>()[i];
  double mine = loss64(c, in);
  EXPECT_NEAR(l, mine, 1e-5 * std::max(1.0, std::fabs(mine)));
}

// ---- bad input: ot::Error naming the argument --------------------------------------------------

void expect_bwd_error(const std::function<void()>& fn, const std::string& arg) {
  gdn_test::expect_error(fn, arg, "chunk_gated_delta_rule_bwd");
}

TEST(GdnBwd, BadInput) {
  Case c{1, 70, {}, 2, 4, 8, 8, false, true, true, DType::f32, Layout::BTHD};
  Inputs in = make_inputs(c, 40);
  ChunkFwd fwd = run_fwd(c, in);
  auto call = [&](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& G, const TensorView& beta,
                  const TensorView& dO, const ChunkBwdOptions& o) { chunk_gated_delta_rule_bwd(q, k, v, G, beta, dO, o); };
  ChunkBwdOptions o = bwd_options(c, in);
  Tensor q3 = Tensor::zeros(DType::f32, {1, 70, 3, 8}), v3 = Tensor::zeros(DType::f32, {1, 70, 3, 8});
  Tensor short_dO = Tensor::zeros(DType::f32, {1, 69, 4, 8});
  Tensor bad_state = Tensor::zeros(DType::f32, {1, 4, 8, 4});
  Tensor i32 = Tensor::zeros(DType::i32, {1, 70, 4, 8});
  Tensor nan_v = Tensor::copy_of(in.v);
  nan_v.ptr<float>()[5] = std::nanf("");
  Tensor badA = Tensor::zeros(DType::f32, {1, 70, 4, 32});
  expect_bwd_error([&] { call(q3, q3, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "v");  // HV % HK != 0
  expect_bwd_error([&] { call(in.q, q3, in.v, fwd.g_cumsum, in.beta, in.dO, o); }, "k");
  expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, in.beta, short_dO, o); }, "dO");
  expect_bwd_error([&] { call(in.q, in.k, in.v, {}, in.beta, in.dO, o); }, "g_cumsum");
  expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, {}, in.dO, o); }, "beta");
  expect_bwd_error([&] { call(in.q, in.k, i32, fwd.g_cumsum, in.beta, in.dO, o); }, "v");
  expect_bwd_error([&] { call(in.q, in.k, nan_v, fwd.g_cumsum, in.beta, in.dO, o); }, "v");
  expect_bwd_error([&] { call(in.q, in.k, v3, fwd.g_cumsum, in.beta, in.dO, o); }, "v");
  {
    ChunkBwdOptions b = o;
    b.initial_state = bad_state;
    expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, b); }, "initial_state");
  }
  {
    ChunkBwdOptions b = o;
    b.dht = bad_state;
    expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, b); }, "dht");
  }
  {
    ChunkBwdOptions b = o;
    b.A = badA;
    expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, b); }, "A");
  }
  {
    ChunkBwdOptions b = o;
    Tensor cu = Tensor::empty(DType::i64, {2});
    cu.ptr<int64_t>()[0] = 0, cu.ptr<int64_t>()[1] = 69;  // does not end at T
    b.cu_seqlens = cu;
    expect_bwd_error([&] { call(in.q, in.k, in.v, fwd.g_cumsum, in.beta, in.dO, b); }, "cu_seqlens");
  }
}

}  // namespace

}  // namespace test_gdn_bwd
