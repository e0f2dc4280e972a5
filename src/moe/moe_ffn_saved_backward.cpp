// moe_ffn_forward_train: the moe_ffn forward on unpacked weights, keeping what moe_ffn_backward
// needs (see ot/moe_bwd.h for what is kept and what is recomputed).
#include <cmath>
#include <cstring>
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"
#include "src/moe/ffn_plan.h"

namespace ot::moe {

namespace bwd {

void check_ffn(const char* op, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o, FfnDims& d) {
  OT_CHECK(!o.shared_quant, op, "shared_quant", "null (training takes the shared expert's weights in MoeFfnWeights)", "a quantised store");
  OT_CHECK(x.ndim == 2 && x.is_contiguous(), op, "x", "a contiguous [T, H]", x.shape_str());
  check_float(op, "x", x);
  OT_CHECK(w.gate.ndim == 3, op, "gate", "[E, H, I]", w.gate.shape_str());
  d.T = x.sizes[0];
  d.E = w.gate.sizes[0];
  d.H = w.gate.sizes[1];
  d.I = w.gate.sizes[2];
  d.K = o.k;
  OT_CHECK(x.sizes[1] == d.H, op, "x", detail::cat("[T, H] with the experts' H = ", d.H), x.shape_str());
  check_shape(op, "router", w.router, {d.E, d.H});
  check_shape(op, "up", w.up, {d.E, d.H, d.I});
  check_shape(op, "down", w.down, {d.E, d.I, d.H});
  for (const TensorView* v : {&w.router, &w.gate, &w.up, &w.down})
    OT_CHECK(v->dtype == x.dtype, op, "weights", detail::cat("x's dtype ", dtype_name(x.dtype)), v->shape_str());
  OT_CHECK(o.k >= 1 && o.k <= d.E && o.k <= 1024, op, "k", detail::cat("1 <= k <= min(E, 1024) with E = ", d.E), o.k);
  impl::ffn_capacity(op, o, d.T, d.E);  // checks expert_capacity and capacity_factor
  if (o.residual.defined()) check_shape(op, "residual", o.residual, {d.T, d.H});
  bool sh = w.shared_gate.defined() || w.shared_up.defined() || w.shared_down.defined();
  if (sh) {
    OT_CHECK(w.shared_gate.ndim == 2, op, "shared_gate", "[H, Is]", w.shared_gate.shape_str());
    d.Is = w.shared_gate.sizes[1];
    check_shape(op, "shared_gate", w.shared_gate, {d.H, d.Is});
    check_shape(op, "shared_up", w.shared_up, {d.H, d.Is});
    check_shape(op, "shared_down", w.shared_down, {d.Is, d.H});
    for (const TensorView* v : {&w.shared_gate, &w.shared_up, &w.shared_down})
      OT_CHECK(v->dtype == x.dtype, op, "shared weights", detail::cat("x's dtype ", dtype_name(x.dtype)), v->shape_str());
  }
}

std::vector<Span> expert_spans(const RoutingPlan& p) {
  std::vector<Span> s;
  for (size_t e = 0; e + 1 < p.offsets.size(); ++e)
    if (p.offsets[e + 1] > p.offsets[e]) s.push_back({int64_t(e), p.offsets[e], p.offsets[e + 1] - p.offsets[e]});
  return s;
}

void set_routed_rows(FfnRows& r, const TensorView& x, const MoeFfnWeights& w, const RoutingPlan& p, int64_t I) {
  r.H = x.sizes[1];
  r.I = I;
  r.G = int64_t(p.offsets.size()) - 1;
  r.dt = x.dtype;
  r.xs = x.data;
  r.gather = p.token.data();
  r.spans = expert_spans(p);
  r.w = FfnWeights(w.gate, w.up, w.down);
}

void set_shared_rows(FfnRows& r, const TensorView& x, const MoeFfnWeights& w, int64_t Is) {
  r.H = x.sizes[1];
  r.I = Is;
  r.G = 1;
  r.dt = x.dtype;
  r.xs = x.data;
  if (x.sizes[0] > 0) r.spans = {{0, 0, x.sizes[0]}};
  r.w = FfnWeights(w.shared_gate, w.shared_up, w.shared_down);
}

void gather_rows(const void* src, size_t row_bytes, const int32_t* rows, int64_t n, void* out) {
  parallel_rows(n, int64_t(row_bytes / 2), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(static_cast<char*>(out) + size_t(i) * row_bytes, static_cast<const char*>(src) + size_t(rows[i]) * row_bytes, row_bytes);
  });
}

TensorView row_major(const TensorView& v, Tensor& hold) {
  if (v.strides[v.ndim - 1] == 1) return v;
  hold = Tensor::copy_of(v);
  return hold.view();
}

std::vector<int32_t> row_of_slot(const RoutingPlan& p, int64_t TK) {
  std::vector<int32_t> r(static_cast<size_t>(TK), -1);
  for (size_t i = 0; i < p.slot.size(); ++i) r[size_t(p.slot[i])] = int32_t(i);
  return r;
}

GatingResult route(const TensorView& logits, const MoeFfnOptions& o) {
  switch (o.router) {
    case RouterKind::softmax_topk: return moe_gating_top_k_softmax(logits, o.k, {}, o.allowed);
    case RouterKind::softmax_topk_v2: return moe_gating_top_k_softmax_v2(logits, o.k, {}, o.renorm, false, o.allowed);
    case RouterKind::gating_top_k: {
      GatingTopKOptions g = o.gating;
      g.k = o.k;
      g.allowed = o.allowed;
      g.out_flag = true;
      return moe_gating_top_k(logits, g);
    }
  }
  return {};
}

}  // namespace bwd

