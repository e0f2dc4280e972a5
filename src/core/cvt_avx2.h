// AVX2 + F16C bf16/fp16 <-> fp32 conversions of 8 lanes (round to nearest even, NaN kept quiet),
// bit-identical to the scalar conversions in ot/numeric.h, and the lane mask of partial vectors.
// Only for translation units built with the AVX2 flags (*__avx2.cpp). The functions have internal
// linkage (anonymous namespace) so no other ISA's translation unit can share a copy with them.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ot::simd {
namespace {

inline __m256 bf16x8_to_f32(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

inline __m128i f32_to_bf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  // 32-bit lanes hold values < 65536: pack to 16 bits (packus works per 128-bit half, then reorder).
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

inline __m256 f16x8_to_f32(__m128i h) { return _mm256_cvtph_ps(h); }
inline __m128i f32_to_f16x8(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// 8 bf16 (bf16 = true) or fp16 values from s.
inline __m256 half8_to_f32(const uint16_t* s, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  return bf16 ? bf16x8_to_f32(h) : f16x8_to_f32(h);
}

// All ones in lanes < n (n <= 0: none, n >= 8: all): the mask of a row's last, partial vector for
// vmaskmovps / vpmaskmovd.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace
}  // namespace ot::simd
