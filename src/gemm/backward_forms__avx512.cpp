// AVX-512 pieces of the backward forms: the 16x16 dword transpose that packs W^T panels, the
// two-row vnni interleave, and the tile store with streaming writes.
#include <immintrin.h>

#include <cstring>

#include "src/core/cvt_avx512.h"
#include "src/gemm/backward_forms.h"
#include "src/gemm/transpose_avx512.h"

namespace ot::gemm::detail {

void transpose_dword_rows_avx512(const char* const* src, int rows, int64_t P, uint32_t* dst, int width, int64_t pf_bytes) {
  for (int64_t p0 = 0; p0 < P; p0 += 16) {
    const int np = int(P - p0 < 16 ? P - p0 : 16);
    const __mmask16 m = __mmask16((1u << np) - 1);
    for (int j0 = 0; j0 < width; j0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        if (j0 + i >= rows) { r[i] = _mm512_setzero_si512(); continue; }
        const char* s = src[j0 + i] + p0 * 4;
        if (pf_bytes) _mm_prefetch(s + pf_bytes, _MM_HINT_T1);
        r[i] = _mm512_maskz_loadu_epi32(m, s);
      }
      transpose16(r);
      for (int q = 0; q < np; ++q) _mm512_store_si512(dst + (p0 + q) * width + j0, r[q]);
    }
  }
}

void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes) {
  const char* row[kNR];
  for (int j = 0; j < rows; ++j) row[j] = src + j * ld_bytes;
  transpose_dword_rows_avx512(row, rows, P, dst, kNR, pf_bytes);
}

void store_transposed_avx512(const float* t, int64_t ldt, int n, int m, float* c, int64_t ldc, bool accumulate) {
  for (int i0 = 0; i0 < n; i0 += 16) {
    const int ni = n - i0 < 16 ? n - i0 : 16;
    const __mmask16 mi = __mmask16((1u << ni) - 1);
    for (int j0 = 0; j0 < m; j0 += 16) {
      const int nj = m - j0 < 16 ? m - j0 : 16;
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < ni ? _mm512_loadu_si512(t + (i0 + i) * ldt + j0) : _mm512_setzero_si512();
      transpose16(r);  // r[q] = column j0 + q of t: rows i0 .. i0 + 15
      for (int q = 0; q < nj; ++q) {
        float* d = c + (j0 + q) * ldc + i0;
        __m512 v = _mm512_castsi512_ps(r[q]);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mi, d));
        _mm512_mask_storeu_ps(d, mi, v);
      }
    }
  }
}

void pack_rows_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst, int panel) {
  const __mmask32 m0 = width >= 32 ? ~__mmask32(0) : __mmask32((1u << width) - 1);
  const __mmask32 m1 = width >= 64 ? ~__mmask32(0) : width > 32 ? __mmask32((1u << (width - 32)) - 1) : 0;
  // element 2i of the result = a[i], 2i + 1 = b[i] (i < 16), and the same from 16 with `hi`
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2,
                                      33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t k = 0; k < K; k += 2) {
    const uint16_t* r0 = src + k * ld;
    const bool two = k + 1 < K;
    __m512i a0 = _mm512_maskz_loadu_epi16(m0, r0), a1 = _mm512_maskz_loadu_epi16(m1, r0 + 32);
    __m512i b0 = two ? _mm512_maskz_loadu_epi16(m0, r0 + ld) : _mm512_setzero_si512();
    __m512i b1 = two ? _mm512_maskz_loadu_epi16(m1, r0 + ld + 32) : _mm512_setzero_si512();
    uint16_t* d = dst + (k >> 1) * 2 * panel;
    _mm512_storeu_si512(d, _mm512_permutex2var_epi16(a0, lo, b0));
    _mm512_storeu_si512(d + 32, _mm512_permutex2var_epi16(a0, hi, b0));
    _mm512_storeu_si512(d + 64, _mm512_permutex2var_epi16(a1, lo, b1));
    if (panel == 64) _mm512_storeu_si512(d + 96, _mm512_permutex2var_epi16(a1, hi, b1));
  }
}

void store_tile_avx512(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate) {
  const bool bf = c_dtype == DType::bf16;
  const int line = bf ? 32 : 16;  // elements per 64-byte line
  for (int r = 0; r < rows; ++r) {
    const float* t = tile + r * ldt;
    char* d = static_cast<char*>(c) + (r * ldc) * (bf ? 2 : 4);
    int j = 0;
    if (!accumulate && (reinterpret_cast<uintptr_t>(d) & 63) == 0) {
      for (; j + line <= width; j += line) {
        if (bf) {
          __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(simd::f32_to_bf16x16(_mm512_loadu_ps(t + j))), simd::f32_to_bf16x16(_mm512_loadu_ps(t + j + 16)), 1);
          _mm512_stream_si512(reinterpret_cast<__m512i*>(d + j * 2), v);
        } else {
          _mm512_stream_ps(reinterpret_cast<float*>(d) + j, _mm512_loadu_ps(t + j));
        }
      }
    }
    for (; j < width; j += 16) {
      const __mmask16 mk = width - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (width - j)) - 1);
      __m512 v = _mm512_maskz_loadu_ps(mk, t + j);
      if (bf) {
        uint16_t* dp = reinterpret_cast<uint16_t*>(d) + j;
        if (accumulate) v = _mm512_add_ps(v, simd::bf16x16_to_f32(_mm256_maskz_loadu_epi16(mk, dp)));
        _mm256_mask_storeu_epi16(dp, mk, simd::f32_to_bf16x16(v));
      } else {
        float* dp = reinterpret_cast<float*>(d) + j;
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, dp));
        _mm512_mask_storeu_ps(dp, mk, v);
      }
    }
  }
}

void store_fence_avx512() { _mm_sfence(); }

}  // namespace ot::gemm::detail
