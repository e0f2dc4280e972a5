// AVX512-BF16 build of the bf16-pair tiles (see small.h): R x 32 vdpbf16ps tiles (two zmm a row,
// up to 8 rows) over A words read by broadcast and B words [pairs][N]; and the same products with
// B widened to fp32 FMAs. matmul_bf16_operands' small path rounds both operands into those
// layouts in per-thread scratch; tiles_bf16 / tiles_widen take operands already in them.
#include <immintrin.h>

#include "ot/numeric.h"
#include "src/gemm/internal.h"
#include "src/gemm/small.h"
#include "src/gemm/small_store_avx512.h"
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

struct Packed {
  const uint32_t* a = nullptr;  // bf16 tiles: word (i, p) at a + i * ars + p * acs
  const float* af = nullptr;    // widening tiles: fp32 A(i, k) at af + i * ars + k * acs
  int64_t ars = 0, acs = 0;
  const uint32_t* b = nullptr;
  int64_t ldb = 0;              // word (p, j) at b + p * ldb + j
  int64_t M = 0, N = 0, P = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  TileEpi e;
};

// Pairs of K a tile's rows sum over (tri_k: A lower triangular, rows [i0, i0 + 8) end at i0 + 8).
inline int64_t pairs_of(const Packed& q, int64_t i0) { return q.e.tri_k && (i0 + 8) / 2 < q.P ? (i0 + 8) / 2 : q.P; }

template <int R, bool Two>
void tile(const Packed& q, int64_t i0, int64_t j0, __mmask16 m0, __mmask16 m1) {
  const int64_t P = pairs_of(q, i0), ars = q.ars, acs = q.acs, ldb = q.ldb;
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
  store_small_tile<R, Two>(q.c + i0 * q.ldc + j0, q.ldc, q.e, i0, m0, m1, acc0, acc1);
}

// The same product on fp32 A and B words widened in registers (k even = word << 16, k odd = word &
// 0xffff0000, exact): 4 widening ops per 32 FMAs.
template <int R, bool Two>
void tile_widen(const Packed& q, int64_t i0, int64_t j0, __mmask16 m0, __mmask16 m1) {
  const int64_t P = pairs_of(q, i0), ars = q.ars, acs = q.acs, ldb = q.ldb;
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const float* a = q.af + i0 * ars;
  const uint32_t* b = q.b + j0;
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const uint32_t* bp = b + p * ldb;
    const __m512i w0 = _mm512_maskz_loadu_epi32(m0, bp), w1 = Two ? _mm512_maskz_loadu_epi32(m1, bp + 16) : _mm512_setzero_si512();
    const float* ap = a + 2 * p * acs;
    const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * ars]);
      acc0[r] = _mm512_fmadd_ps(av, e0, acc0[r]);
      if (Two) acc1[r] = _mm512_fmadd_ps(av, e1, acc1[r]);
    }
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi)), o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * ars + acs]);
      acc0[r] = _mm512_fmadd_ps(av, o0, acc0[r]);
      if (Two) acc1[r] = _mm512_fmadd_ps(av, o1, acc1[r]);
    }
  }
  store_small_tile<R, Two>(q.c + i0 * q.ldc + j0, q.ldc, q.e, i0, m0, m1, acc0, acc1);
}

template <bool Two, bool Widen>
void rows(const Packed& q, int64_t j0, __mmask16 m0, __mmask16 m1) {
  for (int64_t i0 = 0; i0 < q.M; i0 += 8) {
    if (q.e.tri_n && j0 > i0 + 7) continue;
    const int64_t r = q.M - i0 < 8 ? q.M - i0 : 8;
    with_mr(int(r), [&](auto R) {
      if constexpr (Widen) tile_widen<decltype(R)::value, Two>(q, i0, j0, m0, m1);
      else tile<decltype(R)::value, Two>(q, i0, j0, m0, m1);
    });
  }
}

template <bool Widen>
void run(const Packed& q) {
  for (int64_t j0 = 0; j0 < q.N; j0 += 32) {
    const int64_t w = q.N - j0;
    if (w > 16) rows<true, Widen>(q, j0, first(w), first(w - 16));
    else rows<false, Widen>(q, j0, first(w), 0);
  }
}

}  // namespace

void small_bf16_avx512bf16(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  const int64_t M = a.rows, N = b.cols, K = a.cols, P = (K + 1) / 2;
  thread_local Buf abuf, bbuf;
  Packed q;
  q.M = M, q.N = N, q.P = P;
  q.c = static_cast<float*>(c.data), q.ldc = c.rs, q.e.alpha = alpha, q.e.beta = beta;
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
    transpose32_avx512(xw, P, N, P, bw, N);
  }
  q.b = bw, q.ldb = N;
  run<false>(q);
}

void tiles_widen(const float* A, int64_t lda, const uint32_t* B, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m, const TileEpi& e) {
  Packed q;
  q.af = A, q.ars = lda, q.acs = 1, q.b = B, q.ldb = n, q.M = m, q.N = n, q.P = k / 2, q.c = C, q.ldc = ldc, q.e = e;
  run<true>(q);
}

void tiles_bf16(const uint16_t* A, int64_t lda, const uint32_t* B, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m, const TileEpi& e,
                float* a32) {
  if (a32) {
    for (int64_t i = 0; i < m; ++i) convert_to_f32(A + i * lda, DType::bf16, a32 + i * k, k);
    tiles_widen(a32, k, B, n, k, C, ldc, m, e);
    return;
  }
  Packed q;
  q.a = reinterpret_cast<const uint32_t*>(A), q.ars = lda / 2, q.acs = 1, q.b = B, q.ldb = n, q.M = m, q.N = n, q.P = k / 2;
  q.c = C, q.ldc = ldc, q.e = e;
  run<false>(q);
}

}  // namespace ot::gemm::detail
