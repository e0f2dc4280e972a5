// AVX2 fp32 micro-kernel (machines without AVX-512). A 48-column tile is 6 ymm per row, so with 16
// ymm registers the tile runs as sub-tiles: rows in balanced groups of <= 4 (8 = 4 + 4, 5 = 3 + 2),
// a group of 3-4 rows in two 24-column passes (12 accumulators, 3 B loads and one A broadcast per
// row and k), a group of 1-2 rows in one 48-column pass (B as FMA memory operands).
#include <immintrin.h>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// C[R][8*NV] (+)= A[R][kc] x B[kc][8*NV] (b, c at the sub-tile's first column; B row stride kNR).
template <int R, int NV>
static void tile_f32(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc, bool load_c) {
  __m256 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) acc[r][j] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * j) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = b + k * kNR;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256 av = _mm256_broadcast_ss(a + r * lda + k);
#pragma GCC unroll 6
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_fmadd_ps(av, _mm256_load_ps(bk + 8 * j), acc[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(c + r * ldc + 8 * j, acc[r][j]);
}

// One row group of R rows over the whole 48-column panel.
template <int R>
static void group_f32(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc, bool load_c) {
  if constexpr (R <= 2) {
    tile_f32<R, 6>(kc, a, lda, b, c, ldc, load_c);
  } else {
    tile_f32<R, 3>(kc, a, lda, b, c, ldc, load_c);
    tile_f32<R, 3>(kc, a, lda, b + 24, c + 24, ldc, load_c);
  }
}

void kernel_avx2_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const float*>(a);
  auto B = static_cast<const float*>(b);
  in_row_groups_of_4(mr, [&](auto R, int r) { group_f32<decltype(R)::value>(kc, A + r * lda, lda, B, c + r * ldc, ldc, load_c); });
}

}  // namespace ot::gemm::detail
