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

}  // namespace ot::gemm::detail
