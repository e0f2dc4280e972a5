// moe_ffn_backward (the whole layer): the reference against finite differences of an fp64 layer
// forward with the selection held fixed, the fast path against the reference (routers, capacity
// drops, k = 1 and k = E, shared expert, aux/z losses, fp32 and bf16), the training forward
// against the library's moe_ffn reference, and the fast path against the composition of the
// per-operator backwards (init routing -> grouped matmul (SwiGLU) -> grouped matmul -> unpermute).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "moe/moe_bwd_test_util.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/parallel.h"
#include "src/moe/ffn_bwd_common.h"

namespace test_moe_ffn_backward {
using namespace ot;
using namespace ot::moe;
using namespace ot::moe::bwdtest;

namespace {

// The detected ISA and every GEMM kernel level below it that differs (avx512, avx2, scalar).
std::vector<cpu::Isa> isa_levels() {
  std::vector<cpu::Isa> v{cpu::detected_isa()};
  for (cpu::Isa i : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::scalar})
    if (int(i) < int(cpu::detected_isa())) v.push_back(i);
  return v;
}

struct Layer {
  int64_t T, H, I, E, K, Is;
  DType dt;
  Tensor x, router, gate, up, down, sg, su, sd;
  Layer(int64_t T_, int64_t H_, int64_t I_, int64_t E_, int64_t K_, int64_t Is_, DType dt_, uint64_t seed)
      : T(T_), H(H_), I(I_), E(E_), K(K_), Is(Is_), dt(dt_) {
    x = randn(dt, {T, H}, seed);
    router = randn(dt, {E, H}, seed + 1, 0.7);
    gate = randn(dt, {E, H, I}, seed + 2, 0.5);
    up = randn(dt, {E, H, I}, seed + 3, 0.5);
    down = randn(dt, {E, I, H}, seed + 4, 0.5);
    if (Is) {
      sg = randn(dt, {H, Is}, seed + 5, 0.5);
      su = randn(dt, {H, Is}, seed + 6, 0.5);
      sd = randn(dt, {Is, H}, seed + 7, 0.5);
    }
  }
  MoeFfnWeights w() const { return {router, gate, up, down, Is ? sg.view() : TensorView(), Is ? su.view() : TensorView(), Is ? sd.view() : TensorView()}; }
};

double silu(double v) { return v / (1 + std::exp(-v)); }

// fp64 layer forward for a v1 (softmax top-k) router with fixed ids and kept mask.
struct Fwd64 {
  const Layer& L;
  std::vector<int64_t> ids;
  std::vector<char> kept;
  bool renorm;
  std::vector<double> x, r, g, u, d, sg, su, sd;
  double loss(const std::vector<double>& G) const {
    const int64_t T = L.T, H = L.H, I = L.I, E = L.E, K = L.K;
    double s = 0;
    auto ffn = [&](int64_t t, const double* Wg, const double* Wu, const double* Wd, int64_t n, std::vector<double>& out) {
      out.assign(size_t(H), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        double a = 0, b = 0;
        for (int64_t h = 0; h < H; ++h) { a += x[size_t(t * H + h)] * Wg[h * n + i]; b += x[size_t(t * H + h)] * Wu[h * n + i]; }
        double act = silu(a) * b;
        for (int64_t h = 0; h < H; ++h) out[size_t(h)] += act * Wd[i * H + h];
      }
    };
    std::vector<double> o;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> lg(static_cast<size_t>(E));
      double mx = -1e300, z = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t h = 0; h < H; ++h) lg[size_t(e)] += x[size_t(t * H + h)] * r[size_t(e * H + h)];
        mx = std::max(mx, lg[size_t(e)]);
      }
      for (auto& v : lg) z += (v = std::exp(v - mx));
      double S = 0;
      for (int64_t k = 0; k < K; ++k) S += lg[size_t(ids[size_t(t * K + k)])] / z;
      std::vector<double> y(static_cast<size_t>(H), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        if (!kept[size_t(t * K + k)]) continue;
        int64_t e = ids[size_t(t * K + k)];
        double wt = lg[size_t(e)] / z / (renorm ? S : 1.0);
        ffn(t, g.data() + e * H * I, u.data() + e * H * I, d.data() + e * I * H, I, o);
        for (int64_t h = 0; h < H; ++h) y[size_t(h)] += wt * o[size_t(h)];
      }
      if (L.Is) {
        ffn(t, sg.data(), su.data(), sd.data(), L.Is, o);
        for (int64_t h = 0; h < H; ++h) y[size_t(h)] += o[size_t(h)];
      }
      for (int64_t h = 0; h < H; ++h) s += G[size_t(t * H + h)] * y[size_t(h)];
    }
    return s;
  }
};

