// Vectorised bulk conversions for CPUs with AVX2 + F16C but no AVX-512 (dispatched from numeric.cpp);
// bit-identical to the scalar conversions in ot/numeric.h (bf16: round to nearest even, NaN kept quiet).
#include <immintrin.h>

#include <cstdint>

#include "ot/numeric.h"
#include "src/core/cvt_avx2.h"

namespace ot::detail {

using simd::f32_to_bf16x8;
using simd::half8_to_f32;

// Each handles whole groups of 8 and returns how many elements it did; the caller finishes the tail.
int64_t convert_to_f32_avx2(const uint16_t* s, bool bf16, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, half8_to_f32(s + i, bf16));
  return i;
}

int64_t convert_from_f32_avx2(const float* s, uint16_t* d, bool bf16, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    const __m128i h = bf16 ? f32_to_bf16x8(v) : simd::f32_to_f16x8(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  return i;
}

int64_t accumulate_f32_avx2(const void* src, DType t, float w, float* acc, int64_t n) {
  const __m256 vw = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = t == DType::f32 ? _mm256_loadu_ps(static_cast<const float*>(src) + i)
                                     : half8_to_f32(static_cast<const uint16_t*>(src) + i, t == DType::bf16);
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, x, _mm256_loadu_ps(acc + i)));
  }
  return i;
}

}  // namespace ot::detail