MoeFfnTrainResult moe_ffn_forward_train(const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o) {
  const char* op = "moe_ffn_forward_train";
  bwd::FfnDims d;
  bwd::check_ffn(op, x, w, o, d);
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel(gemm::kernel_name(x.dtype, x.dtype, d.T)).args(x.shape_str() + " E=" + std::to_string(d.E) + " K=" + std::to_string(d.K));
  scope.flops(2.0 * d.T * d.H * (d.E + d.K * 3.0 * d.I + 3.0 * d.Is));
  MoeFfnTrainResult r;
  MoeFfnSaved& s = r.saved;
  s.T = d.T; s.H = d.H; s.E = d.E; s.K = d.K; s.I = d.I; s.Is = d.Is; s.dtype = x.dtype;
  const int64_t T = d.T, H = d.H, E = d.E, K = d.K, I = d.I;
  s.router_logits = Tensor::empty(DType::f32, {T, E});
  gemm::matmul(gemm::MatView::of(x), gemm::MatView::of(w.router).t(), gemm::MutMatView::of(s.router_logits));
  GatingResult g = bwd::route(s.router_logits, o);
  s.topk_ids = g.expert_idx;
  s.router_y = Tensor::copy_of(g.y);
  s.scores = g.scores;
  s.topk_weights = Tensor::copy_of(g.y);
  if (o.norm_topk_prob && o.router != RouterKind::gating_top_k) {
    float* wt = s.topk_weights.ptr<float>();
    for (int64_t t = 0; t < T; ++t) {
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += wt[t * K + k];
      for (int64_t k = 0; k < K; ++k) wt[t * K + k] /= sum;
    }
  }
  int64_t cap = impl::ffn_capacity(op, o, T, E);
  s.plan = moe_routing_plan(s.topk_ids, s.topk_weights, E, cap);
  s.dropped = s.plan.dropped;
  s.expert_counts = Tensor::empty(DType::i64, {E});
  std::copy(s.plan.counts.begin(), s.plan.counts.end(), s.expert_counts.ptr<int64_t>());

  // Routed experts on gathered rows (gathered where each expert's chain reads them; o = FFN rows
  // in fp32), then the shared expert straight into
  // the fp32 accumulator, then each token's weighted rows.
  const int64_t A = int64_t(s.plan.token.size());
  s.z = pooled_empty(x.dtype, {A, 2 * I});
  float* o_rows = static_cast<float*>(bwd::scratch(1, size_t(A * H) * 4));
  bwd::FfnRowsForward f;
  bwd::set_routed_rows(f, x, w, s.plan, I);
  f.z = s.z.view().data;
  f.out = o_rows;
  bwd::ffn_rows_forward(f);
  float* acc = static_cast<float*>(bwd::scratch(2, size_t(T * H) * 4));
  if (o.residual.defined()) copy_into(o.residual, TensorView(acc, DType::f32, {T, H}));
  else std::memset(acc, 0, size_t(T * H) * 4);
  if (d.Is > 0 && T > 0) {
    s.shared_z = Tensor::empty(x.dtype, {T, 2 * d.Is});
    bwd::FfnRowsForward sh;
    bwd::set_shared_rows(sh, x, w, d.Is);
    sh.z = s.shared_z.view().data;
    sh.out = acc;
    sh.out_acc = true;
    bwd::ffn_rows_forward(sh);
  } else if (d.Is > 0) {
    s.shared_z = Tensor::empty(x.dtype, {T, 2 * d.Is});
  }
  auto rows = bwd::row_of_slot(s.plan, T * K);
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int32_t i = rows[size_t(t * K + k)];
        if (i >= 0) accumulate_f32(o_rows + int64_t(i) * H, DType::f32, s.plan.weight[size_t(i)], acc + t * H, H);
      }
  });
  r.y = pooled_empty(x.dtype, {T, H});
  convert_from_f32(acc, r.y.view().data, x.dtype, T * H);
  return r;
}

}  // namespace ot::moe