void fd_case(int64_t T, int64_t E, int64_t K, int64_t Is, int64_t cap, bool renorm) {
  SCOPED_TRACE("E " + std::to_string(E) + " K " + std::to_string(K) + " cap " + std::to_string(cap));
  Layer L(T, 4, 3, E, K, Is, DType::f32, 100 + uint64_t(E * 10 + K));
  MoeFfnOptions o;
  o.k = K;
  o.norm_topk_prob = renorm;
  o.expert_capacity = cap;
  auto fr = moe_ffn_forward_train(L.x, L.w(), o);
  if (cap >= 0) { EXPECT_GT(fr.saved.dropped, 0); }
  Tensor G = randn(DType::f32, {T, L.H}, 7);
  auto idv = to_vec(fr.saved.topk_ids);
  Fwd64 f{L, std::vector<int64_t>(idv.begin(), idv.end()), std::vector<char>(size_t(T * K), 0), renorm, to_vec(L.x), to_vec(L.router), to_vec(L.gate),
          to_vec(L.up), to_vec(L.down), {}, {}, {}};
  for (auto v : fr.saved.plan.slot) f.kept[size_t(v)] = 1;
  if (Is) { f.sg = to_vec(L.sg); f.su = to_vec(L.su); f.sd = to_vec(L.sd); }
  auto gv = to_vec(G);
  auto loss = [&] { return f.loss(gv); };
  auto r = ref::moe_ffn_backward(G, L.x, L.w(), o);
  EXPECT_LT(rel_err(to_vec(r.dx), fd_grad(f.x, loss)), 1e-5);
  EXPECT_LT(rel_err(to_vec(r.d_router), fd_grad(f.r, loss)), 1e-5);
  EXPECT_LT(rel_err(to_vec(r.d_gate), fd_grad(f.g, loss)), 1e-5);
  EXPECT_LT(rel_err(to_vec(r.d_up), fd_grad(f.u, loss)), 1e-5);
  EXPECT_LT(rel_err(to_vec(r.d_down), fd_grad(f.d, loss)), 1e-5);
  if (Is) {
    EXPECT_LT(rel_err(to_vec(r.d_shared_gate), fd_grad(f.sg, loss)), 1e-5);
    EXPECT_LT(rel_err(to_vec(r.d_shared_down), fd_grad(f.sd, loss)), 1e-5);
  }
  auto fast = moe_ffn_backward(G, L.x, L.w(), fr.saved, o);
  for (auto [a, b] : {std::pair{&fast.dx, &r.dx}, {&fast.d_router, &r.d_router}, {&fast.d_gate, &r.d_gate}, {&fast.d_up, &r.d_up},
                      {&fast.d_down, &r.d_down}})
    EXPECT_LT(rel_err(*a, *b), 1e-5);
}

TEST(MoeFfnBackward, ReferenceMatchesFiniteDifferences) {
  fd_case(5, 4, 2, 2, -1, true);   // shared expert, renormalised top-2
  fd_case(6, 3, 1, 0, -1, false);  // k = 1
  fd_case(4, 3, 3, 0, -1, true);   // k = E
  fd_case(7, 3, 2, 0, 2, false);   // capacity 2: later tokens dropped
}

struct FastCase {
  RouterKind router;
  int64_t T, E, K, cap, Is;
  DType dt;
  bool losses;
  DType gdt = DType::f32;     // expert weight gradients
  int64_t H = 16, I = 12;
};

