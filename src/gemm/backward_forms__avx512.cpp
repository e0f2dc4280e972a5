// AVX-512 pieces of the backward forms: the 16x16 dword transpose that packs W^T panels, and the
// tile store with streaming writes for weight gradients.
#include <immintrin.h>

#include <cstring>

#include "src/core/cvt_avx512.h"
#include "src/gemm/backward_forms.h"

namespace ot::gemm::detail {

// In-register transpose of 16 rows of 16 dwords (unpack 32/64, then two lane shuffles).
static inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: u[4g+q] holds column 4L+q of them in lane L
    __m512i a = t[4 * g], b = t[4 * g + 1], c = t[4 * g + 2], d = t[4 * g + 3];
    u[4 * g + 0] = _mm512_unpacklo_epi64(a, c);
    u[4 * g + 1] = _mm512_unpackhi_epi64(a, c);
    u[4 * g + 2] = _mm512_unpacklo_epi64(b, d);
    u[4 * g + 3] = _mm512_unpackhi_epi64(b, d);
  }
  for (int q = 0; q < 4; ++q) {
    __m512i x0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), x1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xDD);
    __m512i y0 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88), y1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xDD);
    r[q] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[4 + q] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes) {
  for (int64_t p0 = 0; p0 < P; p0 += 16) {
    const int np = int(P - p0 < 16 ? P - p0 : 16);
    const __mmask16 m = __mmask16((1u << np) - 1);
    for (int j0 = 0; j0 < kNR; j0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const char* s = src + (j0 + i) * ld_bytes + p0 * 4;
        if (j0 + i >= rows) { r[i] = _mm512_setzero_si512(); continue; }
        if (pf_bytes) _mm_prefetch(s + pf_bytes, _MM_HINT_T1);
        r[i] = _mm512_maskz_loadu_epi32(m, s);
      }
      transpose16(r);
      for (int q = 0; q < np; ++q) _mm512_store_si512(dst + (p0 + q) * kNR + j0, r[q]);
    }
  }
}

// dword i of the result = (a[i], b[i]) for the 16 bf16 of a (low half) and b (high half).
static inline __m512i interleave16(__m256i a, __m256i b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                       17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

void pack_rows_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst) {
  const __mmask32 m0 = width >= 32 ? ~__mmask32(0) : __mmask32((1u << width) - 1);
  const __mmask32 m1 = width > 32 ? __mmask32((1u << (width - 32)) - 1) : 0;
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
    uint16_t* d = dst + (k >> 1) * 2 * kNR;
    _mm512_storeu_si512(d, _mm512_permutex2var_epi16(a0, lo, b0));
    _mm512_storeu_si512(d + 32, _mm512_permutex2var_epi16(a0, hi, b0));
    _mm512_storeu_si512(d + 64, _mm512_permutex2var_epi16(a1, lo, b1));
  }
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
