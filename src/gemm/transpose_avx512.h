// In-register 16x16 dword transpose for the backward forms' packs (include from AVX-512 files only).
#pragma once
#include <immintrin.h>

namespace ot::gemm::detail {

// In-register transpose of 16 rows of 16 dwords (unpack 32/64, then two lane shuffles).
inline void transpose16(__m512i r[16]) {
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

}  // namespace ot::gemm::detail
