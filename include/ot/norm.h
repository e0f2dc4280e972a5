// RMSNorm, the pre-norm of every transformer block (semantics of torch_npu's npu_rms_norm and
// npu_add_rms_norm, and of HF's Qwen3 / Llama RMSNorm computed in fp32):
//   rms_norm:      y = x * rstd(x) * weight,   rstd(x) = 1 / sqrt(mean(x^2) + eps) over the last dim
//   add_rms_norm:  x_sum = x1 + x2 (rounded to x1's dtype), y = rms_norm(x_sum): the same bits as
//                  the two calls, one pass over the rows instead of three
//   rms_norm_bwd:  with xh = x rstd and g = dy weight: dx = rstd (g - xh mean(g xh)) (+ dx_extra,
//                  a gradient that reaches x by another path, e.g. add_rms_norm's x_sum), and
//                  dweight = the sum over rows of dy xh
// x [..., N] fp32 / bf16 / fp16 with any strides; weight [N] any float dtype; every statistic in
// fp32, the output rounded once. y and dx in x's dtype (dy and dx_extra any float dtype), rstd fp32
// [rows] (rows = the product of the leading dims; N = 0: 1 / sqrt(eps)), dweight fp32 summed over fixed blocks of rows in
// order: the same bits whatever the thread count.
#pragma once
#include "ot/tensor.h"

namespace ot {

struct RmsNormOut {
  Tensor y, rstd;
  Tensor x_sum;  // add_rms_norm only: x1 + x2 in x1's dtype
};
RmsNormOut rms_norm(const TensorView& x, const TensorView& weight, float eps = 1e-6f);
// x2 shaped like x1, same dtype.
RmsNormOut add_rms_norm(const TensorView& x1, const TensorView& x2, const TensorView& weight, float eps = 1e-6f);

struct RmsNormGrads {
  Tensor dx, dweight;
};
// rstd: the forward's (undefined: recomputed from x); dx_extra: shaped like x, or undefined.
RmsNormGrads rms_norm_bwd(const TensorView& dy, const TensorView& x, const TensorView& weight, const TensorView& rstd = {},
                          float eps = 1e-6f, const TensorView& dx_extra = {});

}  // namespace ot
