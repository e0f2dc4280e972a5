// AVX-512 VNNI kernel of the quantised grouped GEMM (layout: quant_internal.h) on int16 activations
// (bf16 / fp16 inputs), any row count up to the kernel's mr: a 64-byte load covers one int8 code
// pair row (32 columns x k, k + 1) or two int4 pair rows, the codes widen to int16 in 1-2 ops a
// vector and one vpdpwssd multiplies-and-accumulates 32 of them against an (a[k], a[k + 1]) pair.
// The widened codes serve every row of the tile (prefill and multi-token experts), so the decode of
// the codes is paid once per R rows. Per 64 int8 weights and row: 2 vpdpwssd + 1 broadcast (+3 ops
// shared by the rows), against 7 ops per 32 weights of the AVX2 kernel (which left decode on
// Zen 5 compute-bound at 57-70 GFLOP/s, 0.6-1.0x the bf16 row's time).
//
// Lane order: int8 low bytes give (int32 lane 8h + c) = column 16h + c, high bytes column
// 16h + 8 + c, put back in column order once per group (the fp32 partials); int4 interleaves the
// lanes of pair rows p and p + 1 (lanes 2c, 2c + 1: column 8t + c of nibble t), added exactly in
// int32 and put in column order once per 32-k block.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "src/gemm/quant_internal.h"

#include "src/gemm/vnni_target_begin.h"

namespace ot::gemm::qdetail {

namespace {

#define OT_QAI __attribute__((always_inline))
// The loops over rows, panels and accumulator sets must unroll for the accumulators to stay in
// registers (GCC 12 otherwise keeps the arrays on the stack: a store-forwarding chain a vpdpwssd).
#define OT_QUNROLL _Pragma("GCC unroll 8")

// c (+)= s * p + m * asum for one row, p in column order (columns 0-15, 16-31).
OT_QAI inline void close_group(const float* s, float asum, __m512 p0, __m512 p1, bool first, float* c) {
  const __m512 as = _mm512_set1_ps(asum);
  __m512 c0 = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c), c1 = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + 16);
  c0 = _mm512_fmadd_ps(p0, _mm512_loadu_ps(s), c0);
  c1 = _mm512_fmadd_ps(p1, _mm512_loadu_ps(s + 16), c1);
  c0 = _mm512_fmadd_ps(as, _mm512_loadu_ps(s + kQNR), c0);
  c1 = _mm512_fmadd_ps(as, _mm512_loadu_ps(s + kQNR + 16), c1);
  _mm512_storeu_ps(c, c0);
  _mm512_storeu_ps(c + 16, c1);
}

// acc += the int16 pair products of x and y (vpdpwssd) in acc's own register: GCC 12 copies the
// accumulator to a scratch register and back around each _mm512_dpwssd_epi32 (2 moves a product,
// which left the 4-row tile issue-bound at ~40% of the vpdpwssd rate).
OT_QAI inline void dp(__m512i& acc, __m512i x, __m512i y) { asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "vm"(y)); }

// The 512-bit halves of (x, y) in column order: [x lo256, y lo256] and [x hi256, y hi256].
OT_QAI inline __m512 lo_halves(__m512 x, __m512 y) { return _mm512_shuffle_f32x4(x, y, 0x44); }
OT_QAI inline __m512 hi_halves(__m512 x, __m512 y) { return _mm512_shuffle_f32x4(x, y, 0xEE); }

// R rows times P panels (QI16Args). P = 2 reads two panels side by side: two concurrent
// streams per thread (one stream leaves one-row decode at ~50 GB/s on two threads; the bf16 decode
// pair tile does the same, kernel_bf16_decode__avx512bf16.cpp).