void fast_case(const FastCase& c) {
  Layer L(c.T, c.H, c.I, c.E, c.K, c.Is, c.dt, 200 + uint64_t(c.T));
  MoeFfnOptions o;
  o.k = c.K;
  o.router = c.router;
  o.expert_capacity = c.cap;
  if (c.router == RouterKind::softmax_topk) o.norm_topk_prob = true;
  if (c.router == RouterKind::softmax_topk_v2) o.renorm = 1;
  Tensor bias = randn(DType::f32, {c.E}, 5, 0.1);
  if (c.router == RouterKind::gating_top_k) {
    o.gating.norm_type = 1;
    o.gating.group_count = 2;
    o.gating.k_group = 1;
    o.gating.routed_scaling_factor = 1.5f;
    o.gating.bias = TensorView(bias.view().data, c.dt == DType::f32 ? DType::f32 : DType::f32, {c.E});
  }
  MoeFfnBackwardOptions bo;
  if (c.losses) { bo.aux_loss_coeff = 0.1f; bo.z_loss_coeff = 0.01f; }
  bo.weight_grad_dtype = c.gdt;
  auto fr = moe_ffn_forward_train(L.x, L.w(), o);
  Tensor G = randn(c.dt, {c.T, L.H}, 9);
  auto a = moe_ffn_backward(G, L.x, L.w(), fr.saved, o, bo);
  auto b = ref::moe_ffn_backward(G, L.x, L.w(), o, bo);
  double t = c.dt == DType::f32 ? 1e-4 : 3e-2;
  EXPECT_LT(rel_err(a.dx, b.dx), t);
  EXPECT_LT(rel_err(a.d_router, b.d_router), t);
  // bf16 gradients: one rounding of each (2^-9 relative) on top of the compute dtype's error
  const double tw = c.gdt == DType::bf16 ? std::max(t, 4e-3) : t;
  for (const Tensor* d : {&a.d_gate, &a.d_up, &a.d_down}) EXPECT_EQ(d->dtype(), c.gdt);
  EXPECT_LT(rel_err(a.d_gate, b.d_gate), tw);
  EXPECT_LT(rel_err(a.d_up, b.d_up), tw);
  EXPECT_LT(rel_err(a.d_down, b.d_down), tw);
  if (c.Is) { EXPECT_LT(rel_err(a.d_shared_up, b.d_shared_up), t); }
  if (c.losses) {
    EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-4 * std::fabs(b.aux_loss) + 1e-6);
    EXPECT_NEAR(a.z_loss, b.z_loss, 1e-4 * std::fabs(b.z_loss) + 1e-6);
    EXPECT_GT(a.aux_loss, 0.f);
  }
}

TEST(MoeFfnBackward, FastMatchesReference) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    fast_case({RouterKind::softmax_topk, 37, 6, 2, -1, 8, dt, true});
    fast_case({RouterKind::softmax_topk_v2, 20, 5, 5, -1, 0, dt, false});   // k = E
    fast_case({RouterKind::gating_top_k, 25, 8, 2, 4, 0, dt, true});        // sigmoid, groups, bias, capacity drops
    fast_case({RouterKind::softmax_topk, 1, 4, 1, -1, 0, dt, false});       // one token: all experts but one empty
  }
  fast_case({RouterKind::softmax_topk, 0, 4, 2, -1, 4, DType::f32, false});  // T = 0
}

// Shapes past the vector widths and engine panels (N = 100: two 48-column panels and a tail;
// odd rows per expert), bf16 weight gradients, and every ISA level below the detected one
// (scalar SwiGLU passes and panel packs, AVX2 kernels, fp32 kernels without AVX512_BF16).
TEST(MoeFfnBackward, FastMatchesReferenceWideShapesGradDtypesAndIsas) {
  for (cpu::Isa isa : isa_levels()) {
    cpu::ScopedMaxIsa cap(isa);
    SCOPED_TRACE(cpu::isa_name(isa));
    for (DType dt : {DType::f32, DType::bf16})
      for (DType gdt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " dW " + dtype_name(gdt));
        FastCase c{RouterKind::softmax_topk, 70, 6, 2, -1, 20, dt, false, gdt, 100, 52};
        fast_case(c);
      }
  }
  fast_case({RouterKind::softmax_topk, 1, 4, 1, -1, 0, DType::bf16, false, DType::bf16});  // empty experts zeroed in bf16
}

