// Widening bf16 to fp32 on AVX2 for the bf16 vnni kernels (kernel_bf16__avx2.cpp,
// kernel_bf16_decode__avx2.cpp): a 32-bit lane of a pair row holds (k, k+1), and a bf16 is the high
// half of its fp32, so k even = lane << 16 and k odd = lane & 0xffff0000 (exact). Only for
// translation units built with the AVX2 flags; internal linkage (anonymous namespace).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "src/core/cvt_avx2.h"

namespace ot::gemm::detail {
namespace {

// (Built per call, not as a global: a namespace-scope initializer would run AVX2 code at load.)
inline __m256i hi_mask() { return _mm256_set1_epi32(int(0xffff0000u)); }
inline __m256 lo_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 hi_f32(__m256i v, __m256i mask) { return _mm256_castsi256_ps(_mm256_and_si256(v, mask)); }

// af[r][0..kc) (row stride ldaf) = A row r (stride lda) widened to fp32, r < rows; exact.
inline void widen_rows(int rows, int64_t kc, const uint16_t* a, int64_t lda, float* af, int64_t ldaf) {
  for (int r = 0; r < rows; ++r) {
    const uint16_t* s = a + r * lda;
    float* d = af + r * ldaf;
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(d + k, simd::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k))));
    for (; k < kc; ++k) {
      const uint32_t u = uint32_t(s[k]) << 16;
      std::memcpy(d + k, &u, 4);
    }
  }
}

}  // namespace
}  // namespace ot::gemm::detail
