// AVX-512 scan for Inf/NaN (exponent bits all ones) over a contiguous block: the input check of
// the GDN operators reads every q, k, v element once, so it has to run at memory speed.
#include <immintrin.h>

#include <cstdint>

namespace ot::gdn::detail::avx512 {

bool any_exp_all_ones16(const uint16_t* p, int64_t n, uint16_t mask) {
  const __m512i m = _mm512_set1_epi16(int16_t(mask));
  __mmask32 bad = 0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(p + i), m), m);
  for (; i < n; ++i) bad |= (p[i] & mask) == mask;
  return bad != 0;
}

bool any_exp_all_ones32(const uint32_t* p, int64_t n) {
  const __m512i m = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(p + i), m), m);
  for (; i < n; ++i) bad |= (p[i] & 0x7f800000u) == 0x7f800000u;
  return bad != 0;
}

}  // namespace ot::gdn::detail::avx512
