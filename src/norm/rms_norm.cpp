// rms_norm, add_rms_norm and rms_norm_bwd (ot/norm.h): argument checks, the [rows, N] form of the
// inputs, the kernel list's rows over fixed blocks of rows. The weight gradient is summed per block
// and the blocks added in order, so it does not depend on the thread count.
#include <cmath>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/norm.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/kernel_list.h"
#include "src/core/row_view.h"
#include "src/norm/rms_norm_kernels.h"
#include "src/ref/rms_norm_ref.h"

namespace ot {
using namespace norm_detail;
using detail::as_rows;

namespace {

constexpr int64_t kRowBlock = 64;  // rows per job (and per partial weight gradient)

struct Plan {
  int64_t rows = 0, N = 0;
  DType x = DType::f32, dy = DType::f32, extra = DType::f32;
  bool has_extra = false;
};

void expect_float(const TensorView& v, const char* op, const char* arg) {
  OT_CHECK(v.dtype == DType::f32 || v.dtype == DType::bf16 || v.dtype == DType::f16, op, arg, "fp32, bf16 or fp16", dtype_name(v.dtype));
}
void expect_like(const TensorView& v, const TensorView& x, const char* op, const char* arg) {
  OT_CHECK(v.defined() && v.shape() == x.shape(), op, arg, detail::cat("the shape of x ", x.shape_str()), v.defined() ? v.shape_str() : "undefined");
  expect_float(v, op, arg);
}

Plan check(const TensorView& x, const TensorView& weight, float eps, const char* op, const char* xname) {
  OT_CHECK(x.defined() && x.ndim >= 1, op, xname, "[..., N]", x.defined() ? x.shape_str() : "undefined");
  expect_float(x, op, xname);
  Plan p;
  p.N = x.sizes[x.ndim - 1];
  p.rows = detail::leading_rows(x);
  p.x = p.dy = p.extra = x.dtype;
  OT_CHECK(weight.defined() && weight.ndim == 1 && weight.sizes[0] == p.N, op, "weight", detail::cat("[N] with N = ", p.N),
           weight.defined() ? weight.shape_str() : "undefined");
  expect_float(weight, op, "weight");
  OT_CHECK(std::isfinite(eps) && eps >= 0.f, op, "eps", "a finite eps >= 0", eps);
  return p;
}


using FwdRows = void (*)(const Fwd&, int64_t, int64_t);
const cpu::KernelEntry<FwdRows, cpu::AnyPlan> kFwdKernels[] = {
    {cpu::Isa::avx512, nullptr, fwd_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, fwd_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, fwd_rows_generic, "generic"},
};
// The AVX-512 rows read dy (and extra) in the dtype of x.
using BwdRows = void (*)(const Bwd&, int64_t, int64_t, float*);
bool one_dtype(const Plan& p) { return p.dy == p.x && (!p.has_extra || p.extra == p.x); }
const cpu::KernelEntry<BwdRows, Plan> kBwdKernels[] = {
    {cpu::Isa::avx512, one_dtype, bwd_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, bwd_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, bwd_rows_generic, "generic"},
};

RmsNormOut forward(const char* op, const TensorView& x_in, const TensorView& x2_in, const TensorView& weight, float eps) {
  trace::OpScope scope(op);
  const bool add = x2_in.defined();
  const Plan p = check(x_in, weight, eps, op, add ? "x1" : "x");
  if (add) {
    OT_CHECK(x2_in.shape() == x_in.shape(), op, "x2", detail::cat("the shape of x1 ", x_in.shape_str()), x2_in.shape_str());
    OT_CHECK(x2_in.dtype == x_in.dtype, op, "x2", detail::cat("x1's dtype ", dtype_name(x_in.dtype)), dtype_name(x2_in.dtype));
  }
  RmsNormOut r;
  r.y = pooled_empty(x_in.dtype, x_in.shape());
  r.rstd = Tensor::empty(DType::f32, {p.rows});
  if (add) r.x_sum = pooled_empty(x_in.dtype, x_in.shape());
  const bool use_ref = cpu::force_ref();
  const auto& kernel = cpu::select_kernel(op, kFwdKernels);
  const double bytes = double(x_in.nbytes()) * (add ? 4 : 2);
  scope.flops(4.0 * double(p.rows * p.N)).bytes(bytes);
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernel.name);
  if (p.N == 0)  // the mean of no squares taken as 0
    for (int64_t i = 0; i < p.rows; ++i) r.rstd.ptr<float>()[i] = 1.f / std::sqrt(eps);
  if (p.rows == 0 || p.N == 0) return r;
  Tensor kx, k2;
  const TensorView x = as_rows(x_in, p.rows, p.N, kx), y = detail::rows_view(r.y, p.rows, p.N);
  const TensorView x2 = add ? as_rows(x2_in, p.rows, p.N, k2) : TensorView(), xs = add ? detail::rows_view(r.x_sum, p.rows, p.N) : TensorView();
  if (use_ref) {
    ref::rms_norm(x, x2, weight, eps, xs, y, r.rstd);
    return r;
  }
  const std::vector<float> w = detail::vector_f32(weight);
  Fwd f;
  f.x = detail::rows_in(x);
  if (add) {
    f.x2 = detail::rows_in(x2);
    f.x_sum = detail::rows_out(xs);
  }
  f.y = detail::rows_out(y);
  f.w = w.data();
  f.rstd = r.rstd.ptr<float>();
  f.N = p.N;
  f.eps = eps;
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  parallel_for_sized(blocks, bytes, [&](int64_t b0, int64_t b1) {  // (a decode step's few rows: one thread)
    kernel.fn(f, b0 * kRowBlock, std::min(p.rows, b1 * kRowBlock));
  });
  return r;
}

}  // namespace

