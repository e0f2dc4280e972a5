// moe_ffn_backward: the whole layer's gradients from what moe_ffn_forward_train kept. Per expert
// (rows sorted by expert; each step is one grouped engine call over all experts: NT = activation
// gradient through a weight as stored, TN = weight gradient with K = the expert's rows):
//   g   = dy_rows Wd^T                 d w = g . a            da = w g
//   dz  = swiglu'(z) da                dWd = (w a)^T dy_rows
//   dWg = x_rows^T dz_gate             dWu = x_rows^T dz_up    dx_rows = dz_gate Wg^T + dz_up Wu^T
// then dx[t] = sum of its rows' dx_rows, the router through the routers' backwards, the losses,
// and the shared expert as a dense FFN.
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"

namespace ot::moe {

namespace {

using bwd::msub;
using bwd::sub;

// d logits of the router stage (weights, then renorm, then the router's own backward).
Tensor router_backward(const MoeFfnSaved& s, const Tensor& dweights, const MoeFfnOptions& o) {
  Tensor dy = dweights;
  if (o.norm_topk_prob && o.router != RouterKind::gating_top_k) dy = topk_renorm_backward(dweights, s.router_y);
  switch (o.router) {
    case RouterKind::softmax_topk: return moe_gating_top_k_softmax_backward(dy, s.router_logits, s.topk_ids, o.allowed);
    case RouterKind::softmax_topk_v2: return moe_gating_top_k_softmax_v2_backward(dy, s.router_logits, s.topk_ids, o.renorm, o.allowed);
    case RouterKind::gating_top_k:
      return moe_gating_top_k_backward(dy, s.scores, s.topk_ids, o.gating.renorm, o.gating.norm_type, o.gating.routed_scaling_factor, o.gating.eps);
  }
  return {};
}

// Aux loss on the router probabilities (softmax, or s / sum(s) for the sigmoid router); adds its
// gradient to dlogits and returns its value.
float add_aux_loss(const MoeFfnSaved& s, const MoeFfnOptions& o, float coeff, float* dlogits) {
  const int64_t T = s.T, E = s.E;
  const bool sigmoid = o.router == RouterKind::gating_top_k && o.gating.norm_type == 1;
  Tensor probs = Tensor::empty(DType::f32, {T, E});
  std::vector<double> base(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = s.router_logits.ptr<float>() + t * E;
    const uint8_t* al = o.allowed.defined() ? o.allowed.ptr<uint8_t>() + t * E : nullptr;
    double m = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) if (!al || al[e]) m = std::fmax(m, x[e]);
    for (int64_t e = 0; e < E; ++e) {
      double v = sigmoid ? 1 / (1 + std::exp(-double(x[e]))) : ((!al || al[e]) ? std::exp(x[e] - m) : 0.0);
      base[size_t(t * E + e)] = v;
      sum += v;
    }
    for (int64_t e = 0; e < E; ++e) probs.ptr<float>()[t * E + e] = float(base[size_t(t * E + e)] / sum);
  }
  float loss = moe_aux_loss(probs, s.expert_counts, s.K, coeff);
  Tensor dp = moe_aux_loss_backward(probs, s.expert_counts, s.K, coeff);
  for (int64_t t = 0; t < T; ++t) {
    const float* p = probs.ptr<float>() + t * E;
    const float* g = dp.ptr<float>() + t * E;
    double dot = 0, S = 0;
    for (int64_t e = 0; e < E; ++e) { dot += double(g[e]) * p[e]; S += base[size_t(t * E + e)]; }
    for (int64_t e = 0; e < E; ++e) {
      double ds = sigmoid ? (g[e] - dot) / S : 0;  // p = s / S: dp/ds; softmax: p (g - dot)
      dlogits[t * E + e] += float(sigmoid ? ds * base[size_t(t * E + e)] * (1 - base[size_t(t * E + e)]) : p[e] * (g[e] - dot));
    }
  }
  return loss;
}

}  // namespace

