// moe_ffn reference: logits by dot products, the reference router, then for every token and each
// of its kept experts the SwiGLU FFN on the unpacked weights, weighted and summed in fp64.
// The intermediate h is rounded to x's dtype, as every GMM pipeline stores it.
#include "src/ref/moe_ffn_ref.h"

#include <cmath>
#include <vector>

#include "ot/moe/router.h"
#include "ot/numeric.h"
#include "src/ref/act_math.h"
#include "src/ref/quant_ref.h"

namespace ot::moe::refimpl {

// Every element of v (any strides) in row-major order, in fp32.
static std::vector<float> floats(const TensorView& v) {
  std::vector<float> r(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = float(get_as_double(v, int64_t(i)));
  return r;
}

// A row as the W8A8 experts see it: quantised per token to int8, dequantised.
static std::vector<float> int8_row(const float* v, int64_t n) {
  Tensor q = ot::refimpl::quantize_dequantize_rows_i8(TensorView(const_cast<float*>(v), DType::f32, {1, n}));
  return std::vector<float>(q.ptr<float>(), q.ptr<float>() + n);
}

// y = (silu(x Wg) * (x Wu)) Wd for one token row; gate/up [H, I], down [I, H] row-major.
// int8_rows: x and the intermediate enter their products as int8_row.
static void expert_row(const float* x_in, const float* g, const float* u, const float* d, DType act_dt, int64_t H, int64_t I,
                       std::vector<float>& out, bool int8_rows) {
  const std::vector<float> xq = int8_rows ? int8_row(x_in, H) : std::vector<float>();
  const float* x = int8_rows ? xq.data() : x_in;
  std::vector<float> ag(static_cast<size_t>(I), 0.f), au(static_cast<size_t>(I), 0.f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < I; ++i) {
      ag[size_t(i)] += x[h] * g[h * I + i];
      au[size_t(i)] += x[h] * u[h * I + i];
    }
  std::vector<float> a(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) a[size_t(i)] = round_to(act_dt, float(refmath::silu(ag[size_t(i)])) * au[size_t(i)]);
  if (int8_rows) a = int8_row(a.data(), I);
  out.assign(size_t(H), 0.f);
  for (int64_t i = 0; i < I; ++i)
    for (int64_t h = 0; h < H; ++h) out[size_t(h)] += a[size_t(i)] * d[i * H + h];
}

int64_t ffn_capacity(const MoeFfnOptions& o, int64_t T, int64_t E) {
  if (o.capacity_factor > 0) return int64_t(std::ceil(double(T) * double(o.k) / double(E) * o.capacity_factor));
  return o.expert_capacity;
}

GatingResult ffn_router(const TensorView& logits, const MoeFfnOptions& o) {
  GatingResult g;
  switch (o.router) {
    case RouterKind::softmax_topk: g = ref::moe_gating_top_k_softmax(logits, o.k, {}, o.allowed); break;
    case RouterKind::softmax_topk_v2: g = ref::moe_gating_top_k_softmax_v2(logits, o.k, {}, o.renorm, false, o.allowed); break;
    case RouterKind::gating_top_k: {
      GatingTopKOptions go = o.gating;
      go.k = o.k;
      go.allowed = o.allowed;
      g = ref::moe_gating_top_k(logits, go);
      break;
    }
  }
  if (o.norm_topk_prob && o.router != RouterKind::gating_top_k) {
    float* w = g.y.ptr<float>();
    for (int64_t t = 0; t < logits.size(0); ++t) {
      float s = 0;
      for (int64_t j = 0; j < o.k; ++j) s += w[t * o.k + j];
      for (int64_t j = 0; j < o.k; ++j) w[t * o.k + j] /= s;
    }
  }
  return g;
}

MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight, const TensorView& gate, const TensorView& up, const TensorView& down,
                     const MoeFfnOptions& o, const TensorView& sg, const TensorView& su, const TensorView& sd, bool int8_rows,
                     bool shared_int8_rows) {
  const bool has_shared = o.shared || o.shared_quant;
  const int64_t T = x.size(0), E = gate.size(0), H = gate.size(1), I = gate.size(2), K = o.k;
  const int64_t Is = has_shared ? sg.size(sg.ndim - 1) : 0;  // the shared expert's own intermediate size
  const int64_t cap = ffn_capacity(o, T, E);
  const std::vector<float> xf = floats(x), rw = floats(router_weight);
  MoeFfnResult r;
  r.router_logits = Tensor::empty(DType::f32, {T, E});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += double(xf[size_t(t * H + h)]) * double(rw[size_t(e * H + h)]);
      r.router_logits.ptr<float>()[t * E + e] = float(s);
    }
  GatingResult g = ffn_router(r.router_logits, o);
  r.topk_ids = g.expert_idx;
  r.topk_weights = g.y;
  r.expert_counts = Tensor::zeros(DType::i64, {E});
  const std::vector<float> G = floats(gate), U = floats(up), D = floats(down);
  std::vector<float> SG, SU, SD;
  if (has_shared) SG = floats(sg), SU = floats(su), SD = floats(sd);
  std::vector<double> acc(static_cast<size_t>(T * H), 0.0);
  if (o.residual.defined())
    for (int64_t i = 0; i < T * H; ++i) acc[size_t(i)] = get_as_double(o.residual, i);
  std::vector<float> out;
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xf.data() + t * H;
    if (has_shared) {
      expert_row(xr, SG.data(), SU.data(), SD.data(), x.dtype, H, Is, out, shared_int8_rows);
      for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += out[size_t(h)];
    }
    for (int64_t k = 0; k < K; ++k) {
      int32_t e = r.topk_ids.ptr<int32_t>()[t * K + k];
      int64_t before = r.expert_counts.ptr<int64_t>()[e]++;
      if (cap >= 0 && before >= cap) { ++r.dropped; continue; }  // later tokens lose their place
      expert_row(xr, G.data() + e * H * I, U.data() + e * H * I, D.data() + e * I * H, x.dtype, H, I, out, int8_rows);
      double w = r.topk_weights.ptr<float>()[t * K + k];
      for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += w * out[size_t(h)];
    }
  }
  r.y = Tensor::empty(x.dtype, {T, H});
  for (int64_t i = 0; i < T * H; ++i) set_from_double(r.y, i, acc[size_t(i)]);
  return r;
}

}  // namespace ot::moe::refimpl
