#include "src/moe/bwd_common.h"

#include <algorithm>

namespace ot::moe::bwd {

static int64_t int_at(const TensorView& v, int64_t i, int64_t j = 0) {
  int64_t off = i * v.strides[0] + (v.ndim > 1 ? j * v.strides[1] : 0);
  return v.dtype == DType::i64 ? v.ptr<int64_t>()[off] : v.ptr<int32_t>()[off];
}

std::vector<Span> parse_group_list(const char* op, const TensorView& gl, int type, int64_t groups, int64_t rows) {
  OT_CHECK(gl.dtype == DType::i32 || gl.dtype == DType::i64, op, "group_list", "int32 or int64", dtype_name(gl.dtype));
  OT_CHECK(type >= 0 && type <= 2, op, "group_list_type", "0 (cumsum), 1 (count) or 2 (key-value)", type);
  std::vector<Span> spans;
  int64_t total = 0;
  if (type == 2) {
    OT_CHECK(gl.ndim == 2 && gl.sizes[1] == 2, op, "group_list", "[G', 2] (group, count) rows", gl.shape_str());
    for (int64_t i = 0; i < gl.sizes[0]; ++i) {
      int64_t g = int_at(gl, i, 0), c = int_at(gl, i, 1);
      OT_CHECK(c >= 0, op, "group_list", "non-negative counts", c, " at row ", i);
      if (c == 0) continue;  // zero-filled tail
      OT_CHECK(g >= 0 && g < groups, op, "group_list", detail::cat("group ids in [0, ", groups, ")"), g, " at row ", i);
      spans.push_back({g, total, c});
      total += c;
    }
  } else {
    OT_CHECK(gl.ndim == 1 && gl.sizes[0] == groups, op, "group_list", detail::cat("[", groups, "] (one entry per group)"),
             gl.shape_str());
    int64_t prev = 0;
    for (int64_t g = 0; g < groups; ++g) {
      int64_t v = int_at(gl, g);
      int64_t c = type == 0 ? v - prev : v;
      OT_CHECK(c >= 0, op, "group_list", type == 0 ? "a non-decreasing cumsum" : "non-negative counts", v, " at ", g);
      if (c > 0) spans.push_back({g, total, c});
      total += c;
      prev = v;
    }
  }
  OT_CHECK(total == rows, op, "group_list", detail::cat("a total of ", rows, " rows"), total);
  return spans;
}

GmmBwdPlan plan_grouped_matmul_backward(const char* op, const TensorView& dy, const TensorView& x, const TensorView& w,
                                        const TensorView& group_list, const GroupedMatmulBackwardOptions& opt) {
  GmmBwdPlan p;
  OT_CHECK(x.ndim == 2, op, "x", "[M, K]", x.shape_str());
  OT_CHECK(w.ndim == 3, op, "weight", "[G, K, N]", w.shape_str());
  OT_CHECK(dy.ndim == 2, op, "dy", "[M, N]", dy.shape_str());
  check_float_args(op, {{"x", x}, {"weight", w, false}, {"dy", dy}});
  p.M = x.sizes[0];
  p.K = x.sizes[1];
  p.G = w.sizes[0];
  p.N = w.sizes[2];
  OT_CHECK(w.sizes[1] == p.K, op, "weight", detail::cat("K = ", p.K, " (x's columns) in dim 1"), w.shape_str());
  OT_CHECK(opt.act != gemm::Act::swiglu || p.N % 2 == 0, op, "weight", "an even N for swiglu ([gate | up])", w.shape_str());
  p.n_out = opt.act == gemm::Act::swiglu ? p.N / 2 : p.N;
  check_shape(op, "dy", dy, {p.M, p.n_out});
  if (opt.bias.defined()) {
    check_float(op, "bias", opt.bias);
    check_shape(op, "bias", opt.bias, {p.G, p.N});
  }
  if (opt.pre_act.defined()) {
    check_float_args(op, {{"pre_act", opt.pre_act}});
    check_shape(op, "pre_act", opt.pre_act, {p.M, p.N});
  }
  if (opt.dweight_out.defined()) {
    check_float(op, "dweight_out", opt.dweight_out);
    check_shape(op, "dweight_out", opt.dweight_out, {p.G, p.K, p.N});
  }
  if (opt.dbias_out.defined()) {
    check_float(op, "dbias_out", opt.dbias_out);
    check_shape(op, "dbias_out", opt.dbias_out, {p.G, p.N});
  }
  p.spans = parse_group_list(op, group_list, opt.group_list_type, p.G, p.M);
  return p;
}

void check_act_backward(const char* op, gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz) {
  OT_CHECK(z.ndim == 2, op, "z", "[M, N]", z.shape_str());
  check_float_args(op, {{"z", z}, {"dy", dy}, {"dz", dz}});
  int64_t M = z.sizes[0], N = z.sizes[1];
  if (act == gemm::Act::swiglu) OT_CHECK(N % 2 == 0, op, "z", "an even width ([gate | up])", z.shape_str());
  check_shape(op, "dy", dy, {M, act == gemm::Act::swiglu ? N / 2 : N});
  check_shape(op, "dz", dz, {M, N});
}

}  // namespace ot::moe::bwd

