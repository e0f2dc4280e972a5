// AVX-512 form of quantize_row_i8_dynamic (ot/quant.h): the same max, the same IEEE division and
// rounding trick per value as the portable loop, so the same codes and scale bit for bit.
#include <immintrin.h>

#include <limits>

#include "src/core/quant_internal.h"

namespace ot::detail {

float quantize_row_i8_avx512(const float* x, int64_t n, int8_t* q) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)), fmax = _mm512_set1_ps(std::numeric_limits<float>::max());
  __m512 amax = _mm512_setzero_ps();
  __mmask16 finite = 0xFFFF;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 a = _mm512_and_ps(_mm512_maskz_loadu_ps(m, x + i), sign);
    finite &= _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ);  // false for NaN and Inf (masked-off lanes read 0)
    amax = _mm512_max_ps(amax, a);
  }
  if (finite != 0xFFFF) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float d = _mm512_reduce_max_ps(amax) / 127.f;
  if (!(d > 0)) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return d;
  }
  const __m512 dv = _mm512_set1_ps(d), round = _mm512_set1_ps(12582912.f), lo = _mm512_set1_ps(-128.f), hi = _mm512_set1_ps(127.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    __m512 v = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), dv), round), round);
    v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
    _mm512_mask_cvtepi32_storeu_epi8(q + i, m, _mm512_cvttps_epi32(v));
  }
  return d;
}

}  // namespace ot::detail
