#include "src/moe/bwd_common.h"

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
  check_float(op, "x", x);
  check_float(op, "weight", w);
  check_float(op, "dy", dy);
  check_row_major(op, "x", x);
  check_row_major(op, "dy", dy);
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
    check_float(op, "pre_act", opt.pre_act);
    check_row_major(op, "pre_act", opt.pre_act);
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
  check_float(op, "z", z);
  check_float(op, "dy", dy);
  check_float(op, "dz", dz);
  check_row_major(op, "z", z);
  check_row_major(op, "dy", dy);
  check_row_major(op, "dz", dz);
  int64_t M = z.sizes[0], N = z.sizes[1];
  if (act == gemm::Act::swiglu) OT_CHECK(N % 2 == 0, op, "z", "an even width ([gate | up])", z.shape_str());
  check_shape(op, "dy", dy, {M, act == gemm::Act::swiglu ? N / 2 : N});
  check_shape(op, "dz", dz, {M, N});
}

}  // namespace ot::moe::bwd