// int8: S = 2 accumulator sets alternate over the pair rows when R * P = 1 (4 vpdpwssd chains).
template <int R, int P> void tile_int8(const QI16Args& o) {
  constexpr int S = R * P == 1 ? 2 : 1;
  const size_t pb = pair_bytes(WeightFormat::int8), gb = group_bytes(WeightFormat::int8, o.len);
  const int64_t nb = act_blocks(o.len);
  for (int64_t j = 0; j < o.groups; ++j) {
    // The group's fp32 partials in L1 (R up to 8: in registers they would crowd out the
    // accumulators), lane order: [0] = columns 0-7 and 16-23, [1] = 8-15 and 24-31.
    alignas(64) float part[P][R][2][16] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * kQABlock, pairs = (std::min(o.len, k0 + kQABlock) - k0 + 1) / 2;
      __m512i al[P][S][R], ah[P][S][R];
      OT_QUNROLL for (int q = 0; q < P; ++q)
        OT_QUNROLL for (int u = 0; u < S; ++u)
          OT_QUNROLL for (int r = 0; r < R; ++r) al[q][u][r] = ah[q][u][r] = _mm512_setzero_si512();
      const char* pr = o.panel + size_t(j) * gb + kQHeader + size_t(k0 / 2) * pb;
      const int16_t* ak = o.a16 + j * nb * kQABlock + k0;
      auto step = [&](int64_t p, int u) OT_QAI {
        __m512i lo[P], hi[P];
        OT_QUNROLL for (int q = 0; q < P; ++q) {
          const char* x0 = pr + q * o.panel_step + size_t(p) * pb;
          const __m512i x = _mm512_loadu_si512(x0);
          if (o.pf) _mm_prefetch(x0 + o.pf, _MM_HINT_T0);
          lo[q] = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 8);
          hi[q] = _mm512_srai_epi16(x, 8);
        }
        OT_QUNROLL for (int r = 0; r < R; ++r) {
          int32_t ap;
          std::memcpy(&ap, ak + r * o.lda + 2 * p, 4);
          const __m512i av = _mm512_set1_epi32(ap);  // (a[k], a[k + 1]) in every int32 lane
          OT_QUNROLL for (int q = 0; q < P; ++q) {
            dp(al[q][u][r], lo[q], av);
            dp(ah[q][u][r], hi[q], av);
          }
        }
      };
      int64_t p = 0;
      for (; p + S <= pairs; p += S)
        OT_QUNROLL for (int u = 0; u < S; ++u) step(p + u, u);
      for (; p < pairs; ++p) step(p, 0);
      OT_QUNROLL for (int r = 0; r < R; ++r) {
        const __m512 sc = _mm512_set1_ps(o.ascale[r * o.ldsc + j * nb + b]);
        OT_QUNROLL for (int q = 0; q < P; ++q) {
          __m512i l = al[q][0][r], h = ah[q][0][r];
          OT_QUNROLL for (int u = 1; u < S; ++u) l = _mm512_add_epi32(l, al[q][u][r]), h = _mm512_add_epi32(h, ah[q][u][r]);
          _mm512_store_ps(part[q][r][0], _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), sc, _mm512_load_ps(part[q][r][0])));
          _mm512_store_ps(part[q][r][1], _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), sc, _mm512_load_ps(part[q][r][1])));
        }
      }
    }
    OT_QUNROLL for (int q = 0; q < P; ++q) {
      const float* s = reinterpret_cast<const float*>(o.panel + q * o.panel_step + size_t(j) * gb);
      OT_QUNROLL for (int r = 0; r < R; ++r) {
        const __m512 pl = _mm512_load_ps(part[q][r][0]), ph = _mm512_load_ps(part[q][r][1]);
        close_group(s, o.asum[r * o.ldas + j], lo_halves(pl, ph), hi_halves(pl, ph), j == 0, o.c + q * o.ldcp + r * kQNR);
      }
    }
  }
}

