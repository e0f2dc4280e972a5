// AVX-512 fp32 micro-kernel: MR x 48 register tile (3 zmm per row, up to 8 rows = 24 accumulators),
// one broadcast of A and three loads of the B panel per k.
#include <immintrin.h>

#include "src/gemm/internal.h"
#include "src/gemm/tile_io_avx512.h"

namespace ot::gemm::detail {

template <int MR>
static void tile_f32(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc, bool load_c) {
  __m512 acc[MR][3];
  load_acc(acc, c, ldc, load_c);
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = b + k * kNR;
    __m512 b0 = _mm512_load_ps(bk), b1 = _mm512_load_ps(bk + 16), b2 = _mm512_load_ps(bk + 32);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512 av = _mm512_set1_ps(a[r * lda + k]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
    }
  }
  store_acc(acc, c, ldc);
}

void kernel_avx512_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  with_mr(mr, [&](auto R) { tile_f32<decltype(R)::value>(kc, static_cast<const float*>(a), lda, static_cast<const float*>(b), c, ldc, load_c); });
}

}  // namespace ot::gemm::detail
