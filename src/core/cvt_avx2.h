// AVX2 + F16C bf16/fp16 <-> fp32 conversions of 8 lanes (round to nearest even, NaN kept quiet),
// bit-identical to the scalar conversions in ot/numeric.h, the lane mask of partial vectors, and
// loads / stores of a row's last, partial vector in any of the three dtypes.
// Only for translation units built with the AVX2 flags (*__avx2.cpp). The functions have internal
// linkage (anonymous namespace) so no other ISA's translation unit can share a copy with them.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ot/tensor.h"

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

// n (<= 8) values of dtype t (f32, bf16 or f16) from element i of p as fp32, lanes >= n zero; only
// those n elements are read (AVX2 masks 32-bit lanes only: 16-bit tails go through a buffer).
inline __m256 load_n(const void* p, DType t, int64_t i, int64_t n) {
  if (t == DType::f32) {
    const float* s = static_cast<const float*>(p) + i;
    return n >= 8 ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, first_lanes(n));
  }
  const uint16_t* s = static_cast<const uint16_t*>(p) + i;
  if (n >= 8) return half8_to_f32(s, t == DType::bf16);
  alignas(16) uint16_t buf[8] = {};
  std::memcpy(buf, s, size_t(n) * 2);
  return half8_to_f32(buf, t == DType::bf16);
}
// The first n (<= 8) lanes of v stored as dtype t (f32, bf16 or f16) at element i of p; nothing
// past them is written.
inline void store_n(void* p, DType t, int64_t i, int64_t n, __m256 v) {
  if (t == DType::f32) {
    float* d = static_cast<float*>(p) + i;
    if (n >= 8) _mm256_storeu_ps(d, v);
    else _mm256_maskstore_ps(d, first_lanes(n), v);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(p) + i;
  const __m128i h = t == DType::bf16 ? f32_to_bf16x8(v) : f32_to_f16x8(v);
  if (n >= 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(d), h);
  alignas(16) uint16_t buf[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(buf), h);
  std::memcpy(d, buf, size_t(n) * 2);
}

}  // namespace
}  // namespace ot::simd