// int4: each 64-byte load is two pair rows (p, p + 1), their int32 lanes interleaved by one permute
// (lane 2c: row p's lane c, 2c + 1: row p + 1's), so one 64-bit broadcast of a[k .. k + 3] serves
// both and the permute is paid once per load, not once per row. An odd last pair row loads only
// its own 32 bytes (its partner's activations are the block's zero padding). At the block's end
// the lane pairs are added exactly and put in column order.
template <int R, int P> void tile_int4(const QI16Args& o) {
  const size_t pb = pair_bytes(WeightFormat::int4), gb = group_bytes(WeightFormat::int4, o.len);
  const int64_t nb = act_blocks(o.len);
  const __m512i nib = _mm512_set1_epi16(0xF);
  const __m512i zip = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t j = 0; j < o.groups; ++j) {
    alignas(64) float part[P][R][2][16] = {};  // columns 0-15, 16-31 (in L1, as tile_int8's)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * kQABlock, pairs = (std::min(o.len, k0 + kQABlock) - k0 + 1) / 2;
      __m512i acc[P][R][4];
      OT_QUNROLL for (int q = 0; q < P; ++q)
        OT_QUNROLL for (int r = 0; r < R; ++r)
          OT_QUNROLL for (int t = 0; t < 4; ++t) acc[q][r][t] = _mm512_setzero_si512();
      const char* pr = o.panel + size_t(j) * gb + kQHeader + size_t(k0 / 2) * pb;
      const int16_t* ak = o.a16 + j * nb * kQABlock + k0;
      for (int64_t p = 0; p < pairs; p += 2) {
        __m512i n[P][4];
        OT_QUNROLL for (int q = 0; q < P; ++q) {
          const char* x0 = pr + q * o.panel_step + size_t(p) * pb;
          __m512i x = p + 1 < pairs ? _mm512_loadu_si512(x0) : _mm512_maskz_loadu_epi64(0x0F, x0);
          if (o.pf) _mm_prefetch(x0 + o.pf, _MM_HINT_T0);
          x = _mm512_permutexvar_epi32(zip, x);
          n[q][0] = _mm512_and_si512(x, nib);
          n[q][1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
          n[q][2] = _mm512_and_si512(_mm512_srli_epi16(x, 8), nib);
          n[q][3] = _mm512_srli_epi16(x, 12);
        }
        OT_QUNROLL for (int r = 0; r < R; ++r) {
          int64_t a4;  // a[k .. k + 3] of pair rows p, p + 1 (within the block's zero-padded 32 values)
          std::memcpy(&a4, ak + r * o.lda + 2 * p, 8);
          const __m512i av = _mm512_set1_epi64(a4);
          OT_QUNROLL for (int q = 0; q < P; ++q)
            OT_QUNROLL for (int t = 0; t < 4; ++t) dp(acc[q][r][t], n[q][t], av);
        }
      }
      OT_QUNROLL for (int r = 0; r < R; ++r) {
        const __m512 sc = _mm512_set1_ps(o.ascale[r * o.ldsc + j * nb + b]);
        OT_QUNROLL for (int q = 0; q < P; ++q) {
          // even lane 2c of acc[t] + odd lane 2c + 1: column 8t + c, added exactly
          __m512i e[4];
          OT_QUNROLL for (int t = 0; t < 4; ++t) e[t] = _mm512_add_epi32(acc[q][r][t], _mm512_srli_epi64(acc[q][r][t], 32));
          const __m512i c0 = _mm512_permutex2var_epi32(e[0], evens, e[1]), c1 = _mm512_permutex2var_epi32(e[2], evens, e[3]);
          _mm512_store_ps(part[q][r][0], _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), sc, _mm512_load_ps(part[q][r][0])));
          _mm512_store_ps(part[q][r][1], _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), sc, _mm512_load_ps(part[q][r][1])));
        }
      }
    }
    OT_QUNROLL for (int q = 0; q < P; ++q) {
      const float* s = reinterpret_cast<const float*>(o.panel + q * o.panel_step + size_t(j) * gb);
      OT_QUNROLL for (int r = 0; r < R; ++r)
        close_group(s, o.asum[r * o.ldas + j], _mm512_load_ps(part[q][r][0]), _mm512_load_ps(part[q][r][1]), j == 0, o.c + q * o.ldcp + r * kQNR);
    }
  }
}

