// AVX-512 pieces of the TN form: the A^T pack (pair interleave + dword transpose) and the
// 64-column B panels of the direct-store path.
#include <immintrin.h>

#include "src/gemm/tn_form.h"
#include "src/gemm/transpose_avx512.h"

namespace ot::gemm::detail {

// dword i of the result = (a[i], b[i]) for the 16 bf16 of a (low half) and b (high half).
static inline __m512i interleave16(__m256i a, __m256i b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                       17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

void pack_cols_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int64_t M, uint16_t* dst, int64_t ldd) {
  const int64_t P = (K + 1) / 2;
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int nm = int(M - m0 < 16 ? M - m0 : 16);
    const __mmask16 mm = __mmask16((1u << nm) - 1);
    for (int64_t p0 = 0; p0 < P; p0 += 16) {
      const int np = int(P - p0 < 16 ? P - p0 : 16);
      __m512i r[16];
      for (int q = 0; q < 16; ++q) {  // r[q] = pair p0 + q of columns m0.. (dword per column)
        if (q >= np) { r[q] = _mm512_setzero_si512(); continue; }
        const int64_t k = 2 * (p0 + q);
        __m256i a = _mm256_maskz_loadu_epi16(mm, src + k * ld + m0);
        __m256i b = k + 1 < K ? _mm256_maskz_loadu_epi16(mm, src + (k + 1) * ld + m0) : _mm256_setzero_si256();
        r[q] = interleave16(a, b);
      }
      transpose16(r);  // r[i] = column m0 + i: pairs p0..p0+15
      for (int i = 0; i < nm; ++i) _mm512_mask_storeu_epi32(dst + (m0 + i) * ldd + 2 * p0, __mmask16((1u << np) - 1), r[i]);
    }
  }
}

void pack_rows_vnni64_avx512(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst) {
  const __mmask32 m0 = width >= 32 ? ~__mmask32(0) : __mmask32((1u << width) - 1);
  const __mmask32 m1 = width >= 64 ? ~__mmask32(0) : width > 32 ? __mmask32((1u << (width - 32)) - 1) : 0;
  // element 2i of the result = a[i], 2i + 1 = b[i] (i < 16), and the same from 16 with `hi`
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2,
                                      33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t k = 0; k < K; k += 2) {
    const uint16_t* r0 = src + k * ld;
    const bool two = k + 1 < K;
    const __m512i a0 = _mm512_maskz_loadu_epi16(m0, r0), a1 = _mm512_maskz_loadu_epi16(m1, r0 + 32);
    const __m512i b0 = two ? _mm512_maskz_loadu_epi16(m0, r0 + ld) : _mm512_setzero_si512();
    const __m512i b1 = two ? _mm512_maskz_loadu_epi16(m1, r0 + ld + 32) : _mm512_setzero_si512();
    uint16_t* d = dst + (k >> 1) * 2 * kTnNR;
    _mm512_store_si512(d, _mm512_permutex2var_epi16(a0, lo, b0));
    _mm512_store_si512(d + 32, _mm512_permutex2var_epi16(a0, hi, b0));
    _mm512_store_si512(d + 64, _mm512_permutex2var_epi16(a1, lo, b1));
    _mm512_store_si512(d + 96, _mm512_permutex2var_epi16(a1, hi, b1));
  }
}

}  // namespace ot::gemm::detail
