// AVX2 kernels of the quantised grouped GEMM (layout: quant_internal.h). The single-row kernel: 32
// columns (4 ymm). Codes widen to int32 lanes (vpmovsxbd / vpmovzxbd + nibble mask or shift) and
// convert to fp32 in registers; each K group's partial sums take the group's scale and the offset
// term once at the group's end, into the fp32 tile c (which stays in L1). One row runs two partial
// sets over even and odd k, so eight independent FMA chains hide the FMA latency.
#include <immintrin.h>

#include "src/gemm/quant_internal.h"

namespace ot::gemm::qdetail {

namespace {

constexpr int64_t kPrefetchBytes = 1024;  // ahead of the code stream (decode reads each panel once)

template <bool I4> __attribute__((always_inline)) inline void dequant(const char* row, __m256 b[4]) {
  if constexpr (I4) {
    const __m256i x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
    const __m256i x1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8)));
    const __m256i lo = _mm256_set1_epi32(0xF);
    b[0] = _mm256_cvtepi32_ps(_mm256_and_si256(x0, lo));
    b[1] = _mm256_cvtepi32_ps(_mm256_and_si256(x1, lo));
    b[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(x0, 4));
    b[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(x1, 4));
  } else {
    for (int v = 0; v < 4; ++v)
      b[v] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * v))));
  }
}

// One k step: p[r][v] += a[r][k] * w(k, 8v..8v+7). Plain loops over constant bounds (no lambda
// capturing p by reference, which kept the accumulators in memory).
template <int R, bool I4>
__attribute__((always_inline)) inline void step(const char* row, const float* ak, int64_t lda, __m256 (&p)[R][4]) {
  __m256 b[4];
  dequant<I4>(row, b);
  for (int r = 0; r < R; ++r) {
    const __m256 av = _mm256_broadcast_ss(ak + r * lda);
    for (int v = 0; v < 4; ++v) p[r][v] = _mm256_fmadd_ps(av, b[v], p[r][v]);
  }
}

template <int R, bool I4>
void tile(const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len, float* c) {
  constexpr int64_t rb = I4 ? kQNR / 2 : kQNR;
  for (int64_t j = 0; j < groups; ++j) {
    const float* s = reinterpret_cast<const float*>(panel);
    const char* codes = panel + kQHeader;
    const float* aj = a + j * len;
    __m256 p[R][4], q[R][4];  // q: the odd-k partial sums of a single row
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) p[r][v] = q[r][v] = _mm256_setzero_ps();
    int64_t k = 0;
    if constexpr (R == 1) {
      for (; k + 2 <= len; k += 2) {
        _mm_prefetch(codes + k * rb + kPrefetchBytes, _MM_HINT_T0);
        step<R, I4>(codes + k * rb, aj + k, lda, p);
        step<R, I4>(codes + (k + 1) * rb, aj + k + 1, lda, q);
      }
    }
    for (; k < len; ++k) {
      if (R > 1 && (k & 1) == 0) _mm_prefetch(codes + k * rb + kPrefetchBytes, _MM_HINT_T0);
      step<R, I4>(codes + k * rb, aj + k, lda, p);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 as = _mm256_set1_ps(asum[r * ldas + j]);
      for (int v = 0; v < 4; ++v) {
        const __m256 x = R == 1 ? _mm256_add_ps(p[r][v], q[r][v]) : p[r][v];
        float* cp = c + r * kQNR + 8 * v;
        __m256 acc = j ? _mm256_loadu_ps(cp) : _mm256_setzero_ps();
        acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(s + 8 * v), acc);
        acc = _mm256_fmadd_ps(as, _mm256_loadu_ps(s + kQNR + 8 * v), acc);
        _mm256_storeu_ps(cp, acc);
      }
    }
    panel += kQHeader + size_t(len) * rb;
  }
}

}  // namespace

void qkernel_avx2_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  (void)rows;  // one row (the table's mr)
  tile<1, false>(a, lda, asum, ldas, panel, groups, len, c);
}
void qkernel_avx2_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  (void)rows;
  tile<1, true>(a, lda, asum, ldas, panel, groups, len, c);
}

