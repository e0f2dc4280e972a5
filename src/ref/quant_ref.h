// Plain dequantisation of quantised weights (ot/quant_weights.h). The caller validates.
#pragma once
#include "ot/quant_weights.h"

namespace ot::refimpl {

// (q + offset) * scale in fp32, [G, K, N], one element at a time.
Tensor dequantize_weights(const QuantWeightView& w);
// Per-token int8 activations, dequantised: each row r of x [M, K] (any float dtype) becomes
// q * d in fp32 with d = max|x_r| / 127 and q = x / d rounded half to even, clamped to [-128, 127];
// a zero row stays zero, a row holding NaN or Inf becomes NaN.
Tensor quantize_dequantize_rows_i8(const TensorView& x);

}  // namespace ot::refimpl
