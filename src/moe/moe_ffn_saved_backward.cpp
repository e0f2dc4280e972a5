// moe_ffn_forward_train: the moe_ffn forward on unpacked weights, keeping what moe_ffn_backward
// needs (see ot/moe_bwd.h for what is kept and what is recomputed).
#include <cmath>
#include <cstring>
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"

namespace ot::moe {

namespace bwd {

void check_ffn(const char* op, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o, FfnDims& d) {
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
  OT_CHECK(o.expert_capacity >= -1, op, "expert_capacity", "-1 (dropless) or >= 0", o.expert_capacity);
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

gemm::MatView sub(const TensorView& v, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  const int64_t es = int64_t(dtype_size(v.dtype));
  return {static_cast<const char*>(v.data) + (r0 * v.strides[0] + c0 * v.strides[1]) * es, v.dtype, nr, nc, v.strides[0], v.strides[1]};
}
gemm::MutMatView msub(const TensorView& v, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  auto m = sub(v, r0, nr, c0, nc);
  return {const_cast<void*>(m.data), m.dtype, m.rows, m.cols, m.rs, m.cs};
}

Tensor gather_rows(const TensorView& src, const int32_t* rows, int64_t n) {
  const int64_t H = src.sizes[1];
  const size_t bytes = size_t(H) * dtype_size(src.dtype);
  Tensor out = Tensor::empty(src.dtype, {n, H});
  parallel_rows(n, H, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(static_cast<char*>(out.view().data) + size_t(i) * bytes, static_cast<const char*>(src.data) + size_t(rows[i]) * bytes, bytes);
  });
  return out;
}

Tensor swiglu_rows(const TensorView& z, const float* scale, Tensor* scaled) {
  const int64_t A = z.sizes[0], I = z.sizes[1] / 2;
  Tensor a = Tensor::empty(z.dtype, {A, I});
  if (scaled) *scaled = Tensor::empty(z.dtype, {A, I});
  parallel_rows(A, 2 * I * 8, [&](int64_t i0, int64_t i1) {
    std::vector<float> zr(static_cast<size_t>(2 * I)), ar(static_cast<size_t>(I));
    const int64_t es = int64_t(dtype_size(z.dtype));
    for (int64_t i = i0; i < i1; ++i) {
      convert_to_f32(static_cast<const char*>(z.data) + i * 2 * I * es, z.dtype, zr.data(), 2 * I);
      for (int64_t j = 0; j < I; ++j) ar[size_t(j)] = round_to(z.dtype, zr[size_t(j)] / (1.f + std::exp(-zr[size_t(j)])) * zr[size_t(j + I)]);
      convert_from_f32(ar.data(), static_cast<char*>(a.view().data) + i * I * es, z.dtype, I);
      if (scaled) {
        for (int64_t j = 0; j < I; ++j) ar[size_t(j)] *= scale[i];
        convert_from_f32(ar.data(), static_cast<char*>(scaled->view().data) + i * I * es, z.dtype, I);
      }
    }
  });
  return a;
}

// z [n, 2I] = v [n, H] @ [Wg | Wu] (both [H, I]).
void gate_up(const gemm::MatView& v, const TensorView& wg, const TensorView& wu, const TensorView& z, int64_t r0) {
  const int64_t n = v.rows, I = wg.sizes[1];
  gemm::matmul(v, gemm::MatView::of(wg), msub(z, r0, n, 0, I));
  gemm::matmul(v, gemm::MatView::of(wu), msub(z, r0, n, I, I));
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
  scope.kernel(gemm::kernel_name(x.dtype, x.dtype, d.T)).args(x.shape_str() + " E=" + std::to_string(d.E) + " K=" + std::to_string(d.K));
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
  int64_t cap = o.capacity_factor > 0 ? moe_capacity(T, K, E, o.capacity_factor) : o.expert_capacity;
  s.plan = moe_routing_plan(s.topk_ids, s.topk_weights, E, cap);
  s.dropped = s.plan.dropped;
  s.expert_counts = Tensor::empty(DType::i64, {E});
  std::copy(s.plan.counts.begin(), s.plan.counts.end(), s.expert_counts.ptr<int64_t>());

  const int64_t A = int64_t(s.plan.token.size());
  auto spans = bwd::expert_spans(s.plan);
  Tensor xs = bwd::gather_rows(x, s.plan.token.data(), A);
  s.z = Tensor::empty(x.dtype, {A, 2 * I});
  Tensor o_rows = Tensor::empty(DType::f32, {A, H});
  const bool par = bwd::groups_distinct(spans, E) && A * H * I >= (int64_t(1) << 18);
  bwd::for_each_span(spans, par, [&](const bwd::Span& sp) {
    bwd::gate_up(bwd::sub(xs, sp.offset, sp.count, 0, H), w.gate.select(0, sp.group), w.up.select(0, sp.group), s.z, sp.offset);
  });
  Tensor a = bwd::swiglu_rows(s.z, nullptr, nullptr);
  bwd::for_each_span(spans, par, [&](const bwd::Span& sp) {
    gemm::matmul(bwd::sub(a, sp.offset, sp.count, 0, I), gemm::MatView::of(w.down.select(0, sp.group)), bwd::msub(o_rows, sp.offset, sp.count, 0, H));
  });
  Tensor acc = Tensor::empty(DType::f32, {T, H});
  if (o.residual.defined()) copy_into(o.residual, acc.view());
  else std::memset(acc.view().data, 0, acc.view().nbytes());
  if (d.Is > 0) {
    s.shared_z = Tensor::empty(x.dtype, {T, 2 * d.Is});
    bwd::gate_up(gemm::MatView::of(x), w.shared_gate, w.shared_up, s.shared_z, 0);
    Tensor as = bwd::swiglu_rows(s.shared_z, nullptr, nullptr);
    gemm::matmul(gemm::MatView::of(as), gemm::MatView::of(w.shared_down), gemm::MutMatView::of(acc), 1.f, 1.f);
  }
  auto rows = bwd::row_of_slot(s.plan, T * K);
  bwd::parallel_rows(T, K * H, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = acc.ptr<float>() + t * H;
      for (int64_t k = 0; k < K; ++k) {
        int32_t i = rows[size_t(t * K + k)];
        if (i < 0) continue;
        const float* src = o_rows.ptr<float>() + int64_t(i) * H;
        const float wt = s.plan.weight[size_t(i)];
        for (int64_t h = 0; h < H; ++h) dst[h] += wt * src[h];
      }
    }
  });
  r.y = Tensor::empty(x.dtype, {T, H});
  copy_into(acc, r.y);
  return r;
}

}  // namespace ot::moe
