// Routers, AVX2 with 8 tokens in the lanes ("t8"), for the softmax routers that select on the
// logits (no mask, bias, groups or scores output; E one of router_lane_counts.h, k <= 8). The row
// passes stay row-wise (loads, finiteness, 16 column maxima; exps, their sums and the candidates'
// compare masks); every step that was horizontal or a per-row network in the row kernel
// (router__avx2.cpp) is done once for 8 rows with a token per lane:
// - the 8 rows' 16 column maxima are transposed (two 8x8) and sorted per lane by a pruned Batcher
//   network: lane i of output 0 is row i's max, of output k-1 its threshold (the k-th largest
//   maximum of disjoint expert sets: k distinct experts reach it);
// - the exp sums are reduced by one transposing hadd tree;
// - the candidates (>= the threshold, at most 16 a row, in expert order: a bitmask) go to slot-major
//   slots and are inserted per lane into k sorted (value, id) registers; strict '>' over slots in expert order
//   keeps the lower expert id first on ties, the scalar row's order;
// - the k chosen weights are k vertical exps, transposed back to rows.
// Rows it does not decide (more than 16 candidates; |max| >= kExpOffsetLimit) go to the row kernel;
// a last partial block runs on zero-padded copies of its rows (the padding is never written out).
#include <algorithm>

#include "src/moe/router_t8__avx2.h"

namespace ot::moe::impl {
namespace {

// One block of 8 rows from rb (the first `rows` real; x: rows of E fp32 floats, `ld` apart; pf:
// prefetch the 8 rows after them).
// Returns false when some row is not finite (nothing decided: the entry point checks every row).
template <int NV>
bool t8_block(const RouterSpec& s, GatingResult& r, int64_t rb, int rows, const float* x, int64_t ld, bool pf, RouterScratch& b) {
  const int k = int(s.k);
  const bool softmax = s.select != Select::topk_softmax;  // else a softmax over the k chosen only
  const __m256 ninf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps(), l2e = _mm256_set1_ps(kLog2e);
  // Pass 1: 16 column maxima a row (even / odd vectors; NV 1: the 8 logits and -inf), finiteness
  // (x * 0 is NaN exactly for NaN / +-Inf).
  __m256 cm[16], nonfinite = zero;
  for (int i = 0; i < 8; ++i) {
    const float* p = x + i * ld;
    if (pf)  // the next block's row (at T 16384 the loads of this pass were ~1/5 of the samples)
      for (int o = 0; o < NV * 32; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * ld) + o, _MM_HINT_T0);
    __m256 c0 = ninf, c1 = ninf, nf = zero;
    for (int v = 0; v < NV; ++v) {
      const __m256 xv = _mm256_loadu_ps(p + 8 * v);
      nf = _mm256_fmadd_ps(xv, zero, nf);
      if (v & 1) c1 = _mm256_max_ps(c1, xv); else c0 = _mm256_max_ps(c0, xv);
    }
    nonfinite = _mm256_add_ps(nonfinite, nf);
    cm[i] = c0;
    cm[8 + i] = c1;
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(nonfinite, nonfinite, _CMP_UNORD_Q))) return false;
  simd::transpose8x8(cm);
  simd::transpose8x8(cm + 8);
  sort_lanes<8>(cm);
  alignas(32) float mxa[8], tha[8];
  _mm256_store_ps(mxa, cm[0]);
  _mm256_store_ps(tha, cm[k - 1]);
  const __m256 mx = cm[0];
  const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), mx), _mm256_set1_ps(kExpOffsetLimit), _CMP_GE_OQ);
  const unsigned real = (1u << rows) - 1;
  unsigned redo = unsigned(_mm256_movemask_ps(big)) & real;  // rows for the row kernel
  // Pass 2: exps and their sums (softmax over all experts), the candidates >= the threshold as a
  // bitmask, then into the slots.
  Slots sl;
  __m256 psum[8];
  for (int i = 0; i < 8; ++i) {
    psum[i] = _mm256_set1_ps(1.f);  // (rows not decided here)
    if (!decided(i, real, redo)) continue;
    const float* p = x + i * ld;
    const __m256 th = _mm256_set1_ps(tha[i]), ml = _mm256_set1_ps(mxa[i] * kLog2e);
    __m256 s0 = zero, s1 = zero;
    Cands<NV> c;
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      const __m256 xv = _mm256_loadu_ps(p + 8 * v);
      if (softmax) {
        const __m256 e = exp2_offset(_mm256_fmsub_ps(xv, l2e, ml));
        if (v & 1) s1 = _mm256_add_ps(s1, e); else s0 = _mm256_add_ps(s0, e);
      }
      c.add(v, xv, th);
    }
    psum[i] = _mm256_add_ps(s0, s1);
    c.to_slots(p, i, redo, sl);
  }
  __m256 kv[8], ki[8];
  top_slots(sl, k, kv, ki);
  // Weights: exps of the k chosen offset by the row max (scaled by 1 / the row's sum) or by the
  // largest chosen (scaled by 1 / their sum).
  const __m256 mul = _mm256_set1_ps(s.select == Select::gating ? s.scale : 1.f);
  const __m256 off = _mm256_mul_ps(softmax ? mx : kv[0], l2e);
  __m256 esum = zero;
  for (int l = 0; l < 8; ++l) {
    if (l >= k) { kv[l] = zero; continue; }
    kv[l] = exp2_offset(_mm256_fmsub_ps(kv[l], l2e, off));
    esum = _mm256_add_ps(esum, kv[l]);
  }
  const __m256 scale = _mm256_div_ps(mul, softmax ? reduce8_add(psum) : esum);
  for (int l = 0; l < k; ++l) kv[l] = _mm256_mul_ps(kv[l], scale);
  return write_block(s, r, rb, rows, redo, kv, ki, b);
}

}  // namespace

bool t8_applies(const RouterSpec& s) {
  return s.R >= kMinRows && s.k <= 8 && !s.sigmoid && select_on_logits(s) && !limits_groups(s) && !s.allowed && !s.scores && lanes_kernel_for<8>(s.E);
}

bool route_rows_t8(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return with_lane_vectors<8>(s.E, [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    return t8_blocks<NV>(s, r, r0, r1, b, [&](int64_t rb, int rows, const float* x, bool pf) { return t8_block<NV>(s, r, rb, rows, x, 8 * NV, pf, b); });
  });
}

}  // namespace ot::moe::impl
