// moe_ffn reference: logits by dot products, the reference router, then for every token and each
// of its kept experts the SwiGLU FFN on the unpacked weights, weighted and summed in fp64.
// The intermediate h is rounded to x's dtype, as every GMM pipeline stores it.
#include <cmath>

#include "src/gemm/epilogue_math.h"
#include "src/moe/common.h"
#include "src/moe/ffn_plan.h"

namespace ot::moe::ref {

// y = (silu(x Wg) * (x Wu)) Wd for one token row; EHI weights gate/up [H, I], down [I, H].
static void expert_row(const float* x, const TensorView& g, const TensorView& u, const TensorView& d, DType act_dt, int64_t H, int64_t I,
                       std::vector<float>& out) {
  std::vector<float> ag(static_cast<size_t>(I), 0.f), au(static_cast<size_t>(I), 0.f), w(static_cast<size_t>(std::max(H, I)));
  for (int64_t h = 0; h < H; ++h) {
    impl::load_f32(g, h * I, w.data(), I);
    for (int64_t i = 0; i < I; ++i) ag[size_t(i)] += x[h] * w[size_t(i)];
    impl::load_f32(u, h * I, w.data(), I);
    for (int64_t i = 0; i < I; ++i) au[size_t(i)] += x[h] * w[size_t(i)];
  }
  out.assign(size_t(H), 0.f);
  for (int64_t i = 0; i < I; ++i) {
    float a = round_to(act_dt, gemm::silu(ag[size_t(i)]) * au[size_t(i)]);
    impl::load_f32(d, i * H, w.data(), H);
    for (int64_t h = 0; h < H; ++h) out[size_t(h)] += a * w[size_t(h)];
  }
}

MoeFfnResult moe_ffn(const TensorView& x_in, const TensorView& router_weight, const TensorView& gate, const TensorView& up, const TensorView& down,
                     const MoeFfnOptions& o, const TensorView& sg, const TensorView& su, const TensorView& sd) {
  const char* op = "moe_ffn";
  impl::check_ndim(op, "router_weight", router_weight, 2);
  impl::check_ndim(op, "gate", gate, 3);
  OT_CHECK(up.shape() == gate.shape() && down.ndim == 3 && down.size(0) == gate.size(0) && down.size(1) == gate.size(2) &&
               down.size(2) == gate.size(1), op, "down", "gate/up [E, H, I] and down [E, I, H]", down.shape_str());
  OT_CHECK(!o.shared || sg.defined(), op, "shared", "the shared expert's unpacked weights", "none");
  int64_t E = gate.size(0), H = gate.size(1), I = gate.size(2);
  // The shared expert has its own intermediate size Is: gate/up [H, Is] (or [1, H, Is]), down [Is, H].
  int64_t Is = o.shared ? sg.size(sg.ndim - 1) : 0;
  if (o.shared) {
    auto is_2d = [](const TensorView& v, int64_t r, int64_t c) {
      return (v.ndim == 2 && v.size(0) == r && v.size(1) == c) || (v.ndim == 3 && v.size(0) == 1 && v.size(1) == r && v.size(2) == c);
    };
    OT_CHECK(is_2d(sg, H, Is) && is_2d(su, H, Is) && is_2d(sd, Is, H), op, "shared_down",
             detail::cat("shared gate/up [H, Is] and down [Is, H] with H = ", H), sg.shape_str(), ", ", su.shape_str(), ", ", sd.shape_str());
  }
  impl::FfnPlan p = impl::plan_ffn(x_in, router_weight.size(1), router_weight.size(0), H, I, gate.dtype, E, o, H, gate.dtype);
  Tensor hold[8];
  TensorView x = impl::contig(x_in, hold[0]), rw = impl::contig(router_weight, hold[1]);
  TensorView G = impl::contig(gate, hold[2]), U = impl::contig(up, hold[3]), D = impl::contig(down, hold[4]);
  TensorView SG = impl::contig(sg, hold[5]), SU = impl::contig(su, hold[6]), SD = impl::contig(sd, hold[7]);
  MoeFfnResult r;
  r.router_logits = Tensor::empty(DType::f32, {p.T, E});
  std::vector<float> xr(static_cast<size_t>(H)), rr(static_cast<size_t>(H));
  for (int64_t t = 0; t < p.T; ++t) {
    impl::load_f32(x, t * H, xr.data(), H);
    for (int64_t e = 0; e < E; ++e) {
      impl::load_f32(rw, e * H, rr.data(), H);
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += double(xr[size_t(h)]) * double(rr[size_t(h)]);
      r.router_logits.ptr<float>()[t * E + e] = float(s);
    }
  }
  GatingResult g = impl::run_router(r.router_logits, o, true);
  r.topk_ids = g.expert_idx;
  r.topk_weights = g.y;
  r.expert_counts = Tensor::zeros(DType::i64, {E});
  std::vector<double> acc(static_cast<size_t>(p.T * H), 0.0);
  if (o.residual.defined())
    for (int64_t i = 0; i < p.T * H; ++i) acc[size_t(i)] = get_as_double(o.residual, i);
  std::vector<float> out;
  for (int64_t t = 0; t < p.T; ++t) {
    impl::load_f32(x, t * H, xr.data(), H);
    if (o.shared) {
      expert_row(xr.data(), SG, SU, SD, x.dtype, H, Is, out);
      for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += out[size_t(h)];
    }
    for (int64_t k = 0; k < p.K; ++k) {
      int32_t e = r.topk_ids.ptr<int32_t>()[t * p.K + k];
      int64_t before = r.expert_counts.ptr<int64_t>()[e]++;
      if (p.cap >= 0 && before >= p.cap) { ++r.dropped; continue; }  // later tokens lose their place
      expert_row(xr.data(), G.select(0, e), U.select(0, e), D.select(0, e), x.dtype, H, I, out);
      double w = r.topk_weights.ptr<float>()[t * p.K + k];
      for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += w * out[size_t(h)];
    }
  }
  r.y = Tensor::empty(x.dtype, {p.T, H});
  for (int64_t i = 0; i < p.T * H; ++i) set_from_double(r.y, i, acc[size_t(i)]);
  return r;
}

}  // namespace ot::moe::ref
