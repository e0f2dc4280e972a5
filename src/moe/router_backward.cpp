// Backward of the routers: the selection is piecewise constant, so only the k selected scores
// carry gradient; softmax / sigmoid / renormalisation / routed scaling are differentiated in
// closed form per token (fp64 per row, parallel over tokens).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace {
bool finished_row(const int32_t* ids, int64_t E) { return ids[0] == E; }

// p = softmax of the row x over the allowed experts (disallowed: p = 0).
void softmax_row(const std::vector<double>& x, int64_t E, const uint8_t* allowed, std::vector<double>& p) {
  double m = -std::numeric_limits<double>::infinity(), sum = 0;
  for (int64_t e = 0; e < E; ++e)
    if (!allowed || allowed[e]) m = std::fmax(m, x[size_t(e)]);
  for (int64_t e = 0; e < E; ++e) {
    p[size_t(e)] = (!allowed || allowed[e]) ? std::exp(x[size_t(e)] - m) : 0.0;
    sum += p[size_t(e)];
  }
  for (auto& v : p) v /= sum;
}

// d_x[t] = p * (g - sum(g * p)) with g the gradient of the selected probabilities.
void softmax_grad_row(const std::vector<double>& p, const std::vector<double>& g, float* dx, int64_t E) {
  double dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += g[size_t(e)] * p[size_t(e)];
  for (int64_t e = 0; e < E; ++e) dx[e] = float(p[size_t(e)] * (g[size_t(e)] - dot));
}

// One token's rows in fp64: x [E] (logits or scores), dy [K], and work rows p, g [E].
struct Row { std::vector<double> x, dy, p, g; };
void read_row(const TensorView& v, int64_t t, int64_t n, std::vector<float>& tmp, std::vector<double>& out) {
  convert_to_f32(static_cast<const char*>(v.data) + t * n * int64_t(dtype_size(v.dtype)), v.dtype, tmp.data(), n);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = tmp[size_t(i)];
}

// fn(t, row, dx row) for every token; x [T, E] and dy [T, K] are contiguous (checked by the plan).
template <class F> Tensor per_token(const TensorView& x, const TensorView& dy, int64_t T, int64_t E, int64_t K, F fn) {
  Tensor dx = Tensor::zeros(DType::f32, {T, E});
  bwd::parallel_rows(T, E * 8, [&](int64_t t0, int64_t t1) {
    Row r{std::vector<double>(size_t(E)), std::vector<double>(size_t(K)), std::vector<double>(size_t(E)), std::vector<double>(size_t(E))};
    std::vector<float> tmp(size_t(std::max(E, K)));
    for (int64_t t = t0; t < t1; ++t) {
      read_row(x, t, E, tmp, r.x);
      read_row(dy, t, K, tmp, r.dy);
      fn(t, r, dx.ptr<float>() + t * E);
    }
  });
  return dx;
}
}  // namespace

Tensor moe_gating_top_k_softmax_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, const TensorView& allowed) {
  return moe_gating_top_k_softmax_v2_backward(dy, x, ids, 0, allowed);
}

Tensor moe_gating_top_k_softmax_v2_backward(const TensorView& dy, const TensorView& x, const TensorView& ids, int renorm,
                                            const TensorView& allowed) {
  const char* op = "moe_gating_top_k_softmax_backward";
  auto p = bwd::plan_router_backward(op, dy, x, "x", ids, allowed);
  OT_CHECK(renorm == 0 || renorm == 1, op, "renorm", "0 or 1", renorm);
  if (cpu::force_ref()) return ref::moe_gating_top_k_softmax_v2_backward(dy, x, ids, renorm, allowed);
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel("fp64").args(x.shape_str());
  const int64_t E = p.E, K = p.K;
  const int32_t* id = ids.ptr<int32_t>();
  const uint8_t* al = allowed.defined() ? allowed.ptr<uint8_t>() : nullptr;
  return per_token(x, dy, p.T, E, K, [&](int64_t t, Row& r, float* dx) {
    const int32_t* row = id + t * K;
    if (finished_row(row, E)) return;
    if (renorm == 0) {
      softmax_row(r.x, E, al ? al + t * E : nullptr, r.p);
      std::fill(r.g.begin(), r.g.end(), 0.0);
      for (int64_t k = 0; k < K; ++k) r.g[size_t(row[k])] += r.dy[size_t(k)];
      softmax_grad_row(r.p, r.g, dx, E);
      return;
    }
    // renorm 1: softmax over the k selected logits only.
    double m = -std::numeric_limits<double>::infinity(), sum = 0, dot = 0;
    for (int64_t k = 0; k < K; ++k) m = std::fmax(m, r.x[size_t(row[k])]);
    for (int64_t k = 0; k < K; ++k) sum += (r.p[size_t(k)] = std::exp(r.x[size_t(row[k])] - m));
    for (int64_t k = 0; k < K; ++k) dot += (r.p[size_t(k)] /= sum) * r.dy[size_t(k)];
    for (int64_t k = 0; k < K; ++k) dx[row[k]] = float(r.p[size_t(k)] * (r.dy[size_t(k)] - dot));
  });
}

