// rotary_mul / rotary_mul_backward (ot/rotary.h): rows of D over (leading index, t), threads over
// blocks of rows; each output element from its two inputs in fp32 (the loop vectorises: halves of
// the row against the cos / sin rows).
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/rotary.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/core/row_view.h"

namespace ot {
namespace {

Tensor rotate(const char* op, const TensorView& x_in, const TensorView& cos, const TensorView& sin, float sign) {
  trace::OpScope scope(op);
  OT_CHECK(x_in.defined() && x_in.ndim >= 2, op, "x", "[..., T, D]", x_in.defined() ? x_in.shape_str() : "undefined");
  OT_CHECK(x_in.dtype == DType::f32 || x_in.dtype == DType::bf16 || x_in.dtype == DType::f16, op, "x", "fp32, bf16 or fp16",
           dtype_name(x_in.dtype));
  const int64_t D = x_in.sizes[x_in.ndim - 1], T = x_in.sizes[x_in.ndim - 2];
  OT_CHECK(D % 2 == 0, op, "x", "an even last dim D", x_in.shape_str());
  for (auto [v, name] : {std::pair{&cos, "cos"}, {&sin, "sin"}}) {
    OT_CHECK(v->defined() && v->ndim == 2 && v->sizes[0] == T && v->sizes[1] == D, op, name, ::ot::detail::cat("[T, D] = [", T, ", ", D, "]"),
             v->defined() ? v->shape_str() : "undefined");
    OT_CHECK(v->dtype == DType::f32 || v->dtype == x_in.dtype, op, name, ::ot::detail::cat("fp32 or x's dtype ", dtype_name(x_in.dtype)),
             dtype_name(v->dtype));
  }
  Tensor y = pooled_empty(x_in.dtype, x_in.shape());
  const int64_t rows = detail::leading_rows(x_in);  // (leading index, t) rows of D
  scope.bytes(2.0 * double(x_in.nbytes())).args(x_in.shape_str());
  if (rows == 0 || D == 0) return y;
  Tensor kx;
  const TensorView x = detail::as_rows(x_in, rows, D, kx);
  if (cpu::force_ref()) {
    ref::rotary_mul(TensorView(Tensor::copy_of(x).view().data, x.dtype, {rows / T, T, D}), cos, sin, sign,
                    TensorView(y.view().data, y.dtype(), {rows / T, T, D}));
    return y;
  }
  // cos and sin in fp32, sin with the rotation's signs folded in: y = x c + x_rot s'.
  std::vector<float> c(size_t(T * D)), s(size_t(T * D));
  const Tensor cc = Tensor::copy_of(cos), sc = Tensor::copy_of(sin);  // contiguous
  convert_to_f32(cc.view().data, cc.dtype(), c.data(), T * D);
  convert_to_f32(sc.view().data, sc.dtype(), s.data(), T * D);
  const int64_t h = D / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) s[size_t(t * D + i)] *= i < h ? -sign : sign;
  parallel_for_sized(rows, 2.0 * double(x.nbytes()), [&](int64_t r0, int64_t r1) {
    std::vector<float> a(static_cast<size_t>(D)), o(static_cast<size_t>(D));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      convert_to_f32(elem_at(x.data, x.dtype, r * x.strides[0]), x.dtype, a.data(), D);
      const float *cr = c.data() + t * D, *sr = s.data() + t * D;
      for (int64_t i = 0; i < h; ++i) {
        o[size_t(i)] = a[size_t(i)] * cr[i] + a[size_t(i + h)] * sr[i];
        o[size_t(i + h)] = a[size_t(i + h)] * cr[i + h] + a[size_t(i)] * sr[i + h];
      }
      convert_from_f32(o.data(), elem_at(y.view().data, y.dtype(), r * D), y.dtype(), D);
    }
  });
  return y;
}

}  // namespace

Tensor rotary_mul(const TensorView& x, const TensorView& cos, const TensorView& sin) { return rotate("rotary_mul", x, cos, sin, 1.f); }
Tensor rotary_mul_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin) {
  return rotate("rotary_mul_backward", dy, cos, sin, -1.f);
}

}  // namespace ot
