// AVX-512 VNNI kernel of the W8A8 grouped GEMM (layout: quant_internal.h, "W8A8"): R <= 12 rows x
// 32 columns a call (R <= 4: optionally two panels side by side, two memory streams). Per quad row (4 k x 32 columns, 128 bytes) and row: two vpdpbusd, each taking
// the row's 4 int8 codes as an embedded 32-bit broadcast against the 64 unsigned weight bytes of a
// block, i.e. 64 multiply-adds an instruction (vpdpwssd, the weight-only path's, does 32). The two
// weight vectors serve every row of the tile; 24 int32 accumulators cover the vpdpbusd latency.
#include <immintrin.h>

#include "src/gemm/quant_internal.h"

#include "src/gemm/vnni_target_begin.h"

namespace ot::gemm::qdetail {

namespace {

#define OT_A8I __attribute__((always_inline))

// acc += the 4-byte products of the unsigned weight bytes w and the row's 4 signed codes at a,
// broadcast to every lane; in acc's own register (GCC 12 otherwise copies it around the intrinsic).
OT_A8I inline void dpbusd_bcast(__m512i& acc, __m512i w, const int32_t* a) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*a));
}

// Software prefetch distance in bytes: 1024 ran prefill tiles at 1.02-1.07x the rate of none
// (Zen 5), 2048 no better; few-row tiles stream from memory and want it further ahead.
constexpr int64_t prefetch_distance(int rows) { return rows <= 4 ? 4096 : 1024; }

template <int R, int P>
void a8_rows(const QA8Args& g) {
  const int64_t lenp = a8_len(g.len), quads = lenp / kA8Quad;
  constexpr int64_t kPrefetch = prefetch_distance(R);
  for (int64_t j = 0; j < g.groups; ++j) {
    const size_t off = size_t(j) * a8_group_bytes(g.len);
    const char* codes[P];
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) codes[p] = g.panel + p * g.panel_step + off + kQHeader;
    const int8_t* a = g.a + j * lenp;
    __m512i acc[P][R][2];
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) acc[p][r][0] = acc[p][r][1] = _mm512_setzero_si512();
    for (int64_t q = 0; q < quads; ++q) {
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        const char* w = codes[p] + q * kA8QuadBytes;
        const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
        _mm_prefetch(w + kPrefetch, _MM_HINT_T0);
        _mm_prefetch(w + kPrefetch + 64, _MM_HINT_T0);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const int32_t* ar = reinterpret_cast<const int32_t*>(a + r * g.lda + q * kA8Quad);
          dpbusd_bcast(acc[p][r][0], w0, ar);
          dpbusd_bcast(acc[p][r][1], w1, ar);
        }
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const float* s = reinterpret_cast<const float*>(codes[p] - kQHeader);
      const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16), m0 = _mm512_loadu_ps(s + kQNR), m1 = _mm512_loadu_ps(s + kQNR + 16);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        // The stored codes are q + 128: sum a * q = acc - 128 * sum a (exact in int32).
        const int32_t as = g.asum[r * g.ldas + j];
        const __m512i corr = _mm512_set1_epi32(as * 128);
        const __m512 p0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[p][r][0], corr)), p1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[p][r][1], corr));
        const __m512 asf = _mm512_set1_ps(float(as)), sc = _mm512_set1_ps(g.ascale[r]);
        float* c = g.c + p * g.ldcp + r * kQNR;
        const __m512 v0 = _mm512_fmadd_ps(p0, s0, _mm512_mul_ps(asf, m0)), v1 = _mm512_fmadd_ps(p1, s1, _mm512_mul_ps(asf, m1));
        const __m512 c0 = j ? _mm512_loadu_ps(c) : _mm512_setzero_ps(), c1 = j ? _mm512_loadu_ps(c + 16) : _mm512_setzero_ps();
        _mm512_storeu_ps(c, _mm512_fmadd_ps(sc, v0, c0));
        _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(sc, v1, c1));
      }
    }
  }
}

using RowsFn = void (*)(const QA8Args&);
constexpr RowsFn kRows[] = {a8_rows<1, 1>, a8_rows<2, 1>, a8_rows<3, 1>, a8_rows<4, 1>,  a8_rows<5, 1>,  a8_rows<6, 1>,
                            a8_rows<7, 1>, a8_rows<8, 1>, a8_rows<9, 1>, a8_rows<10, 1>, a8_rows<11, 1>, a8_rows<12, 1>};
constexpr RowsFn kRows2[] = {a8_rows<1, 2>, a8_rows<2, 2>, a8_rows<3, 2>, a8_rows<4, 2>};

}  // namespace

void qkernel_avx512vnni_a8(const QA8Args& g) {
  if (g.rows <= 0) return;
  if (g.panels == 2) kRows2[g.rows - 1](g);
  else kRows[g.rows - 1](g);
}

}  // namespace ot::gemm::qdetail

#include "src/gemm/vnni_target_end.h"
