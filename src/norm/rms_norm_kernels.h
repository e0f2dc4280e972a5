// The row kernels of rms_norm / add_rms_norm / rms_norm_bwd (rms_norm.cpp drives them over blocks of
// rows; ot/norm.h has the formulas). Row r of a tensor starts at element r * st; N values a row,
// contiguous; the weight prepared in fp32.
#pragma once
#include <cstdint>

#include "src/core/elem_at.h"

namespace ot::norm_detail {

using In = StridedRows;
using Out = StridedOutRows;
struct Fwd {
  In x, x2;       // x2.p null: no residual (rms_norm)
  Out x_sum, y;   // x_sum: add_rms_norm only (x's dtype)
  const float* w = nullptr;
  float* rstd = nullptr;  // [rows]
  int64_t N = 0;
  float eps = 0.f;
};
struct Bwd {
  In dy, x, extra;  // extra.p null: none
  Out dx;
  const float* w = nullptr;
  const float* rstd = nullptr;  // null: recomputed
  int64_t N = 0;
  float eps = 0.f;
};

// y (and x_sum) of rows r0 .. r1-1.
void fwd_rows_generic(const Fwd& f, int64_t r0, int64_t r1);
void fwd_rows_avx2(const Fwd& f, int64_t r0, int64_t r1);
// x, x2, dy, extra in one dtype: rms_norm_kernels__avx512.cpp.
void fwd_rows_avx512(const Fwd& f, int64_t r0, int64_t r1);
// dx of rows r0 .. r1-1; dw[N] += their weight gradient, in row order.
void bwd_rows_generic(const Bwd& b, int64_t r0, int64_t r1, float* dw);
void bwd_rows_avx2(const Bwd& b, int64_t r0, int64_t r1, float* dw);
void bwd_rows_avx512(const Bwd& b, int64_t r0, int64_t r1, float* dw);

}  // namespace ot::norm_detail