TEST(MoeFfnBackward, CallerOwnedGradientBuffers) {
  // Written in place (the result shares the caller's storage), or added to with accumulate; E 8 with
  // 3 tokens x top-2 (6 pairs) leaves at least two experts without rows, which must keep their value
  // (accumulate) or become 0. fp32 buffers, and bf16 ones (written rounded once, or c + sum rounded
  // once) against the fp32 gradients.
  struct Case {
    DType dt;
    int64_t H, I;
    uint64_t seed, dy_seed;
    double fill, tol;
  };
  for (const Case& k : {Case{DType::f32, 16, 12, 321, 11, 0.5, 1e-6}, Case{DType::bf16, 40, 20, 322, 12, 0.25, 4e-3}}) {
    SCOPED_TRACE(dtype_name(k.dt));
    Layer L(3, k.H, k.I, 8, 2, 0, k.dt, k.seed);
    MoeFfnOptions o;
    o.k = 2;
    auto fr = moe_ffn_forward_train(L.x, L.w(), o);
    Tensor G = randn(k.dt, {3, L.H}, k.dy_seed);
    auto fresh = moe_ffn_backward(G, L.x, L.w(), fr.saved, o);  // fp32
    auto filled = [&](const Tensor& like) { return from_vec(k.dt, like.shape(), std::vector<double>(size_t(like.numel()), k.fill)); };
    for (bool acc : {false, true}) {
      SCOPED_TRACE(acc ? "accumulate" : "overwrite");
      MoeFfnBackwardOptions bo;
      bo.weight_grad_dtype = k.dt;
      bo.d_gate_out = filled(fresh.d_gate);
      bo.d_up_out = filled(fresh.d_up);
      bo.d_down_out = filled(fresh.d_down);
      bo.accumulate = acc;
      auto g = moe_ffn_backward(G, L.x, L.w(), fr.saved, o, bo);
      for (auto [res, got, want] : {std::tuple{&g.d_gate, &bo.d_gate_out, &fresh.d_gate}, std::tuple{&g.d_up, &bo.d_up_out, &fresh.d_up},
                                    std::tuple{&g.d_down, &bo.d_down_out, &fresh.d_down}}) {
        EXPECT_EQ(res->view().data, got->view().data);
        std::vector<double> w = to_vec(*want);
        for (double& v : w) v += acc ? k.fill : 0.0;
        EXPECT_LT(rel_err(to_vec(*got), w), k.tol);
      }
      if (k.dt == DType::f32) {
        EXPECT_LT(rel_err(g.dx, fresh.dx), 1e-6);
      }
    }
    if (k.dt != DType::bf16) continue;
    MoeFfnBackwardOptions bad;
    bad.d_gate_out = Tensor::empty(DType::f32, {8, k.H, k.I});  // dtype differs from weight_grad_dtype
    bad.d_up_out = Tensor::empty(DType::f32, {8, k.H, k.I});
    bad.d_down_out = Tensor::empty(DType::f32, {8, k.I, k.H});
    bad.weight_grad_dtype = DType::bf16;
    EXPECT_THROW(moe_ffn_backward(G, L.x, L.w(), fr.saved, o, bad), Error);
    bad.weight_grad_dtype = DType::f16;
    EXPECT_THROW(moe_ffn_backward(G, L.x, L.w(), fr.saved, o, bad), Error);
  }
}

TEST(MoeFfnBackward, TrainingForwardMatchesMoeFfnReference) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Layer L(19, 16, 12, 5, 2, 0, dt, 300);
    MoeFfnOptions o;
    o.k = 2;
    o.norm_topk_prob = true;
    o.expert_capacity = 6;
    auto fr = moe_ffn_forward_train(L.x, L.w(), o);
    auto want = moe::ref::moe_ffn(L.x, L.router, L.gate, L.up, L.down, o);
    EXPECT_LT(rel_err(fr.y, want.y), dt == DType::f32 ? 1e-5 : 2e-2);
    EXPECT_EQ(to_vec(fr.saved.topk_ids), to_vec(want.topk_ids));
    EXPECT_EQ(fr.saved.dropped, want.dropped);
  }
  // Wide shapes on the grouped NN engine calls, every ISA level (scalar panel packs included).
  for (cpu::Isa isa : isa_levels()) {
    cpu::ScopedMaxIsa cap(isa);
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + dtype_name(dt));
      Layer L(45, 100, 52, 6, 3, 0, dt, 301);
      MoeFfnOptions o;
      o.k = 3;
      auto fr = moe_ffn_forward_train(L.x, L.w(), o);
      auto want = moe::ref::moe_ffn(L.x, L.router, L.gate, L.up, L.down, o);
      EXPECT_LT(rel_err(fr.y, want.y), dt == DType::f32 ? 1e-5 : 2e-2);
    }
  }
}