MoeFfnGrads moe_ffn_backward(const TensorView& dy, const TensorView& x, const MoeFfnWeights& w, const MoeFfnSaved& s, const MoeFfnOptions& o,
                             const MoeFfnBackwardOptions& bo) {
  const char* op = "moe_ffn_backward";
  bwd::FfnDims d;
  bwd::check_ffn(op, x, w, o, d);
  OT_CHECK(s.T == d.T && s.H == d.H && s.E == d.E && s.K == d.K && s.I == d.I && s.Is == d.Is && s.dtype == x.dtype && s.z.defined(), op,
           "saved", "the result of moe_ffn_forward_train on this x and these weights", "T ", s.T, " H ", s.H, " E ", s.E, " K ", s.K);
  bwd::check_shape(op, "dy", dy, {d.T, d.H});
  OT_CHECK(dy.dtype == x.dtype && dy.is_contiguous(), op, "dy", detail::cat("a contiguous tensor in x's dtype ", dtype_name(x.dtype)), dy.shape_str());
  const bool given = bo.d_gate_out.defined() || bo.d_up_out.defined() || bo.d_down_out.defined();
  if (given) {
    for (auto [t, name, shape] : {std::tuple{&bo.d_gate_out, "d_gate_out", std::vector<int64_t>{d.E, d.H, d.I}},
                                  std::tuple{&bo.d_up_out, "d_up_out", std::vector<int64_t>{d.E, d.H, d.I}},
                                  std::tuple{&bo.d_down_out, "d_down_out", std::vector<int64_t>{d.E, d.I, d.H}}})
      OT_CHECK(t->defined() && t->dtype() == DType::f32 && t->view().is_contiguous() && t->view().shape() == shape, op, name,
               detail::cat("a contiguous fp32 ", TensorView(nullptr, DType::f32, shape).shape_str(), " (all three given or none)"),
               t->defined() ? t->view().shape_str() : std::string("none"));
  }
  OT_CHECK(given || !bo.accumulate, op, "accumulate", "gradient buffers to add to (d_gate_out, d_up_out, d_down_out)", "none");
  if (cpu::force_ref()) {
    MoeFfnGrads r = ref::moe_ffn_backward(dy, x, w, o, bo);
    if (given) {  // same contract as the fast path: results land in (or are added to) the buffers
      for (auto [dst, src] : {std::pair{&bo.d_gate_out, &r.d_gate}, std::pair{&bo.d_up_out, &r.d_up}, std::pair{&bo.d_down_out, &r.d_down}}) {
        float* p = dst->ptr<float>();
        const float* q = src->ptr<float>();
        for (int64_t i = 0; i < src->numel(); ++i) p[i] = (bo.accumulate ? p[i] : 0.f) + q[i];
        *src = *dst;
      }
    }
    return r;
  }
  const int64_t T = d.T, H = d.H, E = d.E, K = d.K, I = d.I, A = int64_t(s.plan.token.size());
  trace::OpScope scope(op);
  scope.kernel(gemm::kernel_name(x.dtype, x.dtype, A)).args(x.shape_str() + " E=" + std::to_string(E) + " K=" + std::to_string(K));
  scope.flops(2.0 * 2.0 * (3.0 * A * H * I + 3.0 * T * H * d.Is + T * H * E));

  MoeFfnGrads g;
  g.d_gate = given ? bo.d_gate_out : Tensor::empty(DType::f32, {E, H, I});
  g.d_up = given ? bo.d_up_out : Tensor::empty(DType::f32, {E, H, I});
  g.d_down = given ? bo.d_down_out : Tensor::empty(DType::f32, {E, I, H});
  const bool acc = bo.accumulate;
  auto spans = bwd::expert_spans(s.plan);
  const size_t es = dtype_size(x.dtype);
  Tensor hold_g, hold_u, hold_d;  // row-major copies only if a weight view is strided
  const TensorView Wg = bwd::row_major(w.gate, hold_g), Wu = bwd::row_major(w.up, hold_u), Wd = bwd::row_major(w.down, hold_d);
  auto rows_at = [&](const Tensor& t, int64_t r, int64_t col = 0) {
    return static_cast<const char*>(t.view().data) + (r * t.view().strides[0] + col) * int64_t(dtype_size(t.dtype()));
  };
  auto expert = [&](const TensorView& wt, int64_t e) { return static_cast<const char*>(wt.data) + e * wt.strides[0] * int64_t(es); };

  // Rows in expert order: x and dy gathered, a and w * a from the kept z.
  Tensor xs = bwd::gather_rows(x, s.plan.token.data(), A), dys = bwd::gather_rows(dy, s.plan.token.data(), A);
  Tensor aw;
  Tensor a = bwd::swiglu_rows(s.z, s.plan.weight.data(), &aw);
  // g = dy_rows Wd^T (NT on Wd [I, H] as stored) and dWd = (w a)^T dy_rows (TN), all experts at once.
  Tensor gr = Tensor::empty(DType::f32, {A, I});
  std::vector<gemm::NtJob> nt;
  std::vector<gemm::TnJob> tn;
  for (const auto& sp : spans) {
    gemm::NtJob j;
    j.M = sp.count;
    j.N = I;
    j.a = {rows_at(dys, sp.offset), x.dtype, H, nullptr};
    j.w_dtype = x.dtype;
    j.w[0] = {expert(Wd, sp.group), H, Wd.strides[1]};
    j.c = gr.ptr<float>() + sp.offset * I;
    j.ldc = I;
    nt.push_back(j);
    tn.push_back({sp.count, I, H, rows_at(aw, sp.offset), rows_at(dys, sp.offset), x.dtype, x.dtype, I, H,
                  g.d_down.ptr<float>() + sp.group * I * H, H, acc});
  }
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
  gemm::grouped_gemm_tn(tn.data(), int64_t(tn.size()));
  // d w per kept pair, da = w g (in place), then dz = swiglu'(z) da in x's dtype.
  std::vector<float> dw_row(static_cast<size_t>(A));
  bwd::parallel_rows(A, I, [&](int64_t i0, int64_t i1) {
    std::vector<float> ar(static_cast<size_t>(I));
    for (int64_t i = i0; i < i1; ++i) {
      float* gi = gr.ptr<float>() + i * I;
      convert_to_f32(static_cast<const char*>(a.view().data) + i * I * int64_t(dtype_size(a.dtype())), a.dtype(), ar.data(), I);
      double dot = 0;
      for (int64_t j = 0; j < I; ++j) dot += double(gi[j]) * ar[size_t(j)];
      dw_row[size_t(i)] = float(dot);
      const float wt = s.plan.weight[size_t(i)];
      for (int64_t j = 0; j < I; ++j) gi[j] *= wt;
    }
  });
  Tensor dz = Tensor::empty(x.dtype, {A, 2 * I});
  bwd::parallel_rows(A, 2 * I * 8, [&](int64_t i0, int64_t i1) {
    bwd::act_backward_rows(gemm::Act::swiglu, i0, i1, 2 * I, s.z.view().data, s.z.dtype(), 2 * I, gr.view().data, DType::f32, I, dz.view().data,
                           dz.dtype(), 2 * I);
  });
  // dWg, dWu = x_rows^T dz_gate, x_rows^T dz_up (TN); dx_rows = [dz_gate | dz_up] [Wg | Wu]^T (NT,
  // the two projections as two K segments of one job).
  Tensor dxs = Tensor::empty(DType::f32, {A, H});
  nt.clear();
  tn.clear();
  for (const auto& sp : spans) {
    const int64_t e = sp.group, r0 = sp.offset, n = sp.count;
    tn.push_back({n, H, I, rows_at(xs, r0), rows_at(dz, r0), x.dtype, x.dtype, H, 2 * I, g.d_gate.ptr<float>() + e * H * I, I, acc});
    tn.push_back({n, H, I, rows_at(xs, r0), rows_at(dz, r0, I), x.dtype, x.dtype, H, 2 * I, g.d_up.ptr<float>() + e * H * I, I, acc});
    gemm::NtJob j;
    j.M = n;
    j.N = H;
    j.a = {rows_at(dz, r0), x.dtype, 2 * I, nullptr};
    j.w_dtype = x.dtype;
    j.w[0] = {expert(Wg, e), I, Wg.strides[1]};
    j.w[1] = {expert(Wu, e), I, Wu.strides[1]};
    j.c = dxs.ptr<float>() + r0 * H;
    j.ldc = H;
    nt.push_back(j);
  }
  gemm::grouped_gemm_tn(tn.data(), int64_t(tn.size()));
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
  std::vector<char> used(static_cast<size_t>(E), 0);
  for (const auto& sp : spans) used[size_t(sp.group)] = 1;
  bwd::parallel_rows(E, H * I, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      if (!used[size_t(e)] && !acc)
        for (const Tensor* t : {&g.d_gate, &g.d_up, &g.d_down}) std::memset(t->ptr<float>() + e * H * I, 0, size_t(H * I) * sizeof(float));
  });

  // Router: d weights of kept pairs (0 for dropped ones), through renorm and the router.
  Tensor dweights = Tensor::zeros(DType::f32, {T, K});
  for (int64_t i = 0; i < A; ++i) dweights.ptr<float>()[s.plan.slot[size_t(i)]] = dw_row[size_t(i)];
  Tensor dlogits = router_backward(s, dweights, o);
  if (bo.aux_loss_coeff > 0) g.aux_loss = add_aux_loss(s, o, bo.aux_loss_coeff, dlogits.ptr<float>());
  if (bo.z_loss_coeff > 0) {
    g.z_loss = moe_z_loss(s.router_logits, bo.z_loss_coeff);
    Tensor dzl = moe_z_loss_backward(s.router_logits, bo.z_loss_coeff);
    for (int64_t i = 0; i < T * E; ++i) dlogits.ptr<float>()[i] += dzl.ptr<float>()[i];
  }
  g.d_router = Tensor::empty(DType::f32, {E, H});
  gemm::TnJob rj{T, E, H, dlogits.view().data, x.data, DType::f32, x.dtype, E, H, g.d_router.ptr<float>(), H, false};
  gemm::grouped_gemm_tn(&rj, 1);

  // dx: router term, shared expert, then each token's routed rows.
  Tensor dxa = Tensor::empty(DType::f32, {T, H});
  gemm::matmul(gemm::MatView::of(dlogits), gemm::MatView::of(w.router), gemm::MutMatView::of(dxa));
  if (d.Is > 0) {
    const int64_t Is = d.Is;
    Tensor hsg, hsu, hsd;
    const TensorView Sg = bwd::row_major(w.shared_gate, hsg), Su = bwd::row_major(w.shared_up, hsu), Sd = bwd::row_major(w.shared_down, hsd);
    Tensor as = bwd::swiglu_rows(s.shared_z, nullptr, nullptr);
    g.d_shared_down = Tensor::empty(DType::f32, {Is, H});
    gemm::TnJob jd{T, Is, H, as.view().data, dy.data, x.dtype, x.dtype, Is, H, g.d_shared_down.ptr<float>(), H, false};
    gemm::grouped_gemm_tn(&jd, 1);
    Tensor gs = Tensor::empty(DType::f32, {T, Is});
    gemm::NtJob jg;
    jg.M = T;
    jg.N = Is;
    jg.a = {dy.data, x.dtype, H, nullptr};
    jg.w_dtype = x.dtype;
    jg.w[0] = {Sd.data, H, Sd.strides[0]};
    jg.c = gs.ptr<float>();
    jg.ldc = Is;
    gemm::grouped_gemm_nt(&jg, 1);
    Tensor dzs = Tensor::empty(x.dtype, {T, 2 * Is});
    act_backward(gemm::Act::swiglu, s.shared_z, gs, dzs);
    g.d_shared_gate = Tensor::empty(DType::f32, {H, Is});
    g.d_shared_up = Tensor::empty(DType::f32, {H, Is});
    const char* dzp = static_cast<const char*>(dzs.view().data);
    gemm::TnJob jw[2] = {{T, H, Is, x.data, dzp, x.dtype, x.dtype, H, 2 * Is, g.d_shared_gate.ptr<float>(), Is, false},
                         {T, H, Is, x.data, dzp + Is * int64_t(es), x.dtype, x.dtype, H, 2 * Is, g.d_shared_up.ptr<float>(), Is, false}};
    gemm::grouped_gemm_tn(jw, 2);
    gemm::NtJob jx;
    jx.M = T;
    jx.N = H;
    jx.a = {dzp, x.dtype, 2 * Is, nullptr};
    jx.w_dtype = x.dtype;
    jx.w[0] = {Sg.data, Is, Sg.strides[0]};
    jx.w[1] = {Su.data, Is, Su.strides[0]};
    jx.c = dxa.ptr<float>();
    jx.ldc = H;
    jx.accumulate = true;
    gemm::grouped_gemm_nt(&jx, 1);
  }
  auto rows = bwd::row_of_slot(s.plan, T * K);
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = dxa.ptr<float>() + t * H;
      for (int64_t k = 0; k < K; ++k) {
        int32_t i = rows[size_t(t * K + k)];
        if (i < 0) continue;
        const float* src = dxs.ptr<float>() + int64_t(i) * H;
        for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
      }
    }
  });
  g.dx = Tensor::empty(x.dtype, {T, H});
  copy_into(dxa, g.dx);
  return g;
}

}  // namespace ot::moe
