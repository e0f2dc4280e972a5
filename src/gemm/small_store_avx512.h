// The small tiles' epilogue on AVX-512 (include from AVX-512 files only): rows [i0, i0 + R) of a
// 32-column tile, C = alpha * rs[i] * acc (+ beta * C when beta != 0), masked at the column edge.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "src/gemm/small.h"

namespace ot::gemm::detail {

template <int R, bool Two>
inline void store_small_tile(float* c, int64_t ldc, const TileEpi& e, int64_t i0, __mmask16 m0, __mmask16 m1, const __m512 (&acc0)[R],
                             const __m512 (&acc1)[R]) {
  const __m512 beta = _mm512_set1_ps(e.beta);
  const bool load_c = e.beta != 0.f;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r, c += ldc) {
    const __m512 f = _mm512_set1_ps(e.rs ? e.alpha * e.rs[i0 + r] : e.alpha);
    __m512 x = _mm512_mul_ps(acc0[r], f);
    if (load_c) x = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, c), x);
    _mm512_mask_storeu_ps(c, m0, x);
    if (Two) {
      __m512 y = _mm512_mul_ps(acc1[r], f);
      if (load_c) y = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, c + 16), y);
      _mm512_mask_storeu_ps(c + 16, m1, y);
    }
  }
}

}  // namespace ot::gemm::detail
