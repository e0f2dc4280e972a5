// Grouped matmul (on ot::gemm::grouped_gemm), finalize routing and the per-token expert matmul.
#include <algorithm>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/moe/grouped_plan.h"
#include "src/ref/moe_grouped_ref.h"

namespace ot::moe {

std::vector<GroupSpan> parse_group_list(const char* op, const TensorView& gl, GroupListType type, int64_t G, int64_t rows) {
  std::vector<GroupSpan> spans;
  int64_t off = 0;
  if (type == GroupListType::key_value) {
    OT_CHECK(gl.ndim == 2 && gl.size(1) == 2, op, "group_list", "[G', 2] (group, count) rows for key_value", gl.shape_str());
    std::vector<int64_t> v = impl::read_ints(op, "group_list", gl);
    for (int64_t i = 0; i < gl.size(0); ++i) {
      int64_t g = v[size_t(2 * i)], n = v[size_t(2 * i + 1)];
      OT_CHECK(n >= 0, op, "group_list", "non-negative counts", n, " in row ", i);
      if (n == 0) continue;
      OT_CHECK(g >= 0 && g < G, op, "group_list", detail::cat("group ids in [0, ", G, ")"), g, " in row ", i);
      spans.push_back({g, off, n});
      off += n;
    }
  } else {
    OT_CHECK(type == GroupListType::cumsum || type == GroupListType::count, op, "group_list_type", "0 cumsum, 1 count or 2 key_value", int(type));
    OT_CHECK(gl.ndim == 1 && gl.size(0) == G, op, "group_list", detail::cat("[G] = [", G, "] (one entry per weight)"), gl.shape_str());
    std::vector<int64_t> v = impl::read_ints(op, "group_list", gl);
    for (int64_t g = 0; g < G; ++g) {
      int64_t n = type == GroupListType::count ? v[size_t(g)] : v[size_t(g)] - (g ? v[size_t(g - 1)] : 0);
      OT_CHECK(n >= 0, op, "group_list", type == GroupListType::count ? "non-negative counts" : "a non-decreasing cumsum", v[size_t(g)],
               " at ", g);
      if (n) spans.push_back({g, off, n});
      off += n;
    }
  }
  OT_CHECK(off == rows, op, "group_list", detail::cat("groups summing to the rows of x, M = ", rows), off);
  return spans;
}

namespace impl {

GmmPlan plan_gmm(const char* op, const TensorView& x, int64_t G, int64_t K, int64_t N, DType wdt, const TensorView& group_list,
                 GroupListType type, const TensorView& bias, gemm::Act act) {
  GmmPlan p;
  check_ndim(op, "x", x, 2);
  check_float(op, "x", x);
  OT_CHECK(wdt == x.dtype, op, "weight", detail::cat("the dtype of x (", dtype_name(x.dtype), ")"), dtype_name(wdt));
  OT_CHECK(x.size(1) == K, op, "weight", detail::cat("K = ", x.size(1), " rows (x's columns)"), K);
  OT_CHECK(act != gemm::Act::swiglu || N % 2 == 0, op, "weight", "an even N for swiglu ([gate | up])", N);
  p.M = x.size(0); p.K = K; p.N = N; p.G = G; p.act = act;
  p.n_out = act == gemm::Act::swiglu ? N / 2 : N;
  p.spans = parse_group_list(op, group_list, type, G, p.M);
  if (bias.defined()) {
    check_float(op, "bias", bias);
    OT_CHECK(bias.ndim == 2 && bias.size(0) == G && bias.size(1) == N, op, "bias", detail::cat("[G, N] = [", G, ", ", N, "]"), bias.shape_str());
    p.bias.resize(size_t(G * N));
    for (int64_t i = 0; i < G * N; ++i) p.bias[size_t(i)] = float(get_as_double(bias, i));
  }
  p.x = contig(x, p.hx);
  return p;
}

// Packed form of group g's [K, N] slice, whichever way round it is stored.
static gemm::PackedB pack_slice(const TensorView& w) {
  if (w.stride(0) == 1 && w.size(0) > 1)  // torch [N, K] storage seen through a transposed view
    return gemm::prepack(TensorView(w.data, w.dtype, {w.size(1), w.size(0)}, {w.stride(1), 1}), gemm::BLayout::NK);
  return gemm::prepack(w, gemm::BLayout::KN);
}

static void gmm_run_packed(const GmmPlan& p, const std::vector<const gemm::PackedB*>& packed, const TensorView& y) {
  std::vector<gemm::Group> groups;
  size_t xs = dtype_size(p.x.dtype), ys = dtype_size(y.dtype);
  for (const GroupSpan& s : p.spans) {
    gemm::Group g;
    g.M = s.count;
    g.a = {static_cast<const char*>(p.x.data) + size_t(s.offset * p.K) * xs, p.x.dtype, p.K, nullptr};
    g.b = packed[size_t(s.group)];
    g.c = {static_cast<char*>(y.data) + size_t(s.offset * p.n_out) * ys, y.dtype, p.n_out};
    g.ep.act = p.act;
    g.ep.bias = p.bias.empty() ? nullptr : p.bias.data() + s.group * p.N;
    groups.push_back(g);
  }
  gemm::grouped_gemm(groups.data(), int64_t(groups.size()));
}

static Tensor gmm_entry(const TensorView& x, const TensorView& w, const TensorView& gl, GroupListType type, const TensorView& bias,
                        gemm::Act act, bool ref) {
  const char* op = "grouped_matmul";
  check_ndim(op, "weight", w, 3);
  GmmPlan p = plan_gmm(op, x, w.size(0), w.size(1), w.size(2), w.dtype, gl, type, bias, act);
  p.weight = w;
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel(ref ? "ref" : gemm::kernel_name(x.dtype, w.dtype, p.M)).args(x.shape_str() + " x " + w.shape_str());
  scope.flops(2.0 * double(p.M) * double(p.K) * double(p.N));
  if (ref) return refimpl::grouped_matmul(x, w, gl, type, bias, act);
  Tensor y = pooled_empty(x.dtype, {p.M, p.n_out});
  std::vector<gemm::PackedB> packs(static_cast<size_t>(p.G));
  std::vector<const gemm::PackedB*> ptrs(size_t(p.G), nullptr);
  for (const GroupSpan& s : p.spans)
    if (packs[size_t(s.group)].empty()) { packs[size_t(s.group)] = pack_slice(w.select(0, s.group)); ptrs[size_t(s.group)] = &packs[size_t(s.group)]; }
  gmm_run_packed(p, ptrs, y);
  return y;
}

// ---- finalize routing
FinalizePlan plan_finalize(const char* op, const TensorView& ex, const TensorView& idx, const TensorView& x1, const TensorView& x2,
                           const TensorView& bias, const TensorView& scales, const TensorView& expert_idx, int mode) {
  FinalizePlan p;
  OT_CHECK(mode >= 0 && mode <= 3, op, "drop_pad_mode", "0..3", mode);
  p.mode = mode;
  check_float(op, "expanded_x", ex);
  bool pad = mode == 1 || mode == 3;
  OT_CHECK(ex.ndim == (pad ? 3 : 2), op, "expanded_x", pad ? "[E, C, H] in drop/pad modes" : "[N*K, H]", ex.shape_str());
  check_dtype(op, "expanded_row_idx", idx, DType::i32);
  check_ndim(op, "expanded_row_idx", idx, 1);
  p.H = ex.size(-1);
  p.R = ex.numel() / std::max<int64_t>(p.H, 1);
  if (p.H == 0) p.R = pad ? ex.size(0) * ex.size(1) : ex.size(0);
  if (scales.defined()) {
    check_float(op, "scales", scales);
    check_ndim(op, "scales", scales, 2);
    p.K = scales.size(1);
  }
  OT_CHECK(p.K > 0 && idx.size(0) % p.K == 0, op, "expanded_row_idx", detail::cat("N*K entries with K = ", p.K), idx.size(0));
  p.N = idx.size(0) / p.K;
  if (scales.defined()) check_dim(op, "scales", scales, 0, p.N);
  check_ids(op, "expanded_row_idx", idx, pad ? -1 : 0, p.R - 1);
  auto skip = [&](const char* name, const TensorView& s) {
    if (!s.defined()) return;
    OT_CHECK(s.dtype == ex.dtype, op, name, detail::cat("the dtype of expanded_x (", dtype_name(ex.dtype), ")"), dtype_name(s.dtype));
    OT_CHECK(s.ndim == 2 && s.size(0) == p.N && s.size(1) == p.H, op, name, detail::cat("[N, H] = [", p.N, ", ", p.H, "]"), s.shape_str());
  };
  skip("x1", x1);
  skip("x2", x2);
  OT_CHECK(!x2.defined() || x1.defined(), op, "x2", "given only together with x1", "x2 without x1");
  if (bias.defined()) {
    OT_CHECK(expert_idx.defined(), op, "expert_idx", "given when bias is", "none");
    OT_CHECK(bias.dtype == ex.dtype, op, "bias", detail::cat("the dtype of expanded_x (", dtype_name(ex.dtype), ")"), dtype_name(bias.dtype));
    OT_CHECK(bias.ndim == 2 && bias.size(1) == p.H, op, "bias", "[E, H]", bias.shape_str());
    p.E = bias.size(0);
  }
  if (expert_idx.defined()) {
    check_dtype(op, "expert_idx", expert_idx, DType::i32);
    OT_CHECK(expert_idx.ndim == 2 && expert_idx.size(0) == p.N && expert_idx.size(1) == p.K, op, "expert_idx",
             detail::cat("[N, K] = [", p.N, ", ", p.K, "]"), expert_idx.shape_str());
    if (bias.defined()) check_ids(op, "expert_idx", expert_idx, 0, p.E - 1);
  }
  p.ex = contig(ex, p.h[0]); p.idx = contig(idx, p.h[1]); p.x1 = contig(x1, p.h[2]); p.x2 = contig(x2, p.h[3]);
  p.bias = contig(bias, p.h[4]); p.scales = contig(scales, p.h[5]); p.expert_idx = contig(expert_idx, p.h[6]);
  return p;
}

static void finalize_fast(const FinalizePlan& p, const TensorView& out) {
  const int32_t* idx = p.idx.ptr<int32_t>();
  const bool col = p.mode <= 1;
  const size_t ob = size_t(p.H) * dtype_size(out.dtype);
  const bool stream = stream_output(size_t(p.N) * ob);
  parallel_for(p.N, [&](int64_t n0, int64_t n1) {
    // Terms of token n: x1, x2, then per k w * row (a dropped row, d < 0, adds nothing) and w * bias.
    std::vector<WeightedRow> buf[2];
    auto gather = [&](int64_t n, std::vector<WeightedRow>& w) {
      w.clear();
      for (const TensorView* s : {&p.x1, &p.x2})
        if (s->defined()) w.push_back({row_ptr(*s, n, p.H), 1.f});
      for (int64_t k = 0; k < p.K; ++k) {
        int32_t d = idx[col ? k * p.N + n : n * p.K + k];
        float wt = p.scales.defined() ? load1(p.scales, n * p.K + k) : 1.f;
        if (d >= 0) w.push_back({row_ptr(p.ex, d, p.H), wt});
        if (p.bias.defined()) w.push_back({row_ptr(p.bias, p.expert_idx.ptr<int32_t>()[n * p.K + k], p.H), wt});
      }
    };
    gather(n0, buf[0]);
    for (int64_t n = n0; n < n1; ++n) {
      std::vector<WeightedRow>& cur = buf[(n - n0) & 1];
      std::vector<WeightedRow>& nxt = buf[(n - n0 + 1) & 1];
      if (n + 1 < n1) gather(n + 1, nxt); else nxt.clear();
      combine_rows(cur.data(), int(cur.size()), p.ex.dtype, p.H, static_cast<char*>(out.data) + size_t(n) * ob, out.dtype, nxt.data(),
                   int(nxt.size()), stream);
    }
    if (stream) stream_fence();
  });
}

static Tensor finalize_entry(const char* op, const TensorView& ex, const TensorView& idx, const TensorView& x1, const TensorView& x2,
                             const TensorView& bias, const TensorView& scales, const TensorView& eidx, int mode, bool ref) {
  FinalizePlan p = plan_finalize(op, ex, idx, x1, x2, bias, scales, eidx, mode);
  trace::OpScope scope(op);
  double es = double(dtype_size(ex.dtype));
  if (scope.active()) scope.kernel(ref ? "ref" : "fp32_rows").args(ex.shape_str());
  scope.bytes(es * double(p.N * p.H) * double(p.K + 1 + (x1.defined()) + (x2.defined())));
  if (ref) return refimpl::finalize_routing(ex, idx, x1, x2, bias, scales, eidx, mode);
  Tensor out = pooled_empty(ex.dtype, {p.N, p.H});
  finalize_fast(p, out);
  return out;
}

// ---- final optimizer mm: sort tokens by expert, one GEMM per used expert gathering the token
// rows of x and scattering results back to token rows (no permuted copies).
static FomPlan plan_fom(const TensorView& x, const TensorView& w, const TensorView& idx) {
  const char* op = "moe_final_optimizer_mm";
  FomPlan p;
  check_ndim(op, "x", x, 2);
  check_float(op, "x", x);
  check_ndim(op, "expert_weight", w, 3);
  OT_CHECK(w.dtype == x.dtype, op, "expert_weight", detail::cat("the dtype of x (", dtype_name(x.dtype), ")"), dtype_name(w.dtype));
  OT_CHECK(w.size(1) == x.size(1), op, "expert_weight", detail::cat("[E, H, I] with H = ", x.size(1)), w.shape_str());
  check_ndim(op, "token_expert_idx", idx, 1);
  check_dim(op, "token_expert_idx", idx, 0, x.size(0));
  p.T = x.size(0); p.H = x.size(1); p.E = w.size(0); p.I = w.size(2);
  check_ids(op, "token_expert_idx", idx, 0, p.E - 1);
  p.x = contig(x, p.hx);
  p.idx = contig(idx, p.hi);
  p.weight = w;
  return p;
}

static Tensor fom_entry(const TensorView& x, const TensorView& w, const TensorView& idx, bool ref) {
  FomPlan p = plan_fom(x, w, idx);
  trace::OpScope scope("moe_final_optimizer_mm");
  if (scope.active()) scope.kernel(ref ? "ref" : gemm::kernel_name(x.dtype, w.dtype, p.T)).args(x.shape_str() + " x " + w.shape_str());
  scope.flops(2.0 * double(p.T * p.H * p.I));
  if (ref) return refimpl::final_optimizer_mm(x, w, idx);
  Tensor y = pooled_empty(x.dtype, {p.T, p.I});
  const int32_t* ids = p.idx.ptr<int32_t>();
  std::vector<int32_t> perm = stable_argsort(ids, p.T);
  std::vector<gemm::PackedB> packs;
  packs.reserve(size_t(p.E));
  std::vector<gemm::Group> groups;
  for (int64_t i = 0; i < p.T;) {
    int64_t j = i;
    while (j < p.T && ids[perm[size_t(j)]] == ids[perm[size_t(i)]]) ++j;
    packs.push_back(pack_slice(w.select(0, ids[perm[size_t(i)]])));
    gemm::Group g;
    g.M = j - i;
    g.a = {p.x.data, p.x.dtype, p.H, perm.data() + i};
    g.b = &packs.back();
    g.c = {y.view().data, y.dtype(), p.I};
    g.ep.scatter_rows = perm.data() + i;
    groups.push_back(g);
    i = j;
  }
  gemm::grouped_gemm(groups.data(), int64_t(groups.size()));
  return y;
}

}  // namespace impl

Tensor grouped_matmul(const TensorView& x, const TensorView& w, const TensorView& gl, GroupListType type, const TensorView& bias, gemm::Act act) {
  return impl::gmm_entry(x, w, gl, type, bias, act, cpu::force_ref());
}

Tensor grouped_matmul(const TensorView& x, const std::vector<const gemm::PackedB*>& ws, const TensorView& gl, GroupListType type,
                      const TensorView& bias, gemm::Act act) {
  const char* op = "grouped_matmul";
  OT_CHECK(!ws.empty() && ws[0] && !ws[0]->empty(), op, "weights", "at least one packed weight", ws.size());
  for (size_t g = 0; g < ws.size(); ++g)
    OT_CHECK(ws[g] && !ws[g]->empty() && ws[g]->K() == ws[0]->K() && ws[g]->N() == ws[0]->N() && ws[g]->dtype() == ws[0]->dtype(), op,
             "weights", "packed weights of one K, N and dtype", "weight ", g, " differs");
  impl::GmmPlan p = impl::plan_gmm(op, x, int64_t(ws.size()), ws[0]->K(), ws[0]->N(), ws[0]->dtype(), gl, type, bias, act);
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel(gemm::kernel_name(x.dtype, ws[0]->dtype(), p.M)).args(x.shape_str());
  scope.flops(2.0 * double(p.M * p.K * p.N));
  Tensor y = pooled_empty(x.dtype, {p.M, p.n_out});
  impl::gmm_run_packed(p, ws, y);
  return y;
}

Tensor moe_finalize_routing_v2(const TensorView& ex, const TensorView& idx, const TensorView& x1, const TensorView& x2, const TensorView& bias,
                               const TensorView& scales, const TensorView& eidx, int mode) {
  return impl::finalize_entry("moe_finalize_routing_v2", ex, idx, x1, x2, bias, scales, eidx, mode, cpu::force_ref());
}
Tensor moe_finalize_routing(const TensorView& ex, const TensorView& skip1, const TensorView& skip2, const TensorView& bias, const TensorView& scales,
                            const TensorView& src_to_dst, const TensorView& eidx) {
  const char* op = "moe_finalize_routing";
  OT_CHECK(skip1.defined(), op, "skip1", "a [N, H] tensor (required in v1)", "none");
  OT_CHECK(bias.defined(), op, "bias", "an [E, H] tensor (required in v1)", "none");
  OT_CHECK(scales.defined(), op, "scales", "an [N, K] tensor (required in v1)", "none");
  OT_CHECK(eidx.defined(), op, "expert_for_source_row", "an [N, K] int32 tensor (required in v1)", "none");
  return impl::finalize_entry(op, ex, src_to_dst, skip1, skip2, bias, scales, eidx, 0, cpu::force_ref());
}
Tensor moe_final_optimizer_mm(const TensorView& x, const TensorView& w, const TensorView& idx) { return impl::fom_entry(x, w, idx, cpu::force_ref()); }

namespace ref {
Tensor grouped_matmul(const TensorView& x, const TensorView& w, const TensorView& gl, GroupListType type, const TensorView& bias, gemm::Act act) {
  return impl::gmm_entry(x, w, gl, type, bias, act, true);
}
Tensor moe_finalize_routing_v2(const TensorView& ex, const TensorView& idx, const TensorView& x1, const TensorView& x2, const TensorView& bias,
                               const TensorView& scales, const TensorView& eidx, int mode) {
  return impl::finalize_entry("moe_finalize_routing_v2", ex, idx, x1, x2, bias, scales, eidx, mode, true);
}
Tensor moe_final_optimizer_mm(const TensorView& x, const TensorView& w, const TensorView& idx) { return impl::fom_entry(x, w, idx, true); }
}  // namespace ref

}  // namespace ot::moe
