// Plain dequantisation of quantised weights (ot/quant_weights.h). The caller validates.
#pragma once
#include "ot/quant_weights.h"

namespace ot::refimpl {

// (q + offset) * scale in fp32, [G, K, N], one element at a time.
Tensor dequantize_weights(const QuantWeightView& w);

}  // namespace ot::refimpl
