// AVX-512 build of the small fp32 tiles (see small.h): R x 32 register tiles (two zmm a row, up to
// 8 rows = 16 accumulators), B's rows loaded in place with masks at the column edge; matmul's small
// fp32 path and the fixed-size tiles_f32.
#include <immintrin.h>

#include "src/gemm/internal.h"
#include "src/gemm/small.h"
#include "src/gemm/small_store_avx512.h"
#include "src/gemm/transpose_avx512.h"

namespace ot::gemm::detail {

namespace {

template <int R, bool Two>
void tile(const SmallF32& p, int64_t i0, int64_t j0, __mmask16 m0, __mmask16 m1) {
  // Locals, not p's fields, in the loop: the stores to C could alias p, and the compiler would
  // then reload them and spill the accumulators every k.
  const int64_t K = p.e.tri_k && i0 + 8 < p.K ? i0 + 8 : p.K, ars = p.ars, acs = p.acs, ldb = p.ldb, ldc = p.ldc;
  const float* a = p.a + i0 * ars;
  const float* b = p.b + j0;
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
    const __m512 b1 = Two ? _mm512_maskz_loadu_ps(m1, bk + 16) : _mm512_setzero_ps();
    const float* ak = a + k * acs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ak[r * ars]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      if (Two) acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  store_small_tile<R, Two>(p.c + i0 * ldc + j0, ldc, p.e, i0, m0, m1, acc0, acc1);
}

template <bool Two>
void rows(const SmallF32& p, int64_t j0, __mmask16 m0, __mmask16 m1) {
  for (int64_t i0 = 0; i0 < p.M; i0 += 8) {
    if (p.e.tri_n && j0 > i0 + 7) continue;
    const int64_t r = p.M - i0 < 8 ? p.M - i0 : 8;
    with_mr(int(r), [&](auto R) { tile<decltype(R)::value, Two>(p, i0, j0, m0, m1); });
  }
}

__mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

}  // namespace

void small_f32_avx512(const SmallF32& p) {
  if (p.K == 0) {  // an empty sum: C = beta * C
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) p.c[i * p.ldc + j] = p.e.beta != 0.f ? p.e.beta * p.c[i * p.ldc + j] : 0.f;
    return;
  }
  for (int64_t j0 = 0; j0 < p.N; j0 += 32) {
    const int64_t w = p.N - j0;
    if (w > 16) rows<true>(p, j0, first(w), first(w - 16));
    else rows<false>(p, j0, first(w), 0);
  }
}

void tiles_f32(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m,
               const TileEpi& e) {
  SmallF32 p;
  p.M = m, p.N = n, p.K = k, p.a = A, p.ars = lda, p.acs = 1, p.b = B, p.ldb = ldb, p.c = C, p.ldc = ldc, p.e = e;
  small_f32_avx512(p);
}

void transpose32_avx512(const void* src, int64_t ldx, int64_t rows, int64_t cols, void* out, int64_t ldd) {
  // dst[c][r] = x[r][c]; 16 x 16 blocks in registers, the edges element by element (bits moved as is).
  const uint32_t* x = static_cast<const uint32_t*>(src);
  uint32_t* dst = static_cast<uint32_t*>(out);
  const int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < r16; r0 += 16)
    for (int64_t c0 = 0; c0 < c16; c0 += 16) {
      __m512i v[16];
      for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_si512(x + (r0 + i) * ldx + c0);
      transpose16(v);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (c0 + i) * ldd + r0, v[i]);
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = (r < r16 ? c16 : 0); c < cols; ++c) dst[c * ldd + r] = x[r * ldx + c];
}

}  // namespace ot::gemm::detail
