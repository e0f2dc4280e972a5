// moe_ffn and its stages. The expert FFN is two grouped GEMMs on the engine:
//   1. h[sorted rows] = swiglu(x[gather rows] @ [Wg | Wu])   (row gather in the A operand)
//   2. out[scatter rows] += scale * (h @ Wd)                 (scale and scatter-add in the epilogue)
// so the token permutation and the weighted combine never touch memory on their own.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ot/cpu.h"
#include "ot/moe/ffn.h"
#include "ot/moe/quant_experts.h"
#include "ot/moe/loss.h"
#include "ot/moe/routing.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/knobs.h"
#include "src/moe/common.h"
#include "src/moe/ffn_plan.h"
#include "src/ref/moe_ffn_ref.h"

namespace ot::moe {

// A/B switch for the one-chain shared expert (impl::shared_and_routed_ffn); both give the same bits.
static knobs::Knob g_shared_in_chain("moe.shared_in_chain", 1, 0, 1, "moe_ffn: 1 = the shared expert's GEMMs join the routed experts' chain, 0 = a call of its own first");

ExpertRows RoutingPlan::rows() const {
  ExpertRows r;
  r.offsets = offsets;
  r.first_expert = first_expert;
  r.gather = token.data();
  r.scale = weight.data();
  r.scatter = token.data();
  return r;
}

RoutingPlan moe_routing_plan(const TensorView& ids_in, const TensorView& w_in, int64_t E, int64_t cap, int64_t b, int64_t e_end) {
  const char* op = "moe_routing_plan";
  OT_CHECK(E >= 1, op, "num_experts", ">= 1", E);
  impl::check_ndim(op, "topk_ids", ids_in, 2);
  impl::check_ids(op, "topk_ids", ids_in, 0, E);
  impl::check_float(op, "topk_weights", w_in);
  OT_CHECK(w_in.shape() == ids_in.shape(), op, "topk_weights", "the shape of topk_ids", w_in.shape_str(), " vs ", ids_in.shape_str());
  if (e_end < 0) e_end = E;
  OT_CHECK(b >= 0 && b <= e_end && e_end <= E, op, "expert_range", detail::cat("0 <= begin <= end <= E = ", E), b, ", ", e_end);
  OT_CHECK(cap == -1 || cap >= 0, op, "expert_capacity", "-1 (dropless) or >= 0", cap);
  Tensor hi, hw;
  TensorView ids = impl::contig(ids_in, hi), w = impl::contig(w_in, hw);
  const int32_t* id = ids.ptr<int32_t>();
  const int64_t NK = ids.numel(), K = ids.size(1), EL = e_end - b;
  RoutingPlan p;
  p.first_expert = b;
  p.counts.assign(size_t(EL), 0);
  for (int64_t j = 0; j < NK; ++j) if (id[j] >= b && id[j] < e_end) ++p.counts[size_t(id[j] - b)];
  p.offsets.assign(size_t(EL + 1), 0);
  for (int64_t e = 0; e < EL; ++e) {
    int64_t kept = cap < 0 ? p.counts[size_t(e)] : std::min(p.counts[size_t(e)], cap);
    p.dropped += p.counts[size_t(e)] - kept;
    p.offsets[size_t(e + 1)] = p.offsets[size_t(e)] + kept;
  }
  int64_t A = p.offsets.back();
  p.token.resize(size_t(A)); p.slot.resize(size_t(A)); p.weight.resize(size_t(A));
  std::vector<int64_t> fill(p.offsets.begin(), p.offsets.end() - 1);
  for (int64_t j = 0; j < NK; ++j) {  // token-major walk = the canonical stable order
    if (id[j] < b || id[j] >= e_end) continue;
    int64_t e = id[j] - b;
    if (fill[size_t(e)] == p.offsets[size_t(e + 1)]) continue;  // over capacity: dropped
    int64_t i = fill[size_t(e)]++;
    p.token[size_t(i)] = int32_t(j / K);
    p.slot[size_t(i)] = int32_t(j);
    p.weight[size_t(i)] = impl::load1(w, j);
  }
  return p;
}

namespace impl {

void check_out_and_rows(const char* op, const TensorView& out, int64_t H, const ExpertRows& rows, int64_t E, int64_t x_rows) {
  check_ndim(op, "out", out, 2);
  check_float(op, "out", out);
  OT_CHECK(out.size(1) == H && out.is_contiguous(), op, "out", detail::cat("a contiguous [*, H] with H = ", H), out.shape_str());
  const int64_t out_rows = out.size(0);
  int64_t EL = int64_t(rows.offsets.size()) - 1;
  OT_CHECK(EL >= 0 && rows.offsets[0] == 0, op, "rows", "offsets starting at 0", rows.offsets.size());
  OT_CHECK(rows.first_expert >= 0 && rows.first_expert + EL <= E, op, "rows", detail::cat("experts within [0, ", E, ")"), rows.first_expert, " + ", EL);
  for (int64_t e = 0; e < EL; ++e) OT_CHECK(rows.offsets[size_t(e + 1)] >= rows.offsets[size_t(e)], op, "rows", "non-decreasing offsets", e);
  const int64_t A = rows.rows();
  OT_CHECK(rows.gather || A <= x_rows, op, "x", detail::cat("at least ", A, " rows"), x_rows);
  OT_CHECK(rows.scatter || A <= out_rows, op, "out", detail::cat("at least ", A, " rows"), out_rows);
  for (int64_t i = 0; i < A; ++i) {
    OT_CHECK(!rows.gather || (rows.gather[i] >= 0 && rows.gather[i] < x_rows), op, "rows.gather", "row ids of x", rows.gather[i]);
    OT_CHECK(!rows.scatter || (rows.scatter[i] >= 0 && rows.scatter[i] < out_rows), op, "rows.scatter", "row ids of out", rows.scatter[i]);
  }
}

}  // namespace impl

namespace {

// The two GEMM jobs of each expert of ex with rows: gate/up (x rows gathered, SwiGLU) into the
// intermediate h [rows, I] (at hp, in hdt), and down (scaled, scattered) into out.
void add_expert_jobs(const TensorView& x, const MoeExperts& ex, const ExpertRows& rows, const TensorView& out, bool accumulate,
                     const float* xsc, char* hp, DType hdt, std::vector<gemm::Group>& up, std::vector<gemm::Group>& down) {
  const int64_t EL = int64_t(rows.offsets.size()) - 1, H = ex.hidden(), I = ex.intermediate();
  const size_t xs = dtype_size(x.dtype), hs = dtype_size(hdt), os = dtype_size(out.dtype);
  for (int64_t e = 0; e < EL; ++e) {
    int64_t off = rows.offsets[size_t(e)], M = rows.offsets[size_t(e + 1)] - off;
    if (M == 0) continue;
    int64_t eid = rows.first_expert + e;
    gemm::Group g;
    g.M = M;
    g.a = rows.gather ? gemm::AOperand{x.data, x.dtype, H, rows.gather + off, xsc}
                      : gemm::AOperand{static_cast<const char*>(x.data) + size_t(off * H) * xs, x.dtype, H, nullptr, xsc ? xsc + off : nullptr};
    g.b = &ex.gate_up(eid);
    g.c = {hp + size_t(off * I) * hs, hdt, I};
    g.ep.act = gemm::Act::swiglu;
    up.push_back(g);
    gemm::Group d;
    d.M = M;
    d.a = {hp + size_t(off * I) * hs, hdt, I, nullptr};
    d.b = &ex.down(eid);
    d.c = rows.scatter ? gemm::COperand{out.data, out.dtype, H}
                       : gemm::COperand{static_cast<char*>(out.data) + size_t(off * H) * os, out.dtype, H};
    d.ep.row_scale = rows.scale ? rows.scale + off : nullptr;
    d.ep.scatter_rows = rows.scatter ? rows.scatter + off : nullptr;
    d.ep.accumulate = accumulate;
    down.push_back(d);
  }
}

// The gate/up jobs of every expert run first on all threads; a thread out of gate/up work starts
// its down share of the experts already done instead of waiting at a barrier for the other
// thread's last whole-expert unit.
void run_chain(const std::vector<gemm::Group>& up, const std::vector<gemm::Group>& down) {
  gemm::grouped_gemm_chain(up.data(), down.data(), int64_t(up.size()));
}

}  // namespace

void moe_expert_ffn(const TensorView& x, const MoeExperts& ex, const ExpertRows& rows, const TensorView& out, bool accumulate,
                    const TensorView& x_scale) {
  const char* op = "moe_expert_ffn";
  impl::check_ndim(op, "x", x, 2);
  const bool quant = x.dtype == DType::i8;
  OT_CHECK(x.dtype == ex.dtype() || quant, op, "x", detail::cat("the experts' dtype ", dtype_name(ex.dtype()), " or i8 with x_scale"), dtype_name(x.dtype));
  if (quant) {
    OT_CHECK(x_scale.defined() && x_scale.ndim == 1 && x_scale.dtype == DType::f32 && x_scale.is_contiguous() && x_scale.size(0) == x.size(0), op,
             "x_scale", detail::cat("a contiguous f32 [", x.size(0), "] (one scale per int8 row of x)"),
             x_scale.defined() ? x_scale.shape_str() : std::string("undefined"));
  } else {
    OT_CHECK(!x_scale.defined(), op, "x_scale", "undefined unless x is i8", x_scale.shape_str());
  }
  OT_CHECK(x.size(1) == ex.hidden(), op, "x", detail::cat("[*, H] with H = ", ex.hidden()), x.shape_str());
  OT_CHECK(x.is_contiguous(), op, "x", "a contiguous tensor", "strided");
  impl::check_out_and_rows(op, out, ex.hidden(), rows, ex.num_experts(), x.size(0));
  const int64_t A = rows.rows(), I = ex.intermediate();
  if (A == 0) return;
  const DType hdt = ex.dtype();  // the intermediate is stored in the experts' dtype (x's unless x is i8)
  char* h = static_cast<char*>(impl::scratch(0, size_t(A * I) * dtype_size(hdt)));
  std::vector<gemm::Group> up, down;
  add_expert_jobs(x, ex, rows, out, accumulate, quant ? x_scale.ptr<float>() : nullptr, h, hdt, up, down);
  run_chain(up, down);
}

namespace impl {

// The shared expert (every token, weight 1) and the routed experts in one chain: at decode the
// shared expert's few rows are one more ~1.5 MiB weight stream among the routed ones, where its own
// call ran a single expert on two threads at ~35 GB/s. Its jobs come first, so every output element
// still adds the shared expert's row, then the routed experts' in expert order (the order of two
// separate calls: the same bits).
void shared_ffn(const TensorView& x, const MoeExperts& shared, const TensorView& acc) {
  ExpertRows all;
  all.offsets = {0, x.size(0)};
  moe_expert_ffn(x, shared, all, acc, true);
}

void shared_and_routed_ffn(const TensorView& x, const MoeExperts& shared, const MoeExperts& ex, const ExpertRows& rows, const TensorView& acc) {
  const int64_t T = x.size(0), A = rows.rows();
  ExpertRows all;
  all.offsets = {0, T};
  check_out_and_rows("moe_ffn", acc, ex.hidden(), rows, ex.num_experts(), T);
  const DType hdt = ex.dtype();
  const size_t shared_bytes = size_t(T * shared.intermediate()) * dtype_size(hdt);  // h: the shared expert's [T, Is], then the routed [A, I]
  char* h = static_cast<char*>(scratch(0, shared_bytes + size_t(A * ex.intermediate()) * dtype_size(hdt)));
  std::vector<gemm::Group> up, down;
  add_expert_jobs(x, shared, all, acc, true, nullptr, h, hdt, up, down);
  add_expert_jobs(x, ex, rows, acc, true, nullptr, h + shared_bytes, hdt, up, down);
  run_chain(up, down);
}

}  // namespace impl

namespace impl {

FfnPlan plan_ffn(const TensorView& x, int64_t router_h, int64_t router_e, int64_t H, int64_t I, DType wdt, int64_t E, const MoeFfnOptions& o,
                 int64_t shared_h, DType shared_dt) {
  const char* op = "moe_ffn";
  FfnPlan p;
  check_ndim(op, "x", x, 2);
  check_float(op, "x", x);
  OT_CHECK(E >= 1, op, "experts", "at least one expert", E);
  OT_CHECK(x.dtype == wdt, op, "experts", detail::cat("weights in x's dtype ", dtype_name(x.dtype)), dtype_name(wdt));
  OT_CHECK(x.size(1) == H, op, "x", detail::cat("[T, H] with the experts' H = ", H), x.shape_str());
  OT_CHECK(router_h == H && router_e == E, op, "router", detail::cat("an [E, H] = [", E, ", ", H, "] router weight"), "[", router_e, ", ", router_h, "]");
  OT_CHECK(o.k >= 1 && o.k <= E && o.k <= 1024, op, "k", detail::cat("1 <= k <= min(E, 1024) with E = ", E), o.k);
  p.T = x.size(0); p.H = H; p.E = E; p.K = o.k;
  if (o.residual.defined()) {
    check_float(op, "residual", o.residual);
    OT_CHECK(o.residual.shape() == x.shape(), op, "residual", "the shape of x", o.residual.shape_str());
  }
  if (o.shared) {
    OT_CHECK(shared_h == H && shared_dt == wdt, op, "shared", "an expert store with the same H and dtype", shared_h);
  }
  p.cap = ffn_capacity(op, o, p.T, E);
  return p;
}

int64_t ffn_capacity(const char* op, const MoeFfnOptions& o, int64_t T, int64_t E) {
  OT_CHECK(o.expert_capacity >= -1, op, "expert_capacity", "-1 (dropless) or >= 0", o.expert_capacity);
  const double f = o.capacity_factor;
  OT_CHECK(f == 0 || (f > 0 && std::isfinite(f)), op, "capacity_factor", "0 (use expert_capacity) or a finite number > 0", f);
  return f > 0 ? moe_capacity(T, o.k, E, f) : o.expert_capacity;
}

// Router stage on fp32 logits; returns fp32 weights (renormalised if asked) and ids.
GatingResult run_router(const TensorView& logits, const MoeFfnOptions& o) {
  GatingResult g;
  switch (o.router) {
    case RouterKind::softmax_topk:
      g = moe_gating_top_k_softmax(logits, o.k, {}, o.allowed);
      break;
    case RouterKind::softmax_topk_v2:
      g = moe_gating_top_k_softmax_v2(logits, o.k, {}, o.renorm, false, o.allowed);
      break;
    case RouterKind::gating_top_k: {
      GatingTopKOptions go = o.gating;
      go.k = o.k;
      go.allowed = o.allowed;
      g = moe_gating_top_k(logits, go);
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

}  // namespace impl

namespace impl {

MoeFfnResult run_ffn(const FfnPlan& p, const TensorView& x_in, const gemm::PackedB& router, const MoeFfnOptions& o, const FfnExperts& ex) {
  trace::OpScope scope("moe_ffn");
  if (scope.active()) scope.kernel(ex.kernel(p.T)).args(x_in.shape_str() + " E=" + std::to_string(p.E) + " K=" + std::to_string(p.K));
  // Router + 3 GEMMs per routed pair + 3 per token for the shared expert (its own intermediate size).
  const double shared_i = o.shared ? double(o.shared->intermediate()) : o.shared_quant ? double(o.shared_quant->intermediate()) : 0.0;
  scope.flops(2.0 * double(p.T) * double(p.H) * (double(p.E) + 3.0 * (double(p.K) * double(ex.intermediate) + shared_i)));
  Tensor hx;
  TensorView x = contig(x_in, hx);
  MoeFfnResult r;
  r.router_logits = Tensor::empty(DType::f32, {p.T, p.E});
  gemm::gemm(p.T, {x.data, x.dtype, p.H, nullptr}, router, {r.router_logits.view().data, DType::f32, p.E});
  GatingResult g = run_router(r.router_logits, o);
  r.topk_ids = g.expert_idx;
  r.topk_weights = g.y;
  RoutingPlan plan = moe_routing_plan(r.topk_ids, r.topk_weights, p.E, p.cap);
  r.dropped = plan.dropped;
  if (scope.active()) {  // name what the expert GEMMs run: experts of 1-3 rows take the decode kernel, larger ones the tile kernel
    int64_t lo = p.T, hi = 0;
    for (size_t e = 0; e + 1 < plan.offsets.size(); ++e)
      if (int64_t n = plan.offsets[e + 1] - plan.offsets[e]) lo = std::min(lo, n), hi = std::max(hi, n);
    std::string a = ex.kernel(lo), b = ex.kernel(hi);
    if (hi > 0) scope.kernel(a == b ? a : a + "+" + b);
  }
  r.expert_counts = Tensor::empty(DType::i64, {p.E});
  std::copy(plan.counts.begin(), plan.counts.end(), r.expert_counts.ptr<int64_t>());
  // fp32 accumulator: the output itself when it is fp32, else one [T, H] buffer cast at the end.
  // Pooled output (no first-touch faults per call); the clear and the final cast run on all
  // threads (at T 512 they are 4 MiB each, serial they cost ~1% of the layer).
  r.y = pooled_empty(x.dtype, {p.T, p.H});
  TensorView acc = x.dtype == DType::f32 ? r.y.view() : TensorView(scratch(1, size_t(p.T * p.H) * 4), DType::f32, {p.T, p.H});
  float* accp = acc.ptr<float>();
  if (o.residual.defined()) copy_into(o.residual, acc);
  else parallel_for_sized(p.T, double(p.T * p.H) * 4, [&](int64_t t0, int64_t t1) { std::memset(accp + t0 * p.H, 0, size_t((t1 - t0) * p.H) * 4); });
  ex.run(x, plan.rows(), acc, o.shared && p.T > 0 ? o.shared : nullptr);
  if (x.dtype != DType::f32) {
    char* y = static_cast<char*>(r.y.view().data);
    const size_t ys = dtype_size(x.dtype);
    parallel_for_sized(p.T, double(p.T * p.H) * double(4 + ys),
                       [&](int64_t t0, int64_t t1) { convert_from_f32(accp + t0 * p.H, y + size_t(t0 * p.H) * ys, x.dtype, (t1 - t0) * p.H); });
  }
  return r;
}

}  // namespace impl

MoeFfnResult moe_ffn(const TensorView& x_in, const gemm::PackedB& router, const MoeExperts& ex, const MoeFfnOptions& o) {
  OT_CHECK(!o.shared_quant, "moe_ffn", "shared_quant", "null on a float expert store (opt.shared takes its shared expert)", "a quantised store");
  impl::FfnPlan p = impl::plan_ffn(x_in, router.K(), router.N(), ex.hidden(), ex.intermediate(), ex.dtype(), ex.num_experts(), o,
                                   o.shared ? o.shared->hidden() : 0, o.shared ? o.shared->dtype() : DType::f32);
  impl::FfnExperts run;
  run.intermediate = ex.intermediate();
  run.kernel = [&](int64_t rows) { return std::string(gemm::kernel_name(x_in.dtype, ex.dtype(), rows)); };
  run.run = [&](const TensorView& x, const ExpertRows& rows, const TensorView& acc, const MoeExperts* shared) {
    if (shared && g_shared_in_chain.get()) return impl::shared_and_routed_ffn(x, *shared, ex, rows, acc);
    if (shared) impl::shared_ffn(x, *shared, acc);
    moe_expert_ffn(x, ex, rows, acc, true);
  };
  return impl::run_ffn(p, x_in, router, o, run);
}

namespace ref {
// The entry point's validation on the unpacked weights, then the plain reference.
MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight, const TensorView& gate, const TensorView& up, const TensorView& down,
                     const MoeFfnOptions& o, const TensorView& sg, const TensorView& su, const TensorView& sd) {
  const char* op = "moe_ffn";
  impl::check_ndim(op, "router_weight", router_weight, 2);
  impl::check_ndim(op, "gate", gate, 3);
  OT_CHECK(up.shape() == gate.shape() && down.ndim == 3 && down.size(0) == gate.size(0) && down.size(1) == gate.size(2) &&
               down.size(2) == gate.size(1), op, "down", "gate/up [E, H, I] and down [E, I, H]", down.shape_str());
  OT_CHECK(!o.shared_quant, op, "shared_quant", "null on float experts (opt.shared takes the shared expert)", "a quantised store");
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
  impl::plan_ffn(x, router_weight.size(1), router_weight.size(0), H, I, gate.dtype, E, o, H, gate.dtype);
  return refimpl::moe_ffn(x, router_weight, gate, up, down, o, sg, su, sd);
}
}  // namespace ref

}  // namespace ot::moe
