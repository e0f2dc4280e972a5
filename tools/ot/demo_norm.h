// Row kernels of the demo's plain RMSNorm: out = x * rstd(x) * w over rows [t0, t1) of [T, H] views
// (last dim contiguous). The sum of squares runs over fp32 lanes added in a fixed order, so a
// row's result does not depend on the thread that computes it.
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot::demo::norm {

void rms_rows_generic(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1);
void rms_rows_avx2(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1);
void rms_rows_avx512(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1);

}  // namespace ot::demo::norm
