// Routers, AVX2 with 8 tokens in the lanes ("t8"): softmax routers that select on the logits (no
// bias, group limit or scores output) and gating_top_k with sigmoid scores (any bias, the group
// limit over groups of whole vectors, at most 16 groups, the scores output); no mask, E one of
// router_lane_counts.h, k <= 8. The row passes stay row-wise (loads, finiteness, column maxima;
// exps and their sums or sigmoids and keys; the candidates' compare masks); every step that was
// horizontal or a per-row network in the row kernel (router__avx2.cpp) is done once for 8 rows
// with a token per lane:
// - 16 column maxima a row (even / odd vectors; with a group limit, lane-wise per group) are
//   transposed (two 8x8) and sorted per lane by a pruned Batcher network: lane i of output k-1 is
//   row i's threshold (the k-th largest maximum of disjoint expert sets: k distinct experts reach
//   it), of output 0 its max;
// - group scores for 8 rows at once: each group's 8 lane-wise (largest, second) vectors transposed
//   and merged per lane (max; or the multiset's top 2, summed: the row kernel's value exactly); the
//   k_group best groups per lane by counting (ties to the lower group, keep_groups' order); the
//   kept groups' column maxima from the transposed lane-wise maxima; a dropped group's candidate
//   bits masked off (its keys stay);
// - the candidates (>= the threshold, at most 16 a row, in expert order: a bitmask) go to
//   slot-major slots and are inserted per lane into k sorted (value, id) registers; strict '>' over
//   slots in expert order keeps the lower expert id first on ties, the scalar row's order;
// - the weights: k vertical exps (softmax exp sums by one transposing hadd tree), or the chosen
//   sigmoids gathered and summed in the scalar row's order; transposed back to rows.
// Rows it does not decide (more than 16 candidates; softmax |max| >= kExpOffsetLimit; a -inf
// threshold) go to the row kernel; a last partial block runs on zero-padded copies of its rows
// (the padding is never written out).
#include <algorithm>

#include "src/moe/router_t8__avx2.h"