template <bool I4, int R, int P> void tile_rows(const QI16Args& o) {
  if constexpr (I4) tile_int4<R, P>(o);
  else tile_int8<R, P>(o);
}

// Two panels side by side for one row (decode), else a panel at a time.
template <bool I4> void tile_any(int rows, int panels, const QI16Args& o) {
  if (panels == 2) {  // two panels side by side: the table's stream_rows (int8 4, int4 2)
    switch (rows) {
      case 1: return tile_rows<I4, 1, 2>(o);
      case 2: return tile_rows<I4, 2, 2>(o);
      default:
        if constexpr (!I4) {
          if (rows == 3) return tile_rows<I4, 3, 2>(o);
          if (rows == 4) return tile_rows<I4, 4, 2>(o);
        }
    }
  }
  for (int q = 0; q < panels; ++q) {
    QI16Args one = o;
    one.panel += q * o.panel_step;
    one.c += q * o.ldcp;
    switch (rows) {
      case 1: tile_rows<I4, 1, 1>(one); break;
      case 2: tile_rows<I4, 2, 1>(one); break;
      case 3: tile_rows<I4, 3, 1>(one); break;
      case 4: tile_rows<I4, 4, 1>(one); break;
      default:
        if constexpr (!I4) {  // int8 tiles up to 8 rows (int4: 4; 6 rows spilled and ran 10-15% slower)
          switch (rows) {
            case 5: tile_rows<I4, 5, 1>(one); break;
            case 6: tile_rows<I4, 6, 1>(one); break;
            case 7: tile_rows<I4, 7, 1>(one); break;
            default: tile_rows<I4, 8, 1>(one); break;
          }
        } else {
          tile_rows<I4, 4, 1>(one);
        }
    }
  }
}

}  // namespace

void qkernel_avx512vnni_int8_i16(const QI16Args& g) { tile_any<false>(g.rows, g.panels, g); }
void qkernel_avx512vnni_int4_i16(const QI16Args& g) { tile_any<true>(g.rows, g.panels, g); }


// The activations' int16 blocks (QActI16Fn, quant_internal.h), the same bits as the scalar form:
// the same fp32 products, round to nearest even (MXCSR's default, as lrint), an exact int32 sum.
float qact_i16_avx512(const float* a, int64_t len, int16_t* q, float* scale) {
  double total = 0;
  for (int64_t k0 = 0, b = 0; k0 < len; k0 += kQABlock, ++b) {
    const int64_t n = std::min<int64_t>(kQABlock, len - k0);
    alignas(64) float tail[kQABlock];  // a partial block, zero-padded (whole blocks are read in place)
    const float* x = a + k0;
    if (n < kQABlock) {
      std::fill(std::copy(x, x + n, tail), tail + kQABlock, 0.f);
      x = tail;
    }
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const __mmask16 bad = _mm512_fpclass_ps_mask(x0, 0x99) | _mm512_fpclass_ps_mask(x1, 0x99);  // NaN or +-Inf
    if (bad) {
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      _mm512_storeu_si512(q + k0, _mm512_setzero_si512());
      total += 0.0 * double(scale[b]);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 32767.f / amax : 0.f);
    scale[b] = amax / 32767.f;
    const __m512i lim = _mm512_set1_epi32(32767), nlim = _mm512_set1_epi32(-32767);
    const __m512i y0 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), lim), nlim);
    const __m512i y1 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, inv)), lim), nlim);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0), _mm512_cvtepi32_epi16(y0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0 + 16), _mm512_cvtepi32_epi16(y1));
    total += double(_mm512_reduce_add_epi32(_mm512_add_epi32(y0, y1))) * double(scale[b]);
  }
  return float(total);
}

}  // namespace ot::gemm::qdetail

#include "src/gemm/vnni_target_end.h"
