// Vectorised bulk conversions (dispatched from numeric.cpp when AVX-512 is active).
#include <cstdint>

#include "ot/numeric.h"
#include "src/core/cvt_avx512.h"

namespace ot::detail {

void convert_to_f32_avx512(const uint16_t* s, bool bf16, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm512_storeu_ps(d + i, bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h));
  }
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    __m256i h = _mm256_maskz_loadu_epi16(m, s + i);
    _mm512_mask_storeu_ps(d + i, m, bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h));
  }
}

void convert_from_f32_avx512(const float* s, uint16_t* d, bool bf16, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(s + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v));
  }
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, s + i);
    _mm256_mask_storeu_epi16(d + i, m, bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v));
  }
}

void accumulate_f32_avx512(const void* src, DType t, float w, float* acc, int64_t n) {
  const __m512 vw = _mm512_set1_ps(w);
  auto load = [&](int64_t i, __mmask16 m) {
    if (t == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + i);
    return t == DType::bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h);
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(vw, load(i, 0xffff), _mm512_loadu_ps(acc + i)));
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(acc + i, m, _mm512_fmadd_ps(vw, load(i, m), _mm512_maskz_loadu_ps(m, acc + i)));
  }
}

}  // namespace ot::detail
