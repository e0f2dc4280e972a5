// moe_ffn_backward: the whole layer's gradients from what moe_ffn_forward_train kept. Per expert
// (rows sorted by expert; NT = activation gradient through a weight as stored, TN = weight
// gradient with K = the expert's rows; each expert's chain on one thread, or each step one
// grouped engine call over all experts: bwd::FfnSchedule, chosen by shape):
//   g   = dy_rows Wd^T                                       (NT)
//   one pass over the rows: a from z, d w = g . a, w a, dz = swiglu'(z) (w g)
//   dWd = (w a)^T dy_rows, dWg = x_rows^T dz_gate, dWu = x_rows^T dz_up   (one TN call)
//   dx_rows = dz_gate Wg^T + dz_up Wu^T                      (NT, two K segments)
// then dx[t] = sum of its rows' dx_rows, the router through the routers' backwards, the losses,
// and the shared expert the same way (one span of all tokens, weight 1).
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"

namespace ot::moe {

namespace {

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
  const DType gdt = bo.weight_grad_dtype;
  OT_CHECK(gdt == DType::f32 || gdt == DType::bf16, op, "weight_grad_dtype", "f32 or bf16", dtype_name(gdt));
  const bool given = bo.d_gate_out.defined() || bo.d_up_out.defined() || bo.d_down_out.defined();
  if (given) {
    for (auto [t, name, shape] : {std::tuple{&bo.d_gate_out, "d_gate_out", std::vector<int64_t>{d.E, d.H, d.I}},
                                  std::tuple{&bo.d_up_out, "d_up_out", std::vector<int64_t>{d.E, d.H, d.I}},
                                  std::tuple{&bo.d_down_out, "d_down_out", std::vector<int64_t>{d.E, d.I, d.H}}})
      OT_CHECK(t->defined() && t->dtype() == gdt && t->view().is_contiguous() && t->view().shape() == shape, op, name,
               detail::cat("a contiguous ", dtype_name(gdt), " ", TensorView(nullptr, gdt, shape).shape_str(), " (weight_grad_dtype; all three given or none)"),
               t->defined() ? detail::cat(dtype_name(t->dtype()), " ", t->view().shape_str()) : std::string("none"));
  }
  OT_CHECK(given || !bo.accumulate, op, "accumulate", "gradient buffers to add to (d_gate_out, d_up_out, d_down_out)", "none");
  if (cpu::force_ref()) {
    MoeFfnGrads r = ref::moe_ffn_backward(dy, x, w, o, bo);
    // same contract as the fast path: results in weight_grad_dtype, in (or added to) the buffers
    for (auto [dst, src] : {std::pair{&bo.d_gate_out, &r.d_gate}, std::pair{&bo.d_up_out, &r.d_up}, std::pair{&bo.d_down_out, &r.d_down}}) {
      Tensor out = given ? *dst : Tensor::empty(gdt, src->view().shape());
      const float* q = src->ptr<float>();
      for (int64_t i = 0; i < src->numel(); ++i)
        set_from_double(out.view(), i, (bo.accumulate ? get_as_double(out.view(), i) : 0.0) + double(q[i]));
      *src = out;
    }
    return r;
  }
  const int64_t T = d.T, H = d.H, E = d.E, K = d.K, I = d.I, A = int64_t(s.plan.token.size());
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel(gemm::kernel_name(x.dtype, x.dtype, A)).args(x.shape_str() + " E=" + std::to_string(E) + " K=" + std::to_string(K));
  scope.flops(2.0 * 2.0 * (3.0 * A * H * I + 3.0 * T * H * d.Is + T * H * E));

  MoeFfnGrads g;
  g.d_gate = given ? bo.d_gate_out : pooled_empty(gdt, {E, H, I});
  g.d_up = given ? bo.d_up_out : pooled_empty(gdt, {E, H, I});
  g.d_down = given ? bo.d_down_out : pooled_empty(gdt, {E, I, H});
  // Fresh gradients (2.4 GB fp32 at qwen3 T512) fault in once per page as the TN stores reach
  // them: 2 MiB pages take 1/512 of the faults (cpu-clock: 4 KiB faults were ~30 % of the backward
  // on the AMD EPYC AVX2-only VM, 2026-12-02).
  if (!given)
    for (const Tensor* t : {&g.d_gate, &g.d_up, &g.d_down}) advise_huge_pages(*t);
  // Rows in expert order (x and dy gathered where each expert's chain reads them); the routed
  // experts' backward (dx rows in fp32).
  float* dxs = static_cast<float*>(bwd::scratch(5, size_t(A * H) * 4));
  std::vector<float> dw_row(static_cast<size_t>(A));
  bwd::FfnRowsBackward routed;
  bwd::set_routed_rows(routed, x, w, s.plan, I);
  routed.dys = dy.data;
  routed.z = s.z.view().data;
  routed.scale = s.plan.weight.data();
  routed.dg = g.d_gate.view().data;
  routed.du = g.d_up.view().data;
  routed.dd = g.d_down.view().data;
  routed.gdt = gdt;
  routed.acc = bo.accumulate;
  routed.dx = dxs;
  routed.dot = dw_row.data();
  bwd::ffn_rows_backward(routed);

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

  // dx: router term, shared expert (fp32 gradients), then each token's routed rows.
  float* dxa = static_cast<float*>(bwd::scratch(6, size_t(T * H) * 4));
  gemm::matmul(gemm::MatView::of(dlogits), gemm::MatView::of(w.router), {dxa, DType::f32, T, H, H, 1});
  if (d.Is > 0) {
    const int64_t Is = d.Is;
    g.d_shared_gate = Tensor::empty(DType::f32, {H, Is});
    g.d_shared_up = Tensor::empty(DType::f32, {H, Is});
    g.d_shared_down = Tensor::empty(DType::f32, {Is, H});
    bwd::FfnRowsBackward sh;
    bwd::set_shared_rows(sh, x, w, Is);
    sh.dys = dy.data;
    sh.z = s.shared_z.view().data;
    sh.dg = g.d_shared_gate.view().data;
    sh.du = g.d_shared_up.view().data;
    sh.dd = g.d_shared_down.view().data;
    sh.dx = dxa;
    sh.dx_acc = true;
    bwd::ffn_rows_backward(sh);
  }
  auto rows = bwd::row_of_slot(s.plan, T * K);
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int32_t i = rows[size_t(t * K + k)];
        if (i >= 0) accumulate_f32(dxs + int64_t(i) * H, DType::f32, 1.f, dxa + t * H, H);
      }
  });
  g.dx = pooled_empty(x.dtype, {T, H});
  convert_from_f32(dxa, g.dx.view().data, x.dtype, T * H);
  return g;
}

}  // namespace ot::moe
