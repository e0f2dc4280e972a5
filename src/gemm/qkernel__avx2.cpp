// AVX2 kernels of the quantised grouped GEMM (layout: quant_internal.h), 32 columns (4 ymm) a panel.
// - bf16 / fp16 activations, one row (decode): the activations come as int16 (per-32-block scale),
//   so a code pair row multiplies in vpmaddwd: int4 nibbles need a shift and a mask per 8 columns,
//   int8 bytes a shift pair; 16 pairs sum exactly in int32, then take the block's scale in fp32.
//   Per 64 weights ~16 instructions, against ~34 for widening every code to fp32 (which left the
//   int4 decode compute-bound at ~60 GFLOP/s on 2 threads, AMD EPYC AVX2-only VM).
// - fp32 activations, one row: codes widen to fp32 in registers (a shift pair or shift and mask per
//   8 columns, vcvtdq2ps), FMAs for the pair's two k; each K group's partial sums take the group's
//   scale and the offset term once at the group's end, into the fp32 tile c (which stays in L1).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "src/gemm/quant_internal.h"

namespace ot::gemm::qdetail {

namespace {

constexpr int64_t kPrefetchBytes = 1024;  // ahead of the code stream (decode reads each panel once)

// The fp32 weights of one pair row: w0 = row k, w1 = row k + 1, 8 columns 8v..8v+7 each.
template <bool I4> __attribute__((always_inline)) inline void widen_pair(const char* pair, __m256 w0[4], __m256 w1[4]) {
  if constexpr (I4) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair));
    const __m256i lo = _mm256_set1_epi32(0xF);
    // int32 lane c: bits 4t.. of its low half = (k, 8t + c), of its high half = (k + 1, 8t + c).
    w0[0] = _mm256_cvtepi32_ps(_mm256_and_si256(x, lo));
    w0[1] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 4), lo));
    w0[2] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 8), lo));
    w0[3] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 12), lo));
    w1[0] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 16), lo));
    w1[1] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 20), lo));
    w1[2] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 24), lo));
    w1[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 28));
  } else {
    for (int h = 0; h < 2; ++h) {
      // int32 lane c, bytes: (k, 16h + c), (k, 16h + 8 + c), (k + 1, 16h + c), (k + 1, 16h + 8 + c).
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair + 32 * h));
      w0[2 * h] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 24), 24));
      w0[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 24));
      w1[2 * h] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 8), 24));
      w1[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_srai_epi32(x, 24));
    }
  }
}

// c (+)= s * partial + m * asum for the group whose header is s (the tile c stays in L1).
__attribute__((always_inline)) inline void close_group(const float* s, float asum, const __m256 part[4], bool first, float* c) {
  const __m256 as = _mm256_set1_ps(asum);
  for (int v = 0; v < 4; ++v) {
    __m256 acc = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 8 * v);
    acc = _mm256_fmadd_ps(part[v], _mm256_loadu_ps(s + 8 * v), acc);
    acc = _mm256_fmadd_ps(as, _mm256_loadu_ps(s + kQNR + 8 * v), acc);
    _mm256_storeu_ps(c + 8 * v, acc);
  }
}

// fp32 activations, one row: two partial sets (even and odd k) hide the FMA latency.
template <bool I4> void tile_f32(const float* a, const float* asum, const char* panel, int64_t groups, int64_t len, float* c) {
  const WeightFormat f = I4 ? WeightFormat::int4 : WeightFormat::int8;
  const size_t pb = pair_bytes(f);
  for (int64_t j = 0; j < groups; ++j) {
    const float* s = reinterpret_cast<const float*>(panel);
    const char* codes = panel + kQHeader;
    const float* aj = a + j * len;
    __m256 p[4], q[4];
    for (int v = 0; v < 4; ++v) p[v] = q[v] = _mm256_setzero_ps();
    for (int64_t k = 0; k < len; k += 2) {
      const char* pair = codes + size_t(k / 2) * pb;
      _mm_prefetch(pair + kPrefetchBytes, _MM_HINT_T0);
      __m256 w0[4], w1[4];
      widen_pair<I4>(pair, w0, w1);
      const __m256 a0 = _mm256_broadcast_ss(aj + k), a1 = k + 1 < len ? _mm256_broadcast_ss(aj + k + 1) : _mm256_setzero_ps();
      for (int v = 0; v < 4; ++v) {
        p[v] = _mm256_fmadd_ps(a0, w0[v], p[v]);
        q[v] = _mm256_fmadd_ps(a1, w1[v], q[v]);
      }
    }
    for (int v = 0; v < 4; ++v) p[v] = _mm256_add_ps(p[v], q[v]);
    close_group(s, asum[j], p, j == 0, c);
    panel += group_bytes(f, len);
  }
}

