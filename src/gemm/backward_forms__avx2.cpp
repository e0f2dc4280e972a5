// AVX2 pieces of the backward forms (machines without AVX-512): the dword transpose that packs
// W^T panels, as 8x8 blocks on ymm (transpose_dwords_avx512's 16x16 on zmm), and the two-row
// vnni interleave of the NN form.
#include <immintrin.h>

#include <cstring>

#include "src/core/cvt_avx2.h"
#include "src/core/transpose_avx2.h"
#include "src/gemm/backward_forms.h"

namespace ot::gemm::detail {

void transpose_dwords_avx2(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes) {
  for (int64_t p0 = 0; p0 < P; p0 += 8) {
    const int np = int(P - p0 < 8 ? P - p0 : 8);
    const __m256i m = simd::first_lanes(np);  // no reads past the row's P dwords
    const bool pf = pf_bytes && p0 % 16 == 0;  // one prefetch per 64-byte line of each row
    for (int j0 = 0; j0 < kNR; j0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        if (j0 + i >= rows) { r[i] = _mm256_setzero_ps(); continue; }
        const char* s = src + (j0 + i) * ld_bytes + p0 * 4;
        if (pf) _mm_prefetch(s + pf_bytes, _MM_HINT_T1);
        r[i] = np == 8 ? _mm256_loadu_ps(reinterpret_cast<const float*>(s)) : _mm256_maskload_ps(reinterpret_cast<const float*>(s), m);
      }
      if (j0 < rows) simd::transpose8x8(r);
      for (int q = 0; q < np; ++q) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (p0 + q) * kNR + j0), r[q]);
    }
  }
}

void pack_rows_vnni_avx2(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst) {
  for (int64_t k = 0; k < K; k += 2) {
    const uint16_t* r0 = src + k * ld;
    const bool two = k + 1 < K;
    uint16_t* d = dst + (k >> 1) * 2 * kNR;
    for (int c = 0; c < kNR; c += 8) {
      __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
      if (c + 8 <= width) {
        a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + c));
        if (two) b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + ld + c));
      } else if (c < width) {  // no 16-bit masked loads on AVX2: the tail through a zeroed buffer
        uint16_t ta[8] = {}, tb[8] = {};
        std::memcpy(ta, r0 + c, size_t(width - c) * 2);
        if (two) std::memcpy(tb, r0 + ld + c, size_t(width - c) * 2);
        a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ta));
        b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tb));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * c), _mm_unpacklo_epi16(a, b));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * c + 8), _mm_unpackhi_epi16(a, b));
    }
  }
}

}  // namespace ot::gemm::detail
