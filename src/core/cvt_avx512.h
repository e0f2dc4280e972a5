// AVX-512 bf16/fp16 <-> fp32 conversions of 16 lanes (round to nearest even, NaN kept quiet).
// Only for translation units built with the AVX-512 flags (*__avx512*.cpp).
#pragma once
#include <immintrin.h>

namespace ot::simd {

inline __m512 bf16x16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline __m256i f32_to_bf16x16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}
inline __m512 f16x16_to_f32(__m256i h) { return _mm512_cvtph_ps(h); }
inline __m256i f32_to_f16x16(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

}  // namespace ot::simd