namespace {
template <bool I4> void dequant_block(const char* group, int64_t k0, int64_t kc, float* w) {
  constexpr int64_t rb = I4 ? kQNR / 2 : kQNR;
  const float* s = reinterpret_cast<const float*>(group);
  __m256 sv[4], mv[4];
  for (int v = 0; v < 4; ++v) {
    sv[v] = _mm256_loadu_ps(s + 8 * v);
    mv[v] = _mm256_loadu_ps(s + kQNR + 8 * v);
  }
  const char* codes = group + kQHeader + k0 * rb;
  for (int64_t k = 0; k < kc; ++k) {
    __m256 b[4];
    dequant<I4>(codes + k * rb, b);
    for (int v = 0; v < 4; ++v) _mm256_store_ps(w + k * kQNR + 8 * v, _mm256_fmadd_ps(b[v], sv[v], mv[v]));
  }
}

// Accumulators as named variables: GCC kept an array of them in memory, storing all twelve every
// k step (store-bound at a third of the FMA rate).
template <int R> void fma_tile(int64_t kc, const float* a, int64_t lda, const float* w, float* c) {
  __m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8), c02 = _mm256_loadu_ps(c + 16), c03 = _mm256_loadu_ps(c + 24);
  __m256 c10, c11, c12, c13, c20, c21, c22, c23;
  if constexpr (R > 1) {
    c10 = _mm256_loadu_ps(c + 32), c11 = _mm256_loadu_ps(c + 40), c12 = _mm256_loadu_ps(c + 48), c13 = _mm256_loadu_ps(c + 56);
  }
  if constexpr (R > 2) {
    c20 = _mm256_loadu_ps(c + 64), c21 = _mm256_loadu_ps(c + 72), c22 = _mm256_loadu_ps(c + 80), c23 = _mm256_loadu_ps(c + 88);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float* wk = w + k * kQNR;
    const __m256 b0 = _mm256_load_ps(wk), b1 = _mm256_load_ps(wk + 8), b2 = _mm256_load_ps(wk + 16), b3 = _mm256_load_ps(wk + 24);
    __m256 av = _mm256_broadcast_ss(a + k);
    c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01), c02 = _mm256_fmadd_ps(av, b2, c02), c03 = _mm256_fmadd_ps(av, b3, c03);
    if constexpr (R > 1) {
      av = _mm256_broadcast_ss(a + lda + k);
      c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11), c12 = _mm256_fmadd_ps(av, b2, c12), c13 = _mm256_fmadd_ps(av, b3, c13);
    }
    if constexpr (R > 2) {
      av = _mm256_broadcast_ss(a + 2 * lda + k);
      c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21), c22 = _mm256_fmadd_ps(av, b2, c22), c23 = _mm256_fmadd_ps(av, b3, c23);
    }
  }
  _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01), _mm256_storeu_ps(c + 16, c02), _mm256_storeu_ps(c + 24, c03);
  if constexpr (R > 1) {
    _mm256_storeu_ps(c + 32, c10), _mm256_storeu_ps(c + 40, c11), _mm256_storeu_ps(c + 48, c12), _mm256_storeu_ps(c + 56, c13);
  }
  if constexpr (R > 2) {
    _mm256_storeu_ps(c + 64, c20), _mm256_storeu_ps(c + 72, c21), _mm256_storeu_ps(c + 80, c22), _mm256_storeu_ps(c + 88, c23);
  }
}
}  // namespace

void qdequant_avx2_int8(const char* group, int64_t k0, int64_t kc, float* w) { dequant_block<false>(group, k0, kc, w); }
void qdequant_avx2_int4(const char* group, int64_t k0, int64_t kc, float* w) { dequant_block<true>(group, k0, kc, w); }
void qtile_avx2(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c) {
  switch (rows) {
    case 1: fma_tile<1>(kc, a, lda, w, c); break;
    case 2: fma_tile<2>(kc, a, lda, w, c); break;
    default: fma_tile<3>(kc, a, lda, w, c); break;
  }
}

}  // namespace ot::gemm::qdetail
