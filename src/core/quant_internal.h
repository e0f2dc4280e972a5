// Vector forms of quantize_row_i8_dynamic (ot/quant.h); each gives the portable form's bits.
#pragma once
#include <cstdint>

namespace ot::detail {

float quantize_row_i8_avx512(const float* x, int64_t n, int8_t* q);
float quantize_row_i8_scalar(const float* x, int64_t n, int8_t* q);

}  // namespace ot::detail