TEST(MoeFfnBackward, MatchesCompositionOfOperatorBackwards) {
  const int64_t T = 13, H = 8, I = 6, E = 4, K = 2;
  Layer L(T, H, I, E, K, 0, DType::f32, 400);
  MoeFfnOptions o;
  o.k = K;
  o.norm_topk_prob = true;
  auto fr = moe_ffn_forward_train(L.x, L.w(), o);
  Tensor G = randn(DType::f32, {T, H}, 11);
  auto fused = moe_ffn_backward(G, L.x, L.w(), fr.saved, o);
  // Forward by operators: route, init routing (gather index), GMM + SwiGLU, GMM, unpermute with probs.
  const auto& s = fr.saved;
  InitRoutingV2Options io;
  io.expert_num = E;
  io.expert_tokens_num_type = 1;
  auto ir = moe_init_routing_v2(L.x, s.topk_ids, io);
  Tensor gate_up = Tensor::empty(DType::f32, {E, H, 2 * I});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < I; ++i) {
        gate_up.ptr<float>()[(e * H + h) * 2 * I + i] = L.gate.ptr<float>()[(e * H + h) * I + i];
        gate_up.ptr<float>()[(e * H + h) * 2 * I + I + i] = L.up.ptr<float>()[(e * H + h) * I + i];
      }
  Tensor h = grouped_matmul(ir.expanded_x, gate_up, ir.expert_tokens, GroupListType::count, {}, gemm::Act::swiglu);
  Tensor out = grouped_matmul(h, L.down, ir.expert_tokens, GroupListType::count);
  Tensor y = moe_token_unpermute(out, ir.expanded_row_idx, s.topk_weights);
  auto fy = moe_ffn_forward_train(L.x, L.w(), o).y;
  EXPECT_LT(rel_err(y, fy), 1e-5);
  // Backward by operators, in reverse.
  auto un = moe_token_unpermute_backward(G, out, ir.expanded_row_idx, s.topk_weights);
  GroupedMatmulBackwardOptions go;
  go.group_list_type = 1;
  auto gd = grouped_matmul_backward(un.d_permuted, h, L.down, ir.expert_tokens, go);
  go.act = gemm::Act::swiglu;
  auto gu = grouped_matmul_backward(gd.dx, ir.expanded_x, gate_up, ir.expert_tokens, go);
  Tensor dx = moe_init_routing_v2_backward(gu.dx, ir.expanded_row_idx, T, K, 0);
  Tensor dlog = moe_gating_top_k_softmax_backward(topk_renorm_backward(un.d_probs, s.router_y), s.router_logits, s.topk_ids);
  Tensor d_router = Tensor::empty(DType::f32, {E, H});
  gemm::matmul(gemm::MatView::of(dlog).t(), gemm::MatView::of(L.x), gemm::MutMatView::of(d_router));
  gemm::matmul(gemm::MatView::of(dlog), gemm::MatView::of(L.router), gemm::MutMatView::of(dx), 1.f, 1.f);
  EXPECT_LT(rel_err(fused.dx, dx), 1e-5);
  EXPECT_LT(rel_err(fused.d_router, d_router), 1e-5);
  EXPECT_LT(rel_err(fused.d_down, gd.dweight), 1e-5);
  std::vector<double> dg, du;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t i = 0; i < I; ++i) {
        dg.push_back(gu.dweight.ptr<float>()[(e * H + hh) * 2 * I + i]);
        du.push_back(gu.dweight.ptr<float>()[(e * H + hh) * 2 * I + I + i]);
      }
  EXPECT_LT(rel_err(to_vec(fused.d_gate), dg), 1e-5);
  EXPECT_LT(rel_err(to_vec(fused.d_up), du), 1e-5);
}

// ---- the two schedules of the routed experts' backward (src/moe/ffn_rows_backward.cpp) ----------
struct ScopedSchedule {
  explicit ScopedSchedule(bwd::FfnSchedule s) { bwd::set_ffn_schedule(s); }
  ~ScopedSchedule() { bwd::set_ffn_schedule(bwd::FfnSchedule::automatic); }
};

