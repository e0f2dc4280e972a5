// AVX2 kernels of the quantised grouped GEMM (layout: quant_internal.h): up to 3 rows x 32 columns
// (4 ymm per row). Codes widen to int32 lanes (vpmovsxbd / vpmovzxbd + nibble mask or shift) and
// convert to fp32 in registers; each K group's partial sums take the group's scale and the offset
// term once at the group's end, into the fp32 tile c (which stays in L1). One row runs two partial
// sets over even and odd k, so eight independent FMA chains hide the FMA latency.
#include <immintrin.h>

#include "src/gemm/quant_internal.h"

namespace ot::gemm::qdetail {

namespace {

constexpr int64_t kPrefetchBytes = 1024;  // ahead of the code stream (decode reads each panel once)

template <bool I4> inline void dequant(const char* row, __m256 b[4]) {
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

template <int R, bool I4>
void tile(const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len, float* c) {
  constexpr int U = R == 1 ? 2 : 1;
  constexpr int64_t rb = I4 ? kQNR / 2 : kQNR;
  for (int64_t j = 0; j < groups; ++j) {
    const float* s = reinterpret_cast<const float*>(panel);
    const char* codes = panel + kQHeader;
    const float* aj = a + j * len;
    __m256 p[U][R][4];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) p[u][r][v] = _mm256_setzero_ps();
    auto step = [&](int u, int64_t k) {
      __m256 b[4];
      dequant<I4>(codes + k * rb, b);
      for (int r = 0; r < R; ++r) {
        const __m256 av = _mm256_broadcast_ss(aj + r * lda + k);
        for (int v = 0; v < 4; ++v) p[u][r][v] = _mm256_fmadd_ps(av, b[v], p[u][r][v]);
      }
    };
    int64_t k = 0;
    for (; k + U <= len; k += U) {
      _mm_prefetch(codes + k * rb + kPrefetchBytes, _MM_HINT_T0);
      for (int u = 0; u < U; ++u) step(u, k + u);
    }
    for (; k < len; ++k) step(0, k);
    for (int r = 0; r < R; ++r) {
      const __m256 as = _mm256_set1_ps(asum[r * ldas + j]);
      for (int v = 0; v < 4; ++v) {
        __m256 x = p[0][r][v];
        if constexpr (U == 2) x = _mm256_add_ps(x, p[1][r][v]);
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

template <bool I4>
void run(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len, float* c) {
  switch (rows) {
    case 1: tile<1, I4>(a, lda, asum, ldas, panel, groups, len, c); break;
    case 2: tile<2, I4>(a, lda, asum, ldas, panel, groups, len, c); break;
    default: tile<3, I4>(a, lda, asum, ldas, panel, groups, len, c); break;
  }
}

}  // namespace

void qkernel_avx2_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  run<false>(rows, a, lda, asum, ldas, panel, groups, len, c);
}
void qkernel_avx2_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  run<true>(rows, a, lda, asum, ldas, panel, groups, len, c);
}

}  // namespace ot::gemm::qdetail