Tensor moe_gating_top_k_backward(const TensorView& dy, const TensorView& scores, const TensorView& ids, int renorm, int norm_type,
                                 float rsf, float eps) {
  const char* op = "moe_gating_top_k_backward";
  auto p = bwd::plan_router_backward(op, dy, scores, "scores", ids, {});
  OT_CHECK(renorm == 0 || renorm == 1, op, "renorm", "0 or 1", renorm);
  OT_CHECK(norm_type == 0 || norm_type == 1, op, "norm_type", "0 (softmax) or 1 (sigmoid)", norm_type);
  if (cpu::force_ref()) return ref::moe_gating_top_k_backward(dy, scores, ids, renorm, norm_type, rsf, eps);
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel("fp64").args(scores.shape_str());
  const int64_t E = p.E, K = p.K;
  const int32_t* id = ids.ptr<int32_t>();
  const bool normalise = norm_type == 1 || renorm == 1;
  return per_token(scores, dy, p.T, E, K, [&](int64_t t, Row& r, float* dx) {
    const int32_t* row = id + t * K;
    if (finished_row(row, E)) return;
    const std::vector<double>& s = r.x;
    std::vector<double>& g = r.g;
    double S = 0, dot = 0;
    for (int64_t k = 0; k < K; ++k) {
      S += s[size_t(row[k])];
      dot += rsf * r.dy[size_t(k)] * s[size_t(row[k])];
    }
    std::fill(g.begin(), g.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {  // gradient of the selected scores
      double dv = rsf * r.dy[size_t(k)];
      g[size_t(row[k])] = normalise ? dv / (S + eps) - dot / ((S + eps) * (S + eps)) : dv;
    }
    if (norm_type == 0) { softmax_grad_row(s, g, dx, E); return; }
    for (int64_t k = 0; k < K; ++k) {
      double v = s[size_t(row[k])];
      dx[row[k]] = float(g[size_t(row[k])] * v * (1 - v));
    }
  });
}

Tensor topk_renorm_backward(const TensorView& dw, const TensorView& y) {
  const char* op = "topk_renorm_backward";
  OT_CHECK(y.ndim == 2 && y.is_contiguous(), op, "y", "a contiguous [T, K]", y.shape_str());
  bwd::check_float(op, "y", y);
  bwd::check_float(op, "dw", dw);
  OT_CHECK(dw.shape() == y.shape() && dw.is_contiguous(), op, "dw", "y's shape, contiguous", dw.shape_str());
  if (cpu::force_ref()) return ref::topk_renorm_backward(dw, y);
  const int64_t T = y.sizes[0], K = y.sizes[1];
  Tensor dy = Tensor::empty(DType::f32, {T, K});
  bwd::parallel_rows(T, K * 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      double S = 0, dot = 0;
      for (int64_t k = 0; k < K; ++k) S += get_as_double(y, t * K + k);
      for (int64_t k = 0; k < K; ++k) dot += get_as_double(dw, t * K + k) * get_as_double(y, t * K + k) / S;
      for (int64_t k = 0; k < K; ++k) dy.ptr<float>()[t * K + k] = float((get_as_double(dw, t * K + k) - dot) / S);
    }
  });
  return dy;
}

}  // namespace ot::moe
