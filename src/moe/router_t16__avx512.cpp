// Routers, AVX-512 with 16 tokens in the lanes ("t16"), for the softmax routers that select on the
// logits. The row passes stay row-wise (loads, column maxima, exps and their sums, candidate ids
// compressed as bytes); everything that was a horizontal step or a lane network per row is done
// once for 16 rows with a token per lane:
// - the 16 rows' column maxima are transposed (16x16) and sorted per lane by a vertical network
//   (Batcher, pruned to the outputs needed): lane i of output 0 is row i's max, of output k-1 its
//   top-k threshold (the k-th largest column maximum: k distinct elements reach it);
// - the exp sums are reduced by one transposing tree for the 16 rows;
// - the candidates' byte ids (n <= 16 a row) are transposed by two-source byte permutes, their
//   values read (E <= 128: two-source permutes of each row's vectors, one transpose; else gathered),
//   and each (value, id) pair becomes one 64-bit key (order-preserving value bits
//   high, 255 - id low: ties go to the lower id exactly, no tie checks), sorted per lane by the
//   pruned network;
// - the weights of the k chosen are k vertical exps for the 16 rows, transposed back to rows.
// Partial blocks go to the row kernel.
#include "src/moe/router_lane_counts.h"
#include "src/moe/router_t16__avx512.h"

#include "src/moe/router_vbmi_begin.h"

