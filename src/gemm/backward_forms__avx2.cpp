// AVX2 pieces of the backward forms (machines without AVX-512): the dword transpose that packs
// W^T panels, as 8x8 blocks on ymm (transpose_dwords_avx512's 16x16 on zmm), the two-row
// vnni interleave of the NN form, and the tile store of the TN form (store_tile_avx512 on ymm).
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

void store_tile_avx2(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate) {
  const bool bf = c_dtype == DType::bf16;
  const int line = bf ? 32 : 16;  // elements per 64-byte line
  bool streamed = false;
  for (int r = 0; r < rows; ++r) {
    const float* t = tile + r * ldt;
    char* d = static_cast<char*>(c) + (r * ldc) * (bf ? 2 : 4);
    int j = 0;
    if (!accumulate && (reinterpret_cast<uintptr_t>(d) & 63) == 0) {  // whole lines: no read-for-ownership
      for (; j + line <= width; j += line) {
        for (int h = 0; h < 2; ++h) {
          const float* s = t + j + h * line / 2;
          __m256i v;
          if (bf) v = _mm256_set_m128i(simd::f32_to_bf16x8(_mm256_loadu_ps(s + 8)), simd::f32_to_bf16x8(_mm256_loadu_ps(s)));
          else v = _mm256_castps_si256(_mm256_loadu_ps(s));
          _mm256_stream_si256(reinterpret_cast<__m256i*>(d + (j + h * line / 2) * (bf ? 2 : 4)), v);
        }
        streamed = true;
      }
    }
    for (; j < width; j += 8) {  // the rest (and every line when accumulating), partial vectors masked
      __m256 v = simd::load_n(t, DType::f32, j, width - j);
      if (accumulate) v = _mm256_add_ps(v, simd::load_n(d, c_dtype, j, width - j));
      simd::store_n(d, c_dtype, j, width - j, v);
    }
  }
  if (streamed) _mm_sfence();  // the streamed lines are globally visible before the caller's join
}

}  // namespace ot::gemm::detail
