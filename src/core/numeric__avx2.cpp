// Vectorised bulk conversions for CPUs with AVX2 + F16C but no AVX-512 (dispatched from numeric.cpp);
// bit-identical to the scalar conversions in ot/numeric.h (bf16: round to nearest even, NaN kept quiet).
#include <immintrin.h>

#include <cstdint>

#include "ot/numeric.h"

namespace ot::detail {

namespace {
__m256 bf16x8_to_f32(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

__m128i f32_to_bf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  // 32-bit lanes hold values < 65536: pack to 16 bits (packus works per 128-bit half, then reorder).
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

__m256 half8_to_f32(const uint16_t* s, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  return bf16 ? bf16x8_to_f32(h) : _mm256_cvtph_ps(h);
}
}  // namespace

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
    const __m128i h = bf16 ? f32_to_bf16x8(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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