// The same training forward and backward under the per-call and the expert-major schedule: both
// against the reference (the forward against the automatic one),
// and against each other (same jobs per expert: equal up to summation order). given: into
// caller buffers holding 0.25 (added to with acc).
void schedules_agree(const Layer& L, const MoeFfnOptions& o, DType gdt, bool given, bool acc, uint64_t seed) {
  auto fr = moe_ffn_forward_train(L.x, L.w(), o);
  Tensor G = randn(L.dt, {L.T, L.H}, seed);
  MoeFfnBackwardOptions rbo;
  rbo.weight_grad_dtype = gdt;
  auto want = ref::moe_ffn_backward(G, L.x, L.w(), o, rbo);
  const double t = L.dt == DType::f32 ? 1e-4 : 3e-2, tw = gdt == DType::bf16 ? std::max(t, 4e-3) : t;
  const double base = given && acc ? 0.25 : 0.0;
  auto plus = [&](const Tensor& v) {
    std::vector<double> r = to_vec(v);
    for (double& x : r) x += base;
    return r;
  };
  MoeFfnGrads got[2];
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(k ? "expert-major" : "per-call");
    ScopedSchedule sc(k ? bwd::FfnSchedule::expert_major : bwd::FfnSchedule::per_call);
    MoeFfnBackwardOptions bo;
    bo.weight_grad_dtype = gdt;
    if (given) {
      auto filled = [&](std::vector<int64_t> shape) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return from_vec(gdt, shape, std::vector<double>(size_t(n), 0.25));
      };
      bo.d_gate_out = filled({L.E, L.H, L.I});
      bo.d_up_out = filled({L.E, L.H, L.I});
      bo.d_down_out = filled({L.E, L.I, L.H});
      bo.accumulate = acc;
    }
    auto fk = moe_ffn_forward_train(L.x, L.w(), o);  // the training forward on this schedule too
    EXPECT_LT(rel_err(fk.y, fr.y), 1e-6);
    EXPECT_LT(rel_err(fk.saved.z, fr.saved.z), 1e-6);
    got[k] = moe_ffn_backward(G, L.x, L.w(), fr.saved, o, bo);
    EXPECT_LT(rel_err(got[k].dx, want.dx), t);
    EXPECT_LT(rel_err(got[k].d_router, want.d_router), t);
    EXPECT_LT(rel_err(to_vec(got[k].d_gate), plus(want.d_gate)), tw);
    EXPECT_LT(rel_err(to_vec(got[k].d_up), plus(want.d_up)), tw);
    EXPECT_LT(rel_err(to_vec(got[k].d_down), plus(want.d_down)), tw);
    if (L.Is) { EXPECT_LT(rel_err(got[k].d_shared_gate, want.d_shared_gate), t); }
  }
  for (auto [a, b] : {std::pair{&got[0].dx, &got[1].dx}, {&got[0].d_router, &got[1].d_router}, {&got[0].d_gate, &got[1].d_gate},
                      {&got[0].d_up, &got[1].d_up}, {&got[0].d_down, &got[1].d_down}})
    EXPECT_LT(rel_err(*a, *b), 1e-6);
}

TEST(MoeFfnBackward, PerCallAndExpertMajorSchedulesAgree) {
  for (DType dt : {DType::f32, DType::bf16})
    for (DType gdt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dW " + dtype_name(gdt));
      MoeFfnOptions o;
      o.k = 2;
      o.norm_topk_prob = true;
      schedules_agree(Layer(61, 100, 52, 12, 2, 20, dt, 700), o, gdt, false, false, 1);  // many experts, shared expert
      schedules_agree(Layer(3, 40, 20, 8, 2, 0, dt, 701), o, gdt, true, false, 2);       // empty experts, caller buffers
      schedules_agree(Layer(3, 40, 20, 8, 2, 0, dt, 702), o, gdt, true, true, 3);        // ... accumulated
      MoeFfnOptions all = o;                                                              // k = E
      all.k = 5;
      schedules_agree(Layer(20, 16, 12, 5, 5, 0, dt, 703), all, gdt, false, false, 4);
      MoeFfnOptions cap = o;                                                              // capacity drops
      cap.expert_capacity = 4;
      schedules_agree(Layer(25, 64, 24, 8, 2, 0, dt, 704), cap, gdt, true, true, 5);
      // one expert with every row: the only allowed expert
      Layer one(70, 64, 40, 6, 1, 0, dt, 705);
      Tensor allowed = Tensor::zeros(DType::u8, {70, 6});
      for (int64_t t = 0; t < 70; ++t) allowed.ptr<uint8_t>()[t * 6 + 4] = 1;
      MoeFfnOptions only = o;
      only.k = 1;
      only.norm_topk_prob = false;
      only.allowed = allowed;
      schedules_agree(one, only, gdt, false, false, 6);
    }
}

