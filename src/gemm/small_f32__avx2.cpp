// AVX2 build of the small fp32 tiles (see small.h): R x 16 register tiles (two ymm a row, up to 6
// rows = 12 accumulators), B's rows loaded in place with masks at the column edge; matmul's small
// fp32 path on AVX2-only CPUs.
#include <immintrin.h>

#include "src/gemm/internal.h"
#include "src/gemm/small.h"

namespace ot::gemm::detail {

namespace {

// Lane mask of the first n (clamped to 0..8) of 8 floats.
inline __m256i first8(int64_t n) {
  const int64_t k = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int R, bool Two>
void tile(const SmallF32& p, int64_t i0, int64_t j0, __m256i m0, __m256i m1) {
  const int64_t K = p.e.tri_k && i0 + 8 < p.K ? i0 + 8 : p.K, ars = p.ars, acs = p.acs, ldb = p.ldb, ldc = p.ldc;
  const float* a = p.a + i0 * ars;
  const float* b = p.b + j0;
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    const __m256 b0 = _mm256_maskload_ps(bk, m0);
    const __m256 b1 = Two ? _mm256_maskload_ps(bk + 8, m1) : _mm256_setzero_ps();
    const float* ak = a + k * acs;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ak + r * ars);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      if (Two) acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  const __m256 beta = _mm256_set1_ps(p.e.beta);
  const bool load_c = p.e.beta != 0.f;
  float* c = p.c + i0 * ldc + j0;
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r, c += ldc) {
    const __m256 f = _mm256_set1_ps(p.e.rs ? p.e.alpha * p.e.rs[i0 + r] : p.e.alpha);
    __m256 x = _mm256_mul_ps(acc0[r], f);
    if (load_c) x = _mm256_fmadd_ps(beta, _mm256_maskload_ps(c, m0), x);
    _mm256_maskstore_ps(c, m0, x);
    if (Two) {
      __m256 y = _mm256_mul_ps(acc1[r], f);
      if (load_c) y = _mm256_fmadd_ps(beta, _mm256_maskload_ps(c + 8, m1), y);
      _mm256_maskstore_ps(c + 8, m1, y);
    }
  }
}

template <bool Two>
void rows(const SmallF32& p, int64_t j0, __m256i m0, __m256i m1) {
  for (int64_t i0 = 0; i0 < p.M; i0 += 6) {
    if (p.e.tri_n && j0 > i0 + 5) continue;
    switch (p.M - i0 < 6 ? p.M - i0 : 6) {
      case 1: tile<1, Two>(p, i0, j0, m0, m1); break;
      case 2: tile<2, Two>(p, i0, j0, m0, m1); break;
      case 3: tile<3, Two>(p, i0, j0, m0, m1); break;
      case 4: tile<4, Two>(p, i0, j0, m0, m1); break;
      case 5: tile<5, Two>(p, i0, j0, m0, m1); break;
      default: tile<6, Two>(p, i0, j0, m0, m1); break;
    }
  }
}

}  // namespace

void small_f32_avx2(const SmallF32& p) {
  if (p.K == 0) {  // an empty sum: C = beta * C
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) p.c[i * p.ldc + j] = p.e.beta != 0.f ? p.e.beta * p.c[i * p.ldc + j] : 0.f;
    return;
  }
  for (int64_t j0 = 0; j0 < p.N; j0 += 16) {
    const int64_t w = p.N - j0;
    if (w > 8) rows<true>(p, j0, first8(w), first8(w - 8));
    else rows<false>(p, j0, first8(w), first8(0));
  }
}

}  // namespace ot::gemm::detail