RmsNormOut rms_norm(const TensorView& x, const TensorView& weight, float eps) { return forward("rms_norm", x, {}, weight, eps); }

RmsNormOut add_rms_norm(const TensorView& x1, const TensorView& x2, const TensorView& weight, float eps) {
  OT_CHECK(x2.defined(), "add_rms_norm", "x2", "a tensor shaped like x1", "undefined");
  return forward("add_rms_norm", x1, x2, weight, eps);
}

RmsNormGrads rms_norm_bwd(const TensorView& dy_in, const TensorView& x_in, const TensorView& weight, const TensorView& rstd, float eps,
                          const TensorView& extra_in) {
  const char* op = "rms_norm_bwd";
  trace::OpScope scope(op);
  Plan p = check(x_in, weight, eps, op, "x");
  expect_like(dy_in, x_in, op, "dy");
  p.dy = dy_in.dtype;
  if (extra_in.defined()) {
    expect_like(extra_in, x_in, op, "dx_extra");
    p.has_extra = true;
    p.extra = extra_in.dtype;
  }
  if (rstd.defined())
    OT_CHECK(rstd.dtype == DType::f32 && rstd.numel() == p.rows && rstd.is_contiguous(), op, "rstd",
             detail::cat("the forward's contiguous fp32 [", p.rows, "]"), rstd.shape_str());
  RmsNormGrads g;
  g.dx = pooled_empty(x_in.dtype, x_in.shape());
  g.dweight = Tensor::zeros(DType::f32, {p.N});
  const bool use_ref = cpu::force_ref();
  const auto& kernel = cpu::select_kernel(op, kBwdKernels, p);
  const double bytes = double(x_in.nbytes() + dy_in.nbytes() + x_in.nbytes()) + (p.has_extra ? double(extra_in.nbytes()) : 0.0);
  scope.flops(8.0 * double(p.rows * p.N)).bytes(bytes);
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernel.name);
  if (p.rows == 0 || p.N == 0) return g;
  Tensor kx, kd, ke;
  const TensorView x = as_rows(x_in, p.rows, p.N, kx), dy = as_rows(dy_in, p.rows, p.N, kd), dx = detail::rows_view(g.dx, p.rows, p.N);
  const TensorView extra = p.has_extra ? as_rows(extra_in, p.rows, p.N, ke) : TensorView();
  if (use_ref) {
    ref::rms_norm_bwd(dy, x, weight, eps, extra, dx, g.dweight);
    return g;
  }
  const std::vector<float> w = detail::vector_f32(weight);
  Bwd b;
  b.dy = detail::rows_in(dy);
  b.x = detail::rows_in(x);
  if (p.has_extra) b.extra = detail::rows_in(extra);
  b.dx = detail::rows_out(dx);
  b.w = w.data();
  b.rstd = rstd.defined() ? rstd.ptr<float>() : nullptr;
  b.N = p.N;
  b.eps = eps;
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial(size_t(blocks * p.N), 0.f);
  parallel_for_sized(blocks, bytes, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) kernel.fn(b, k * kRowBlock, std::min(p.rows, (k + 1) * kRowBlock), partial.data() + k * p.N);
  });
  float* dw = g.dweight.ptr<float>();
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t i = 0; i < p.N; ++i) dw[i] += partial[size_t(k * p.N + i)];
  return g;
}

}  // namespace ot