// The automatic choice: expert-major for many small experts (Qwen3 / e64 training batches), per
// call for one span (the shared expert), few experts (Mixtral E 8), rows too big for L2, one
// thread, or one expert holding a large part of the rows.
TEST(MoeFfnBackward, ScheduleChoiceByShape) {
  using bwd::FfnSchedule;
  using bwd::Span;
  set_num_threads(2);
  auto spans = [](int64_t n, int64_t rows) {
    std::vector<Span> s;
    for (int64_t e = 0; e < n; ++e) s.push_back({e, e * rows, rows});
    return s;
  };
  EXPECT_EQ(bwd::ffn_schedule_for(spans(128, 32), 2048, 768, 128), FfnSchedule::expert_major);   // qwen3 T512
  EXPECT_EQ(bwd::ffn_schedule_for(spans(64, 64), 2048, 1408, 64), FfnSchedule::expert_major);    // e64 T512
  EXPECT_EQ(bwd::ffn_schedule_for(spans(1, 512), 2048, 768, 1), FfnSchedule::per_call);          // shared expert
  EXPECT_EQ(bwd::ffn_schedule_for(spans(8, 128), 4096, 14336, 8), FfnSchedule::per_call);        // mixtral T512
  EXPECT_EQ(bwd::ffn_schedule_for(spans(128, 2000), 2048, 768, 128), FfnSchedule::per_call);     // rows beyond L2
  std::vector<Span> skew = spans(16, 4);
  skew.push_back({16, 64, 100});
  EXPECT_EQ(bwd::ffn_schedule_for(skew, 64, 32, 17), FfnSchedule::per_call);                     // one dominant expert
  std::vector<Span> twice = spans(16, 4);
  twice[3].group = 2;
  EXPECT_EQ(bwd::ffn_schedule_for(twice, 64, 32, 16), FfnSchedule::per_call);                    // repeated group
  {
    ScopedSchedule sc(FfnSchedule::expert_major);
    EXPECT_EQ(bwd::ffn_schedule_for(twice, 64, 32, 16), FfnSchedule::per_call);                  // forced, but groups repeat
    EXPECT_EQ(bwd::ffn_schedule_for(spans(1, 512), 64, 32, 1), FfnSchedule::expert_major);
  }
  set_num_threads(1);
  EXPECT_EQ(bwd::ffn_schedule_for(spans(128, 32), 2048, 768, 128), FfnSchedule::per_call);
  set_num_threads(0);
}

TEST(MoeFfnBackward, BadInput) {
  Layer L(4, 8, 4, 3, 2, 0, DType::f32, 500);
  MoeFfnOptions o;
  auto fr = moe_ffn_forward_train(L.x, L.w(), o);
  auto arg = [&](const std::function<void()>& f) {
    try { f(); } catch (const Error& e) { return e.arg(); }
    return std::string("no error");
  };
  EXPECT_EQ(arg([&] { moe_ffn_backward(randn(DType::f32, {4, 7}, 1), L.x, L.w(), fr.saved, o); }), "dy");
  EXPECT_EQ(arg([&] { moe_ffn_backward(randn(DType::bf16, {4, 8}, 1), L.x, L.w(), fr.saved, o); }), "dy");
  MoeFfnOptions o3 = o;
  o3.k = 3;
  EXPECT_EQ(arg([&] { moe_ffn_backward(randn(DType::f32, {4, 8}, 1), L.x, L.w(), fr.saved, o3); }), "saved");
  auto w = L.w();
  Tensor bad = randn(DType::f32, {3, 8, 5}, 2);
  w.up = bad;
  EXPECT_EQ(arg([&] { moe_ffn_forward_train(L.x, w, o); }), "up");
  o3.k = 4;
  EXPECT_EQ(arg([&] { moe_ffn_forward_train(L.x, L.w(), o3); }), "k");
  for (double f : {std::nan(""), -1.0, HUGE_VAL}) {  // capacity_factor: 0 or finite > 0
    MoeFfnOptions oc = o;
    oc.capacity_factor = f;
    EXPECT_EQ(arg([&] { moe_ffn_forward_train(L.x, L.w(), oc); }), "capacity_factor");
    EXPECT_EQ(arg([&] { ref::moe_ffn_backward(randn(DType::f32, {4, 8}, 1), L.x, L.w(), oc); }), "capacity_factor");
  }
}

}  // namespace

}  // namespace test_moe_ffn_backward
