// AVX-512 pieces of the backward forms: the 16x16 dword transpose that packs W^T panels, and the
// tile store with streaming writes for weight gradients.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

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

void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst) {
  for (int64_t p0 = 0; p0 < P; p0 += 16) {
    const int np = int(P - p0 < 16 ? P - p0 : 16);
    const __mmask16 m = __mmask16((1u << np) - 1);
    for (int j0 = 0; j0 < kNR; j0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < rows ? _mm512_maskz_loadu_epi32(m, src + (j0 + i) * ld_bytes + p0 * 4) : _mm512_setzero_si512();
      transpose16(r);
      for (int q = 0; q < np; ++q) _mm512_store_si512(dst + (p0 + q) * kNR + j0, r[q]);
    }
  }
}

void store_tile_avx512(const float* tile, int rows, int width, float* c, int64_t ldc, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    const float* t = tile + r * kNR;
    float* d = c + r * ldc;
    if (!accumulate && width == kNR && (reinterpret_cast<uintptr_t>(d) & 63) == 0) {
      for (int j = 0; j < kNR; j += 16) _mm512_stream_ps(d + j, _mm512_load_ps(t + j));
      continue;
    }
    for (int j = 0; j < width; j += 16) {
      __mmask16 mk = width - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (width - j)) - 1);
      __m512 v = _mm512_maskz_loadu_ps(mk, t + j);
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, d + j));
      _mm512_mask_storeu_ps(d + j, mk, v);
    }
  }
}

void store_fence_avx512() { _mm_sfence(); }

}  // namespace ot::gemm::detail