namespace ot::moe::bwd {

static void check_idx(const char* op, const char* arg, const TensorView& v, int64_t numel) {
  OT_CHECK(v.dtype == DType::i32, op, arg, "int32", dtype_name(v.dtype));
  OT_CHECK(v.is_contiguous(), op, arg, "a contiguous tensor", v.shape_str());
  OT_CHECK(v.numel() == numel, op, arg, detail::cat(numel, " elements"), v.shape_str());
}
static void check_rows(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(v.ndim == 2, op, arg, "a 2-D [rows, H] tensor", v.shape_str());
  check_float(op, arg, v);
  OT_CHECK(v.is_contiguous(), op, arg, "a contiguous tensor", v.shape_str());
}

void check_distinct(const char* op, const char* arg, const int32_t* idx, int64_t n, int64_t limit) {
  std::vector<char> seen(size_t(std::max<int64_t>(limit, 0)), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = idx[i];
    if (d < 0 || d >= limit) continue;
    OT_CHECK(!seen[size_t(d)], op, arg, "distinct destination rows", "row ", d, " twice");
    seen[size_t(d)] = 1;
  }
}

RoutingBwdPlan plan_permute_backward(const char* op, const TensorView& dp, const TensorView& si, int64_t topk) {
  RoutingBwdPlan p;
  check_rows(op, "d_permuted", dp);
  OT_CHECK(topk >= 1, op, "topk", ">= 1", topk);
  OT_CHECK(si.numel() % topk == 0, op, "sorted_indices", detail::cat("T * ", topk, " elements"), si.shape_str());
  check_idx(op, "sorted_indices", si, si.numel());
  p.K = topk;
  p.T = si.numel() / topk;
  p.P = dp.sizes[0];
  p.H = dp.sizes[1];
  return p;
}

RoutingBwdPlan plan_unpermute_backward(const char* op, const TensorView& dout, const TensorView& permuted, const TensorView& si,
                                       const TensorView& probs) {
  RoutingBwdPlan p;
  check_rows(op, "d_out", dout);
  check_rows(op, "permuted_tokens", permuted);
  p.T = dout.sizes[0];
  p.H = dout.sizes[1];
  p.P = permuted.sizes[0];
  OT_CHECK(permuted.sizes[1] == p.H, op, "permuted_tokens", detail::cat("H = ", p.H, " columns (d_out's)"), permuted.shape_str());
  if (probs.defined()) {
    OT_CHECK(probs.ndim == 2 && probs.sizes[0] == p.T, op, "probs", detail::cat("[", p.T, ", K]"), probs.shape_str());
    check_float(op, "probs", probs);
    p.K = probs.sizes[1];
  }
  check_idx(op, "sorted_indices", si, p.T * p.K);
  check_distinct(op, "sorted_indices", si.ptr<int32_t>(), p.T * p.K, p.P);
  return p;
}

RoutingBwdPlan plan_init_routing_backward(const char* op, const TensorView& dex, const TensorView& idx, int64_t N, int64_t K, int type) {
  RoutingBwdPlan p;
  OT_CHECK(dex.ndim == 2 || dex.ndim == 3, op, "d_expanded_x", "[rows, H] or [E, C, H]", dex.shape_str());
  check_float(op, "d_expanded_x", dex);
  OT_CHECK(dex.is_contiguous(), op, "d_expanded_x", "a contiguous tensor", dex.shape_str());
  OT_CHECK(N >= 0, op, "num_tokens", ">= 0", N);
  OT_CHECK(K >= 1, op, "topk", ">= 1", K);
  OT_CHECK(type == 0 || type == 1, op, "row_idx_type", "0 (gather) or 1 (scatter)", type);
  OT_CHECK(type == 0 || dex.ndim == 2, op, "row_idx_type", "0 in drop/pad mode ([E, C, H] d_expanded_x)", type);
  check_idx(op, "expanded_row_idx", idx, N * K);
  p.T = N;
  p.K = K;
  p.H = dex.sizes[dex.ndim - 1];
  p.P = dex.numel() / std::max<int64_t>(p.H, 1);
  if (p.H == 0) p.P = dex.ndim == 2 ? dex.sizes[0] : dex.sizes[0] * dex.sizes[1];
  p.mode = type;
  if (type == 0) {
    check_distinct(op, "expanded_row_idx", idx.ptr<int32_t>(), N * K, p.P);
  } else {
    OT_CHECK(p.P <= N * K, op, "d_expanded_x", detail::cat("at most N*K = ", N * K, " rows"), dex.shape_str());
    const int32_t* s = idx.ptr<int32_t>();
    for (int64_t i = 0; i < p.P; ++i)
      OT_CHECK(s[i] >= 0 && s[i] < N * K, op, "expanded_row_idx", detail::cat("sources in [0, ", N * K, ") for the first ", p.P, " rows"), s[i],
               " at ", i);
    check_distinct(op, "expanded_row_idx", s, p.P, N * K);
  }
  return p;
}

RoutingBwdPlan plan_finalize_backward(const char* op, const TensorView& dout, const TensorView& ex, const TensorView& idx, const TensorView& scales,
                                      const TensorView& bias, const TensorView& expert_idx, int mode) {
  RoutingBwdPlan p;
  check_rows(op, "d_out", dout);
  OT_CHECK(mode >= 0 && mode <= 3, op, "drop_pad_mode", "0, 1, 2 or 3", mode);
  bool pad = mode == 1 || mode == 3;
  OT_CHECK(ex.ndim == (pad ? 3 : 2), op, "expanded_x", pad ? "[E, C, H] (drop/pad modes)" : "[N*K, H]", ex.shape_str());
  check_float(op, "expanded_x", ex);
  OT_CHECK(ex.is_contiguous(), op, "expanded_x", "a contiguous tensor", ex.shape_str());
  p.T = dout.sizes[0];
  p.H = dout.sizes[1];
  p.mode = mode;
  OT_CHECK(ex.sizes[ex.ndim - 1] == p.H, op, "expanded_x", detail::cat("H = ", p.H, " in the last dim"), ex.shape_str());
  p.P = pad ? ex.sizes[0] * ex.sizes[1] : ex.sizes[0];
  if (scales.defined()) {
    check_float(op, "scales", scales);
    OT_CHECK(scales.ndim == 2 && scales.sizes[0] == p.T, op, "scales", detail::cat("[", p.T, ", K]"), scales.shape_str());
    p.K = scales.sizes[1];
  }
  check_idx(op, "expanded_row_idx", idx, p.T * p.K);
  const int32_t* d = idx.ptr<int32_t>();
  for (int64_t i = 0; i < p.T * p.K; ++i)
    OT_CHECK((d[i] >= 0 || (pad && d[i] == -1)) && d[i] < p.P, op, "expanded_row_idx",
             detail::cat("rows in [", pad ? -1 : 0, ", ", p.P, ")"), d[i], " at ", i);
  check_distinct(op, "expanded_row_idx", d, p.T * p.K, p.P);
  if (bias.defined()) {
    OT_CHECK(expert_idx.defined(), op, "expert_idx", "given with bias", "none");
    check_float(op, "bias", bias);
    OT_CHECK(bias.ndim == 2 && bias.sizes[1] == p.H && bias.is_contiguous(), op, "bias", detail::cat("a contiguous [E, ", p.H, "]"),
             bias.shape_str());
    p.E = bias.sizes[0];
    check_idx(op, "expert_idx", expert_idx, p.T * p.K);
    const int32_t* e = expert_idx.ptr<int32_t>();
    for (int64_t i = 0; i < p.T * p.K; ++i)
      OT_CHECK(e[i] >= 0 && e[i] < p.E, op, "expert_idx", detail::cat("ids in [0, ", p.E, ")"), e[i], " at ", i);
  }
  return p;
}

RouterBwdPlan plan_router_backward(const char* op, const TensorView& dy, const TensorView& x, const char* x_name, const TensorView& ids,
                                   const TensorView& allowed) {
  RouterBwdPlan p;
  OT_CHECK(x.ndim == 2, op, x_name, "[T, E]", x.shape_str());
  check_float(op, x_name, x);
  OT_CHECK(x.is_contiguous(), op, x_name, "a contiguous tensor", x.shape_str());
  p.T = x.sizes[0];
  p.E = x.sizes[1];
  OT_CHECK(dy.ndim == 2 && dy.sizes[0] == p.T && dy.is_contiguous(), op, "dy", detail::cat("a contiguous [", p.T, ", K]"), dy.shape_str());
  check_float(op, "dy", dy);
  p.K = dy.sizes[1];
  OT_CHECK(p.K >= 1 && p.K <= p.E, op, "dy", detail::cat("K in [1, E = ", p.E, "]"), dy.shape_str());
  check_idx(op, "expert_idx", ids, p.T * p.K);
  const int32_t* e = ids.ptr<int32_t>();
  for (int64_t t = 0; t < p.T; ++t) {
    bool fin = e[t * p.K] == p.E;
    for (int64_t k = 0; k < p.K; ++k) {
      int32_t v = e[t * p.K + k];
      OT_CHECK(fin ? v == p.E : (v >= 0 && v < p.E), op, "expert_idx", detail::cat("ids in [0, ", p.E, ") (or a whole row of E = finished)"), v,
               " at ", t * p.K + k);
    }
  }
  if (allowed.defined()) {
    OT_CHECK(allowed.dtype == DType::u8 && allowed.is_contiguous() && allowed.numel() == p.T * p.E, op, "allowed",
             detail::cat("a contiguous u8 [", p.T, ", ", p.E, "]"), allowed.shape_str());
  }
  return p;
}

}  // namespace ot::moe::bwd
