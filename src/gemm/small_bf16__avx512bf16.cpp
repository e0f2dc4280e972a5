// AVX512-BF16 build of matmul_bf16_operands' small path (see small.h): both operands rounded to bf16
// pairs along K while packed into per-thread scratch (A as one word per (row, pair), read by
// broadcast; B as [pairs][N] words), then R x 32 vdpbf16ps tiles (two zmm a row, up to 8 rows).
#include <immintrin.h>

#include "src/gemm/internal.h"
#include "src/gemm/small.h"
#include "src/gemm/transpose_avx512.h"

namespace ot::gemm::detail {

namespace {

// 16 words from two rows of 16 floats: low half x[n], high half y[n] (bf16, nearest even).
inline __m512i pair16(__m512 x, __m512 y) {
  const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(y));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
inline __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

// dst[p][j] = pair(X(2p, j), X(2p + 1, j)) for j < n, where X(k, j) = x[k * rs + j] (rows of
// contiguous floats); an odd last k pairs with 0. dst row stride ldd words.
void pair_rows(const float* x, int64_t rs, int64_t K, int64_t n, uint32_t* dst, int64_t ldd) {
  for (int64_t p = 0; 2 * p < K; ++p) {
    const float* r0 = x + 2 * p * rs;
    const float* r1 = 2 * p + 1 < K ? r0 + rs : nullptr;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = first(n - j);
      const __m512 a = _mm512_maskz_loadu_ps(m, r0 + j), b = r1 ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(dst + p * ldd + j, m, pair16(a, b));
    }
  }
}

// dst[i][p] = pair(X(i, 2p), X(i, 2p + 1)) for rows i < m of contiguous floats x[i * rs + k]: the
// bf16 row, read as words (an odd K pads with 0). dst row stride ldd words.
void pair_cols(const float* x, int64_t rs, int64_t m, int64_t K, uint32_t* dst, int64_t ldd) {
  const int64_t P = (K + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    const float* r = x + i * rs;
    uint32_t* d = dst + i * ldd;
    for (int64_t p0 = 0; p0 < P; p0 += 16) {
      // 32 floats -> 16 words: even k in the low halves, odd k in the high.
      const int64_t k0 = 2 * p0, left = K - k0;
      const __m512 a = _mm512_maskz_loadu_ps(first(left), r + k0), b = _mm512_maskz_loadu_ps(first(left - 16), r + k0 + 16);
      // The 32 bf16 in order (a's in the low 16 lanes), i.e. the words (k0, k0 + 1), (k0 + 2, k0 + 3), ...
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      _mm512_mask_storeu_epi32(d + p0, first(P - p0), w);
    }
  }
}

// dst[c][r] = x[r][c] for 32-bit words: 16 x 16 blocks in registers, the edges one by one.
void transpose_u32(const uint32_t* x, int64_t ldx, int64_t rows, int64_t cols, uint32_t* dst, int64_t ldd) {
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

struct Packed {
  const uint32_t* a;
  int64_t ars, acs;  // word (i, p) at a + i * ars + p * acs
  const uint32_t* b;
  int64_t ldb;       // word (p, j) at b + p * ldb + j
  int64_t M, N, P;
  float* c;
  int64_t ldc;
  float alpha, beta;
};

template <int R, bool Two>
void tile(const Packed& q, int64_t i0, int64_t j0, __mmask16 m0, __mmask16 m1) {
  const int64_t P = q.P, ars = q.ars, acs = q.acs, ldb = q.ldb, ldc = q.ldc;
  const uint32_t* a = q.a + i0 * ars;
  const uint32_t* b = q.b + j0;
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const uint32_t* bp = b + p * ldb;
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, bp);
    const __m512bh b1 = Two ? (__m512bh)_mm512_maskz_loadu_epi32(m1, bp + 16) : (__m512bh)_mm512_setzero_si512();
    const uint32_t* ap = a + p * acs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[r * ars]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
      if (Two) acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
    }
  }
  const __m512 alpha = _mm512_set1_ps(q.alpha), beta = _mm512_set1_ps(q.beta);
  const bool load_c = q.beta != 0.f;
  float* c = q.c + i0 * ldc + j0;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r, c += ldc) {
    __m512 x = _mm512_mul_ps(acc0[r], alpha);
    if (load_c) x = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, c), x);
    _mm512_mask_storeu_ps(c, m0, x);
    if (Two) {
      __m512 y = _mm512_mul_ps(acc1[r], alpha);
      if (load_c) y = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, c + 16), y);
      _mm512_mask_storeu_ps(c + 16, m1, y);
    }
  }
}

template <bool Two>
void rows(const Packed& q, int64_t j0, __mmask16 m0, __mmask16 m1) {
  for (int64_t i0 = 0; i0 < q.M; i0 += 8) {
    const int64_t r = q.M - i0 < 8 ? q.M - i0 : 8;
    with_mr(int(r), [&](auto R) { tile<decltype(R)::value, Two>(q, i0, j0, m0, m1); });
  }
}

}  // namespace

void small_bf16_avx512bf16(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  const int64_t M = a.rows, N = b.cols, K = a.cols, P = (K + 1) / 2;
  thread_local Buf abuf, bbuf;
  Packed q;
  q.M = M, q.N = N, q.P = P;
  q.c = static_cast<float*>(c.data), q.ldc = c.rs, q.alpha = alpha, q.beta = beta;
  // A: rows contiguous -> word rows [M][P]; columns contiguous (A = Y^T) -> pair Y's rows: [P][M].
  uint32_t* aw = reinterpret_cast<uint32_t*>(abuf.get(sizeof(uint32_t) * size_t(M * P + 16)));
  const float* ad = static_cast<const float*>(a.data);
  if (a.cs == 1) pair_cols(ad, a.rs, M, K, aw, P), q.a = aw, q.ars = P, q.acs = 1;
  else pair_rows(ad, a.cs, K, M, aw, M), q.a = aw, q.ars = 1, q.acs = M;
  // B: rows contiguous -> pair rows [P][N]; columns contiguous (B = X^T) -> X's bf16 rows as words
  // [N][P], transposed to [P][N].
  uint32_t* bw = reinterpret_cast<uint32_t*>(bbuf.get(sizeof(uint32_t) * size_t(2 * P * N + 32)));
  const float* bd = static_cast<const float*>(b.data);
  if (b.cs == 1) {
    pair_rows(bd, b.rs, K, N, bw, N);
  } else {
    uint32_t* xw = bw + P * N;
    pair_cols(bd, b.cs, N, K, xw, P);
    transpose_u32(xw, P, N, P, bw, N);
  }
  q.b = bw, q.ldb = N;
  for (int64_t j0 = 0; j0 < N; j0 += 32) {
    const int64_t w = N - j0;
    if (w > 16) rows<true>(q, j0, first(w), first(w - 16));
    else rows<false>(q, j0, first(w), 0);
  }
}

}  // namespace ot::gemm::detail