// int16 activations, one row (see the file comment).
template <bool I4>
void tile_i16(const int16_t* a16, const float* ascale, const float* asum, const char* panel, int64_t groups, int64_t len, float* c) {
  const WeightFormat f = I4 ? WeightFormat::int4 : WeightFormat::int8;
  const size_t pb = pair_bytes(f);
  const int64_t nb = act_blocks(len);
  const __m256i nib = _mm256_set1_epi16(0xF);
  for (int64_t j = 0; j < groups; ++j) {
    const float* s = reinterpret_cast<const float*>(panel);
    const char* codes = panel + kQHeader;
    const int16_t* aj = a16 + j * nb * kQABlock;
    __m256 part[4];
    for (int v = 0; v < 4; ++v) part[v] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * kQABlock, pairs = (std::min(len, k0 + kQABlock) - k0 + 1) / 2;
      __m256i acc[4];
      for (int v = 0; v < 4; ++v) acc[v] = _mm256_setzero_si256();
      for (int64_t p = 0; p < pairs; ++p) {
        const char* pair = codes + size_t(k0 / 2 + p) * pb;
        if (!I4 || (p & 1) == 0) _mm_prefetch(pair + kPrefetchBytes, _MM_HINT_T0);
        int32_t ap;
        std::memcpy(&ap, aj + k0 + 2 * p, 4);
        const __m256i av = _mm256_set1_epi32(ap);  // (a[k], a[k + 1]) in every int32 lane
        if constexpr (I4) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair));
          acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(_mm256_and_si256(x, nib), av));
          acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), nib), av));
          acc[2] = _mm256_add_epi32(acc[2], _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 8), nib), av));
          acc[3] = _mm256_add_epi32(acc[3], _mm256_madd_epi16(_mm256_srli_epi16(x, 12), av));
        } else {
          for (int h = 0; h < 2; ++h) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair + 32 * h));
            acc[2 * h] = _mm256_add_epi32(acc[2 * h], _mm256_madd_epi16(_mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8), av));
            acc[2 * h + 1] = _mm256_add_epi32(acc[2 * h + 1], _mm256_madd_epi16(_mm256_srai_epi16(x, 8), av));
          }
        }
      }
      const __m256 sc = _mm256_set1_ps(ascale[j * nb + b]);
      for (int v = 0; v < 4; ++v) part[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[v]), sc, part[v]);
    }
    close_group(s, asum[j], part, j == 0, c);
    panel += group_bytes(f, len);
  }
}

}  // namespace

void qkernel_avx2_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  (void)rows, (void)lda, (void)ldas;  // one row (the table's mr)
  tile_f32<false>(a, asum, panel, groups, len, c);
}
void qkernel_avx2_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c) {
  (void)rows, (void)lda, (void)ldas;
  tile_f32<true>(a, asum, panel, groups, len, c);
}
void qkernel_avx2_int8_i16(const QI16Args& g) {  // one row (the table's i16_mr)
  for (int q = 0; q < g.panels; ++q) tile_i16<false>(g.a16, g.ascale, g.asum, g.panel + q * g.panel_step, g.groups, g.len, g.c + q * g.ldcp);
}
void qkernel_avx2_int4_i16(const QI16Args& g) {  // one row (the table's i16_mr)
  for (int q = 0; q < g.panels; ++q) tile_i16<true>(g.a16, g.ascale, g.asum, g.panel + q * g.panel_step, g.groups, g.len, g.c + q * g.ldcp);
}

namespace {
template <bool I4> void dequant_block(const char* group, int64_t k0, int64_t kc, float* w) {
  const size_t pb = pair_bytes(I4 ? WeightFormat::int4 : WeightFormat::int8);
  const float* s = reinterpret_cast<const float*>(group);
  __m256 sv[4], mv[4];
  for (int v = 0; v < 4; ++v) {
    sv[v] = _mm256_loadu_ps(s + 8 * v);
    mv[v] = _mm256_loadu_ps(s + kQNR + 8 * v);
  }
  // k0 is even (kQKC is): whole pair rows; an odd kc leaves the last pair's second row unwritten.
  const char* codes = group + kQHeader + size_t(k0 / 2) * pb;
  for (int64_t k = 0; k < kc; k += 2) {
    __m256 w0[4], w1[4];
    widen_pair<I4>(codes + size_t(k / 2) * pb, w0, w1);
    for (int v = 0; v < 4; ++v) _mm256_store_ps(w + k * kQNR + 8 * v, _mm256_fmadd_ps(w0[v], sv[v], mv[v]));
    if (k + 1 < kc)
      for (int v = 0; v < 4; ++v) _mm256_store_ps(w + (k + 1) * kQNR + 8 * v, _mm256_fmadd_ps(w1[v], sv[v], mv[v]));
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


// The activations' int16 blocks (QActI16Fn, quant_internal.h), the same bits as the scalar form:
// the same fp32 products, round to nearest even (MXCSR's default, as lrint), an exact int32 sum.
float qact_i16_avx2(const float* a, int64_t len, int16_t* q, float* scale) {
  double total = 0;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t k0 = 0, b = 0; k0 < len; k0 += kQABlock, ++b) {
    const int64_t n = std::min<int64_t>(kQABlock, len - k0);
    alignas(32) float tail[kQABlock];  // a partial block, zero-padded (whole blocks are read in place)
    const float* x = a + k0;
    if (n < kQABlock) {
      std::fill(std::copy(x, x + n, tail), tail + kQABlock, 0.f);
      x = tail;
    }
    __m256 v[4], mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      const __m256 d = _mm256_sub_ps(v[i], v[i]);  // NaN for NaN and +-Inf
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    if (_mm256_movemask_ps(bad)) {
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0), _mm256_setzero_si256());
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0 + 16), _mm256_setzero_si256());
      total += 0.0 * double(scale[b]);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 32767.f / amax : 0.f);
    scale[b] = amax / 32767.f;
    const __m256i lim = _mm256_set1_epi32(32767), nlim = _mm256_set1_epi32(-32767);
    __m256i y[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      y[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)), lim), nlim);
      sum = _mm256_add_epi32(sum, y[i]);
    }
    for (int h = 0; h < 2; ++h)  // packs interleaves the 128-bit halves; the permute restores the order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0 + 16 * h), _mm256_permute4x64_epi64(_mm256_packs_epi32(y[2 * h], y[2 * h + 1]), 0xD8));
    alignas(32) int32_t s8[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s8), sum);
    int32_t isum = 0;
    for (int i = 0; i < 8; ++i) isum += s8[i];
    total += double(isum) * double(scale[b]);
  }
  return float(total);
}

}  // namespace ot::gemm::qdetail