namespace ot::moe::impl {
namespace {

constexpr int kMaxGroups = 16;

// Lane i <- the group score of row i from a[i] / a2[i], row i's lane-wise largest and second
// largest keys of the group: the largest of its 8 lanes, with Top2 plus the second largest of the
// multiset of a and a2. a is left transposed (a[j] lane i: row i's lane-j largest, the group's
// column maxima in lanes); a2 is overwritten.
template <bool Top2> OT_T8_AI inline __m256 group_score8(__m256* a, __m256* a2) {
  simd::transpose8x8(a);
  if constexpr (Top2) simd::transpose8x8(a2);
  __m256 m[4];
  for (int j = 0; j < 4; ++j) {
    if constexpr (Top2) a2[j] = _mm256_max_ps(_mm256_min_ps(a[j], a[j + 4]), _mm256_max_ps(a2[j], a2[j + 4]));
    m[j] = _mm256_max_ps(a[j], a[j + 4]);
  }
  for (int w = 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) {
      if constexpr (Top2) a2[j] = _mm256_max_ps(_mm256_min_ps(m[j], m[j + w]), _mm256_max_ps(a2[j], a2[j + w]));
      m[j] = _mm256_max_ps(m[j], m[j + w]);
    }
  return Top2 ? _mm256_add_ps(m[0], a2[0]) : m[0];
}

// One block of 8 rows from rb (the first `rows` real; x: rows of E fp32 floats; pf: prefetch the 8
// rows after them). Sig: sigmoid scores, else softmax. False when some row is not finite (nothing
// decided: the entry point checks every row).
template <bool Sig, int NV>
bool t8_block(const RouterSpec& s, GatingResult& r, int64_t rb, int rows, const float* x, bool pf, RouterScratch& b) {
  constexpr int E = 8 * NV;
  const int k = int(s.k);
  const bool on_x = select_on_logits(s), groups = Sig && limits_groups(s), top2 = s.group_mode == 1, bias = !s.bias.empty();
  const bool softmax = !Sig && s.select != Select::topk_softmax;  // else a softmax over the k chosen only
  const int G = groups ? int(s.groups) : 1, gv = NV / G;           // groups, vectors a group
  const __m256 ninf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps(), l2e = _mm256_set1_ps(kLog2e);
  float* S = b.sc;   // sigmoid: [8, ld] the sigmoids
  float* K = b.key;  // sigmoid: [8, ld] the selection keys (softmax: the logits x)
  const int64_t ld = b.stride;
  // Pass 1: finiteness (x * 0 is NaN exactly for NaN / +-Inf), the 16 column maxima (even / odd
  // vectors; NV 1: the 8 values and -inf) of the keys or, with groups, their lane-wise largest and
  // second largest a group. Sigmoid: the sigmoids and keys stored; without a bias the keys add a
  // row of zeros (no branch a vector); groups: one loop over the vectors with a counter for the
  // group ends (a division a vector was ~10 of its ~54 instructions).
  alignas(32) static constexpr float kNoBias[256] = {};
  const float* bp = bias ? s.bias.data() : kNoBias;
  __m256 cm[16], nonfinite = zero;
  __m256 A[Sig ? kMaxGroups : 1][8], A2[Sig ? kMaxGroups : 1][8];
  __m256 kept[kMaxGroups];  // groups: lane i all ones where row i keeps group g
  for (int i = 0; i < 8; ++i) {
    const float* p = x + i * E;
    if (pf)  // the next block's row (at T 16384 the loads of this pass were ~1/5 of the samples)
      for (int o = 0; o < NV * 32; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * E) + o, _MM_HINT_T0);
    __m256 c0 = ninf, c1 = ninf, nf = zero;
    // Vector v's key (sigmoid: its sigmoid and key stored).
    auto key_of = [&](int v) OT_T8_AI {
      const __m256 xv = _mm256_loadu_ps(p + 8 * v);
      nf = _mm256_fmadd_ps(xv, zero, nf);
      if (!Sig) return xv;
      const __m256 sg = sigmoid_ps(xv);
      _mm256_store_ps(S + i * ld + 8 * v, sg);
      const __m256 key = on_x ? xv : _mm256_add_ps(sg, _mm256_loadu_ps(bp + 8 * v));
      _mm256_store_ps(K + i * ld + 8 * v, key);
      return key;
    };
    if (groups) {
      __m256 a = ninf, a2 = ninf;
      for (int v = 0, g = 0, e = 0; v < NV; ++v) {
        const __m256 key = key_of(v);
        a2 = _mm256_max_ps(a2, _mm256_min_ps(a, key));
        a = _mm256_max_ps(a, key);
        if (++e == gv) {
          A[g][i] = a;
          A2[g++][i] = a2;
          a = a2 = ninf;
          e = 0;
        }
      }
    } else {
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) {
        const __m256 key = key_of(v);
        if (v & 1) c1 = _mm256_max_ps(c1, key); else c0 = _mm256_max_ps(c0, key);
      }
    }
    nonfinite = _mm256_add_ps(nonfinite, nf);
    cm[i] = c0;
    cm[8 + i] = c1;
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(nonfinite, nonfinite, _CMP_UNORD_Q))) return false;
  if (groups) {
    // Group scores per lane, the kept groups by rank (#{h < g: score_h >= score_g} + #{h > g: score_h > score_g} < k_group).
    __m256 gs[kMaxGroups];
    for (int g = 0; g < G; ++g) gs[g] = top2 ? group_score8<true>(A[g], A2[g]) : group_score8<false>(A[g], A2[g]);
    for (int i = 0; i < 16; ++i) cm[i] = ninf;
    for (int g = 0; g < G; ++g) {
      __m256i rank = _mm256_setzero_si256();
      for (int h = 0; h < G; ++h)
        if (h != g)
          rank = _mm256_sub_epi32(rank, _mm256_castps_si256(h < g ? _mm256_cmp_ps(gs[h], gs[g], _CMP_GE_OQ) : _mm256_cmp_ps(gs[h], gs[g], _CMP_GT_OQ)));
      kept[g] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(s.k_group)), rank));
      // The 16 column maxima (already in lanes) of the kept groups: columns (lane j, group parity),
      // disjoint; the keys themselves are not rewritten (pass 2 masks a dropped group's candidate
      // bits). Was a second row pass over the keys: ~250 instructions a row.
      for (int j = 0; j < 8; ++j) cm[j + 8 * (g & 1)] = _mm256_max_ps(cm[j + 8 * (g & 1)], _mm256_blendv_ps(ninf, A[g][j], kept[g]));
    }
  } else {
    simd::transpose8x8(cm);
    simd::transpose8x8(cm + 8);
  }
  sort_lanes<8>(cm);
  alignas(32) float mxa[8], tha[8];
  _mm256_store_ps(mxa, cm[0]);
  _mm256_store_ps(tha, cm[k - 1]);
  const __m256 mx = cm[0];
  const unsigned real = (1u << rows) - 1;
  // Rows for the row kernel: softmax rows of a huge max (the exps' offset); -inf thresholds (fewer
  // than k finite column maxima: -inf keys may be chosen).
  unsigned redo = unsigned(_mm256_movemask_ps(Sig ? _mm256_cmp_ps(cm[k - 1], ninf, _CMP_EQ_OQ)
                                                  : _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), mx), _mm256_set1_ps(kExpOffsetLimit), _CMP_GE_OQ))) & real;
  // Groups: each group's candidate bits (experts [g w, (g + 1) w), w = 8 gv) as 4 words.
  alignas(32) uint64_t gbits[Sig ? kMaxGroups : 1][4] = {};
  for (int g = 0; groups && g < G; ++g)
    for (int e = g * 8 * gv, end = e + 8 * gv; e < end;) {  // (a group may straddle words: E 192, G 4)
      const int lo = e & 63, n = std::min(64 - lo, end - e);
      gbits[g][e >> 6] |= (n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1) << lo;
      e += n;
    }
  // Pass 2: softmax exps and their sums (over all experts); the candidates >= the threshold as a
  // bitmask (groups: of the kept groups only), then into the slots.
  Slots sl;
  __m256 psum[8];
  for (int i = 0; i < 8; ++i) {
    psum[i] = _mm256_set1_ps(1.f);  // (rows not decided here)
    if (!decided(i, real, redo)) continue;
    const float* kp = Sig ? K + i * ld : x + i * E;
    const __m256 th = _mm256_set1_ps(tha[i]), ml = _mm256_set1_ps(mxa[i] * kLog2e);
    __m256 s0 = zero, s1 = zero;
    Cands<NV> c;
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      const __m256 key = Sig ? _mm256_load_ps(kp + 8 * v) : _mm256_loadu_ps(kp + 8 * v);
      if (softmax) {
        const __m256 e = exp2_offset(_mm256_fmsub_ps(key, l2e, ml));
        if (v & 1) s1 = _mm256_add_ps(s1, e); else s0 = _mm256_add_ps(s0, e);
      }
      c.add(v, key, th);
    }
    psum[i] = _mm256_add_ps(s0, s1);
    if (groups) {  // only the kept groups' candidates: row i's lane of kept[g] to all lanes, its bits
      __m256i m = _mm256_setzero_si256();
      for (int g = 0; g < G; ++g)
        m = _mm256_or_si256(m, _mm256_and_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(gbits[g])),
                                                _mm256_permutevar8x32_epi32(_mm256_castps_si256(kept[g]), _mm256_set1_epi32(i))));
      alignas(32) uint64_t mw[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(mw), m);
      c.keep_only(mw);
    }
    c.to_slots(kp, i, redo, sl);
  }
  __m256 kv[8], ki[8];
  top_slots(sl, k, kv, ki);
  // Weights. Softmax: exps of the k chosen offset by the row max (scaled by 1 / the row's sum) or by
  // the largest chosen (scaled by 1 / their sum). Sigmoid: the chosen sigmoids (gathered; padding
  // rows read their own zero logits' sigmoids), summed in order as the scalar row does, times
  // scale / (sum + eps).
  const __m256i rowoff = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(int32_t(ld)));
  const __m256 off = _mm256_mul_ps(softmax ? mx : kv[0], l2e);
  __m256 sum = zero;
  for (int l = 0; l < 8; ++l) {
    if (l >= k) { kv[l] = zero; continue; }
    if (Sig) {
      // Lanes of redo rows may hold -inf slots' ids: read expert 0 there (their row is rewritten).
      const __m256i id = _mm256_blendv_epi8(_mm256_castps_si256(ki[l]), _mm256_setzero_si256(), _mm256_castps_si256(_mm256_cmp_ps(kv[l], ninf, _CMP_EQ_OQ)));
      kv[l] = _mm256_i32gather_ps(S, _mm256_add_epi32(rowoff, id), 4);
    } else {
      kv[l] = exp2_offset(_mm256_fmsub_ps(kv[l], l2e, off));
    }
    sum = _mm256_add_ps(sum, kv[l]);
  }
  const __m256 mul = _mm256_set1_ps(Sig || s.select == Select::gating ? s.scale : 1.f);
  const __m256 scale = Sig ? _mm256_div_ps(mul, _mm256_add_ps(sum, _mm256_set1_ps(s.eps))) : _mm256_div_ps(mul, softmax ? reduce8_add(psum) : sum);
  for (int l = 0; l < k; ++l) kv[l] = _mm256_mul_ps(kv[l], scale);
  if (Sig && s.scores)
    for (int i = 0; i < rows; ++i)
      if (!(redo >> i & 1))
        for (int v = 0; v < NV; ++v) _mm256_storeu_ps(r.scores.ptr<float>() + (rb + i) * E + 8 * v, _mm256_load_ps(S + i * ld + 8 * v));
  return write_block(s, r, rb, rows, redo, kv, ki, b);
}

}  // namespace

bool t8_applies(const RouterSpec& s) {
  if (s.R < kMinRows || s.k > 8 || s.allowed || !lanes_kernel_for<8>(s.E)) return false;
  if (s.sigmoid) return s.select == Select::gating && (!limits_groups(s) || ((s.E / s.groups) % 8 == 0 && s.groups <= kMaxGroups));
  return select_on_logits(s) && !limits_groups(s) && !s.scores;
}

bool route_rows_t8(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return with_lane_vectors<8>(s.E, [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    return t8_blocks<NV>(s, r, r0, r1, b, [&](int64_t rb, int rows, const float* x, bool pf) {
      return s.sigmoid ? t8_block<true, NV>(s, r, rb, rows, x, pf, b) : t8_block<false, NV>(s, r, rb, rows, x, pf, b);
    });
  });
}

}  // namespace ot::moe::impl
