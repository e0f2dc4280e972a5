// Dynamic int8 quantisation of one fp32 row: the one implementation behind init routing's
// quant_mode 1 and the EP dispatch's quant_int8 (spec 4.3 / 9.2).
#pragma once
#include <cstdint>

namespace ot {

// d = max|x| / 127, q = round_half_even(x / d) saturated to [-128, 127]; returns d. A zero row
// gives d = 0 and q = 0. A row holding a NaN or an Inf gives d = NaN and q = 0: it dequantises to
// NaN, so non-finite input never turns into finite codes (rather than an undefined int8, a clamp to
// -128, or a row whose other values an Inf zeroed).
float quantize_row_i8_dynamic(const float* x, int64_t n, int8_t* q);

}  // namespace ot
