// l2norm_fwd / l2norm_bwd (spec 5.1): row-wise over the last dim, eps inside the square root.
#include <cmath>
#include <vector>

#include "ot/cpu.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gdn/gdn_internal.h"
#include "src/ref/gdn_ref.h"

namespace ot::gdn {
using namespace detail;

namespace {
// Rows of the last dim of any strided view (leading dims flattened in row-major order).
struct Rows {
  const TensorView* v;
  int64_t n = 0, D = 0;
  explicit Rows(const TensorView& x) : v(&x), D(x.ndim ? x.sizes[x.ndim - 1] : 0) { n = D ? x.numel() / D : 0; }
  int64_t offset(int64_t r) const {
    int64_t off = 0;
    for (int i = v->ndim - 2; i >= 0; --i) {
      off += (r % v->sizes[i]) * v->strides[i];
      r /= v->sizes[i];
    }
    return off;
  }
  char* ptr(int64_t r) const { return static_cast<char*>(v->data) + offset(r) * int64_t(dtype_size(v->dtype)); }
  int64_t sd() const { return v->strides[v->ndim - 1]; }
};
void load_row(const Rows& r, int64_t i, float* dst) {
  if (r.sd() == 1) return convert_to_f32(r.ptr(i), r.v->dtype, dst, r.D);
  for (int64_t d = 0; d < r.D; ++d) dst[d] = float(get_as_double(TensorView(r.ptr(i), r.v->dtype, {r.D}, {r.sd()}), d));
}
void store_row(const Rows& r, int64_t i, const float* src) {
  if (r.sd() == 1) return convert_from_f32(src, r.ptr(i), r.v->dtype, r.D);
  for (int64_t d = 0; d < r.D; ++d) set_from_double(TensorView(r.ptr(i), r.v->dtype, {r.D}, {r.sd()}), d, src[d]);
}
std::vector<int64_t> lead_shape(const TensorView& x) { return {x.sizes, x.sizes + (x.ndim ? x.ndim - 1 : 0)}; }
}  // namespace

L2Norm l2norm_fwd(const TensorView& x, float eps) {
  const char* op = "l2norm_fwd";
  trace::OpScope scope(op);
  OT_CHECK(x.defined() && x.ndim >= 1, op, "x", "a tensor with a last dim", x.shape_str());
  expect_float(x.dtype, op, "x");
  L2Norm r{Tensor::empty(x.dtype, x.shape()), Tensor::empty(DType::f32, lead_shape(x))};
  if (scope.active()) scope.args(x.shape_str()).kernel(cpu::force_ref() ? "ref" : "fast");
  if (cpu::force_ref()) {
    refimpl::l2norm(x, r.y, r.rstd, eps);
    return r;
  }
  Rows in(x), out(r.y.view());
  float* rstd = r.rstd.ptr<float>();
  parallel_for(in.n, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(in.D));
    for (int64_t i = r0; i < r1; ++i) {
      load_row(in, i, row.data());
      float ss = 0.f;
      for (float v : row) ss += v * v;
      float inv = 1.f / std::sqrt(ss + eps);
      for (float& v : row) v *= inv;
      rstd[i] = inv;
      store_row(out, i, row.data());
    }
  });
  return r;
}

Tensor l2norm_bwd(const TensorView& y, const TensorView& rstd, const TensorView& dy) {
  const char* op = "l2norm_bwd";
  trace::OpScope scope(op);
  OT_CHECK(y.defined() && y.ndim >= 1, op, "y", "a tensor with a last dim", y.shape_str());
  OT_CHECK(dy.shape() == y.shape(), op, "dy", ::ot::detail::cat("the shape of y ", y.shape_str()), dy.shape_str());
  OT_CHECK(rstd.dtype == DType::f32 && rstd.numel() * (y.ndim ? y.sizes[y.ndim - 1] : 1) == y.numel(), op, "rstd",
           "fp32 with one value per row of y", rstd.shape_str());
  expect_float(y.dtype, op, "y");
  expect_float(dy.dtype, op, "dy");
  Tensor dx = Tensor::empty(dy.dtype, dy.shape());
  Rows ry(y), rdy(dy), rdx(dx.view());
  Tensor rs = Tensor::copy_of(rstd);
  const float* r = rs.ptr<float>();
  parallel_for(ry.n, [&](int64_t r0, int64_t r1) {
    std::vector<float> a(static_cast<size_t>(ry.D)), b(static_cast<size_t>(ry.D));
    for (int64_t i = r0; i < r1; ++i) {
      load_row(ry, i, a.data());
      load_row(rdy, i, b.data());
      double dot = 0;
      for (int64_t d = 0; d < ry.D; ++d) dot += double(a[size_t(d)]) * b[size_t(d)];
      for (int64_t d = 0; d < ry.D; ++d) b[size_t(d)] = r[i] * (b[size_t(d)] - float(dot) * a[size_t(d)]);
      store_row(rdx, i, b.data());
    }
  });
  return dx;
}

}  // namespace ot::gdn