namespace ot::moe::impl {
using namespace rsimd;
using namespace t16;
namespace {

// K > 0: k == K (networks pruned at compile time); 0: any k <= 16 (whole networks).
template <int NV, bool Direct, int K>
bool t16_rows(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  constexpr int Live = K > 0 ? K : 16;
  const int64_t E = 16 * NV, k = s.k;
  const DType xt = s.x.dtype;
  const size_t row_bytes = size_t(E) * dtype_size(xt);
  // Softmax over all experts (its sum is needed) unless the weights are a softmax over the k chosen.
  const bool softmax = s.select != Select::topk_softmax;
  const float mul = s.select == Select::gating ? s.scale : 1.f;
  const __m512 l2e = _mm512_set1_ps(kLog2e), zero = _mm512_setzero_ps();
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i jr = _mm512_mullo_epi32(iota, _mm512_set1_epi32(int32_t(s.R)));
  float* copy = Direct ? nullptr : b.xr;  // fp32 copies of a block's bf16 / fp16 rows (16 rows, stride E = b.stride)
  alignas(64) uint8_t cb[16 * 16 + 256 + 64];
  alignas(64) float mxa[16], tha[16];
  alignas(64) int32_t ncand[16];
  for (int64_t rb = r0; rb + 16 <= r1; rb += 16) {
    const char* xb = static_cast<const char*>(s.x.data) + size_t(rb) * row_bytes;
    const float* xf = Direct ? reinterpret_cast<const float*>(xb) : copy;
    // Pass 1: column maxima, the fp32 copy, finiteness (x * 0 is NaN exactly for NaN / +-Inf; a
    // chain a row, so pass 2 has no check: softmax E 128 b/a 0.94-0.99, AMD Zen 5 VM, 2026-12-01).
    __m512 cm[16], nonfinite = zero;
    for (int i = 0; i < 16; ++i) {
      const char* xp = xb + size_t(i) * row_bytes;
      if (rb + 32 <= s.R)
        for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(xp + 16 * row_bytes + o, _MM_HINT_T0);
      __m512 c = _mm512_set1_ps(kNegInf), nf = zero;
      for (int v = 0; v < NV; ++v) {
        const __m512 x = load16(xp, xt, 16 * v, 0xffff);
        if (!Direct) _mm512_storeu_ps(copy + i * E + 16 * v, x);
        nf = _mm512_fmadd_ps(x, zero, nf);
        c = _mm512_max_ps(c, x);
      }
      nonfinite = _mm512_add_ps(nonfinite, nf);
      cm[i] = c;
    }
    // Row maxima and thresholds, per lane.
    transpose16(cm);
    sort_lanes<Live>(cm);
    if (_mm512_cmp_ps_mask(nonfinite, zero, _CMP_UNORD_Q)) return false;  // check_rows names the row
    const __mmask16 huge = exp_offset_too_large(cm[0]);  // rows redone by the scalar row below
    _mm512_store_ps(mxa, cm[0]);
    if constexpr (K > 0) {
      _mm512_store_ps(tha, cm[K - 1]);
    } else {
      alignas(64) float all[16 * 16];
      for (int j = 0; j < 16; ++j) _mm512_store_ps(all + 16 * j, cm[j]);
      std::copy(all + 16 * (k - 1), all + 16 * k, tha);
    }
    const __m512 mx = cm[0];
    // Pass 2: exps and their sums; the candidates' ids (bytes) at cb + 16 i: a row's stores run
    // past its 16 bytes into the next rows', which are written after it.
    __m512 psum[16];
    for (int i = 0; i < 16; ++i) {
      const float* x = xf + i * E;
      const __m512 th = _mm512_set1_ps(tha[i]);
      __mmask16 m[NV];
      if (softmax) {
        const __m512 ml = _mm512_set1_ps(mxa[i] * kLog2e);
        __m512 vs = zero, vs2 = zero;
        for (int v = 0; v < NV; ++v) {
          const __m512 xv = _mm512_loadu_ps(x + 16 * v);
          m[v] = _mm512_cmp_ps_mask(xv, th, _CMP_GE_OQ);
          const __m512 e = exp2_ps(_mm512_fmsub_ps(xv, l2e, ml));  // t below the fp32 range: -inf, e = 0
          if (v & 1) vs2 = _mm512_add_ps(vs2, e); else vs = _mm512_add_ps(vs, e);
        }
        psum[i] = _mm512_add_ps(vs, vs2);
      } else {
        for (int v = 0; v < NV; ++v) m[v] = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + 16 * v), th, _CMP_GE_OQ);
      }
      ncand[i] = compress_ids_bytes(m, NV, cb + 16 * i);
    }
    __m512 scale = _mm512_set1_ps(mul);
    if (softmax) scale = _mm512_div_ps(scale, reduce16_add(psum));  // sums in [0.5, 2 E] (but the huge rows)
    const __m512i nc = _mm512_load_si512(ncand);
    const __mmask16 slow = _mm512_cmpgt_epi32_mask(nc, _mm512_set1_epi32(16));
    __m512i sid[16];
    __m512 sval[16];
    select16<Live, NV>(cb, nc, slow, xf, E, k, sid, sval);
    // The k chosen per lane, their weights, back to rows.
    __m512 w[16], ids[16];
    __m512 esum = zero, e0 = zero;
    for (int j = 0; j < 16; ++j) {
      if (j >= k) { w[j] = zero; ids[j] = zero; continue; }
      const __m512 v = sval[j];
      ids[j] = _mm512_castsi512_ps(sid[j]);
      if (j == 0) e0 = softmax ? mx : v;  // topk_softmax: a softmax over the k chosen (v0 is their max)
      w[j] = exp2_ps(_mm512_fmsub_ps(v, l2e, _mm512_mul_ps(e0, l2e)));
      esum = _mm512_add_ps(esum, w[j]);
    }
    if (!softmax) scale = _mm512_div_ps(scale, esum);
    scale_and_transpose(ids, w, k, scale);
    if constexpr (K == 8) {
      write_pairs8(s, r, rb, ids, w);  // (the rows of many candidates are rewritten below)
    } else {
      for (int i = 0; i < 16; ++i) {
        if (slow >> i & 1) continue;
        const int64_t row = rb + i;
        write_row16(s, r, row, _mm512_castps_si512(ids[i]), w[i], row * k + 16 <= r1 * k, jr);
      }
    }
    // Rows of more than 16 candidates (~0.4% of random rows at E 128, k 8): their top k by an
    // insertion over the candidates (in expert order; strict '>' keeps the lower id first), stored
    // masked (the next rows are written already).
    if (slow) {
      alignas(64) float sca[16];
      _mm512_store_ps(sca, scale);
      for (uint32_t m = slow; m; m &= m - 1) {
        const int i = __builtin_ctz(m);
        const float* x = xf + i * E;
        alignas(64) float kv[16];
        alignas(64) int32_t ki[16];
        many_candidates_topk(x, NV, tha[i], int(k), kv, ki);
        const __mmask16 mk = lanes(k);
        __m512 e = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(_mm512_maskz_load_ps(mk, kv), l2e, _mm512_set1_ps((softmax ? mxa[i] : kv[0]) * kLog2e))));
        e = _mm512_mul_ps(e, _mm512_set1_ps(softmax ? sca[i] : mul / sum_in_order(e, k)));
        write_row16(s, r, rb + i, _mm512_maskz_load_epi32(mk, ki), e, false, jr);
      }
    }
    for (uint32_t m = huge; m; m &= m - 1) route_row_scalar(s, r, rb + __builtin_ctz(m), b);  // last: it uses b.xr
  }
  return true;
}

template <int NV> bool t16_dispatch(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return with_direct_and_k(s, [&](auto direct, auto k) { return t16_rows<NV, decltype(direct)::value, decltype(k)::value>(s, r, r0, r1, b); });
}

}  // namespace
}  // namespace ot::moe::impl

namespace ot::moe::impl {

bool t16_applies(const RouterSpec& s) {
  return has_vbmi_and_vbmi2() && s.k <= 16 && !s.sigmoid && select_on_logits(s) && !limits_groups(s) && !s.allowed && !s.scores && lanes_kernel_for<16>(s.E);
}

bool route_rows_t16(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return whole_blocks_then_rows(s, r, r0, r1, b, [&](int64_t a, int64_t e) {
    return with_lane_vectors<16>(s.E, [&](auto nv) { return t16_dispatch<decltype(nv)::value>(s, r, a, e, b); });
  });
}

}  // namespace ot::moe::impl
#include "src/moe/router_vbmi_end.h"
