// Routers, AVX-512 rows (k <= 16), in blocks of kRouterBlock rows carried phase by phase (one row is
// a long dependency chain: the block lets the core overlap rows; the block's row maxima and sums are
// reduced together, its sorting networks run in lockstep). Softmax exps and sigmoids by a degree-5
// 2^x on vreduceps. Top-k: the threshold t is the k-th largest of the 16 column maxima (a 16-lane bitonic sort;
// k distinct elements reach it), the ids of the ~10 candidates >= t are compressed in expert order
// (as bytes with AVX512_VBMI2), their values gathered and sorted with the ids by a bitonic network;
// a tie among the first k + 1 is ranked exactly by counting (ties to the lower id), more than 16
// candidates go to the general vector top-k (up to 64), a -inf threshold or a tie there to
// route_row_scalar, so ids always match the scalar order (descending, ties to the lower expert id).
// Groups of 16 m experts are scored by one transposing tree over all groups. Rows of 4, 8 or 16
// vectors and fp32 rows read in place have their own instances (route_rows_avx512_rowwise).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "src/core/cvt_avx512.h"
#include "src/core/kernel_inline.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"
#include "src/moe/router_simd__avx512.h"

namespace ot::moe::impl {
using namespace rsimd;
namespace {

constexpr int kMaxCand = 64;

// rank[i] = #{j < n : c[j] > c[i]} for the n <= 16 NV candidates in c (padding -inf); their sum.
template <int NV> int rank_candidates(const float* c, int n, int32_t* rank) {
  __m512 v[NV];
  __m512i r[NV];
  const __m512i one = _mm512_set1_epi32(1);
  for (int q = 0; q < NV; ++q) { v[q] = _mm512_loadu_ps(c + 16 * q); r[q] = _mm512_setzero_si512(); }
  for (int j = 0; j < n; ++j) {
    const __m512 bj = _mm512_set1_ps(c[j]);
    for (int q = 0; q < NV; ++q) r[q] = _mm512_mask_add_epi32(r[q], _mm512_cmp_ps_mask(v[q], bj, _CMP_LT_OQ), r[q], one);
  }
  int sum = 0;
  for (int q = 0; q < NV; ++q) {
    _mm512_storeu_si512(rank + 16 * q, r[q]);
    sum += _mm512_mask_reduce_add_epi32(lanes(n - 16 * q), r[q]);
  }
  return sum;
}

// Top k (1 <= k <= 16) of key[0, 16 nv) (padding = -inf) into ids / vals, descending, ties to the
// lower index. False when the row needs the scalar path.
bool topk16(const float* key, int64_t nv, int64_t k, int32_t* ids, float* vals, RouterScratch& b) {
  __m512 cm = _mm512_loadu_ps(key);
  for (int64_t v = 1; v < nv; ++v) cm = _mm512_max_ps(cm, _mm512_loadu_ps(key + 16 * v));
  // Fold the 16 column maxima into g >= k maxima over disjoint column sets: each is a distinct
  // element, so at least k elements are >= their minimum t.
  int g = 16;
  if (k <= 8) { cm = _mm512_max_ps(cm, _mm512_shuffle_f32x4(cm, cm, _MM_SHUFFLE(1, 0, 3, 2))); g = 8; }
  if (k <= 4) { cm = _mm512_max_ps(cm, _mm512_shuffle_f32x4(cm, cm, _MM_SHUFFLE(2, 3, 0, 1))); g = 4; }
  if (k <= 2) { cm = _mm512_max_ps(cm, _mm512_permute_ps(cm, _MM_SHUFFLE(1, 0, 3, 2))); g = 2; }
  if (k <= 1) { cm = _mm512_max_ps(cm, _mm512_permute_ps(cm, _MM_SHUFFLE(2, 3, 0, 1))); g = 1; }
  float t = _mm512_mask_reduce_min_ps(lanes(g), cm);
  if (!(t > kNegInf)) return false;  // -inf may be chosen (masked experts): scalar decides
  // Candidates >= t, compressed in expert order (no branches: the buffers hold E + 16).
  const __m512 vt = _mm512_set1_ps(t);
  float* cv = b.cand;
  int32_t* ci = b.cand_id;
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int n = 0;
  for (int64_t v = 0; v < nv; ++v, idx = _mm512_add_epi32(idx, step)) {
    __m512 x = _mm512_loadu_ps(key + 16 * v);
    __mmask16 m = _mm512_cmp_ps_mask(x, vt, _CMP_GE_OQ);
    _mm512_storeu_ps(cv + n, _mm512_maskz_compress_ps(m, x));
    _mm512_storeu_si512(ci + n, _mm512_maskz_compress_epi32(m, idx));
    n += __builtin_popcount(m);
  }
  if (n > kMaxCand) return false;
  _mm512_storeu_ps(cv + n, _mm512_set1_ps(kNegInf));
  // Ranks by counting: a permutation of 0..n-1 (sum n(n-1)/2) exactly when no two candidates tie.
  int32_t* rk = b.rank;
  int sum = n <= 16 ? rank_candidates<1>(cv, n, rk) : n <= 32 ? rank_candidates<2>(cv, n, rk)
          : n <= 48 ? rank_candidates<3>(cv, n, rk) : rank_candidates<4>(cv, n, rk);
  if (sum != n * (n - 1) / 2) return false;
  // Place the candidates of rank < k (visiting only those).
  const __m512i vk = _mm512_set1_epi32(int(k));
  uint64_t top = 0;
  for (int q = 0; q < (n + 15) / 16; ++q)
    top |= uint64_t(_mm512_mask_cmplt_epi32_mask(lanes(n - 16 * q), _mm512_loadu_si512(rk + 16 * q), vk)) << (16 * q);
  for (; top; top &= top - 1) {
    int i = __builtin_ctzll(top);
    ids[rk[i]] = ci[i];
    vals[rk[i]] = cv[i];
  }
  return true;
}

// Group-limited selection: -inf outside the k_group best groups (group score: max, or top-2 sum;
// ties to the lower group). Groups of a multiple of 16 experts are scored with vectors.
void limit_groups_vec(const RouterSpec& s, float* key, float* gs) {
  const int64_t gsz = s.E / s.groups;
  for (int64_t g = 0; g < s.groups; ++g) {
    const float* p = key + g * gsz;
    if (gsz % 16 == 0) {
      __m512 a = _mm512_load_ps(p), bb = _mm512_set1_ps(kNegInf);
      for (int64_t i = 16; i < gsz; i += 16) {
        __m512 v = _mm512_load_ps(p + i);
        bb = _mm512_max_ps(bb, _mm512_min_ps(a, v));
        a = _mm512_max_ps(a, v);
      }
      float A = _mm512_reduce_max_ps(a);
      if (s.group_mode == 0) { gs[g] = A; continue; }
      __mmask16 at = _mm512_cmp_ps_mask(a, _mm512_set1_ps(A), _CMP_EQ_OQ);
      float B = __builtin_popcount(at) >= 2 ? A
                : std::max(_mm512_reduce_max_ps(bb), _mm512_mask_reduce_max_ps(__mmask16(~at), a));
      gs[g] = A + B;
    } else {
      float a = kNegInf, c = kNegInf;
      for (int64_t e = 0; e < gsz; ++e) {
        float v = p[e];
        if (v > a) { c = a; a = v; } else if (v > c) c = v;
      }
      gs[g] = s.group_mode == 0 ? a : a + c;
    }
  }
  for (int64_t kept = 0; kept < s.k_group; ++kept) {  // chosen groups become NaN
    int64_t best = -1;
    for (int64_t g = 0; g < s.groups; ++g)
      if (!std::isnan(gs[g]) && (best < 0 || gs[g] > gs[best])) best = g;
    gs[best] = std::numeric_limits<float>::quiet_NaN();
  }
  for (int64_t g = 0; g < s.groups; ++g)
    if (!std::isnan(gs[g])) std::fill(key + g * gsz, key + (g + 1) * gsz, kNegInf);
}


// rank_i = number of the 16 values c (also in memory at cm) larger than c_i (Ties: plus the equal
// ones at lower lanes, i.e. lower expert ids: candidates are kept in expert order). Each c_j comes
// as a broadcast from memory: load ports, not the shuffle unit (the scarce one here).
template <bool Ties> inline __m512i rank16(const float* cm, __m512 c) {
  __m512i rank = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  asm volatile("" ::: "memory");  // keep the broadcasts as loads (not lane extracts of c)
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const __m512 bj = _mm512_set1_ps(cm[j]);
    __mmask16 m = _mm512_cmp_ps_mask(bj, c, _CMP_GT_OQ);
    if (Ties) m |= _mm512_mask_cmp_ps_mask(__mmask16(0xfffeu << j), bj, c, _CMP_EQ_OQ);
    rank = _mm512_mask_add_epi32(rank, m, rank, one);
  }
  return rank;
}

// ---- Bitonic sorting network on 16 lanes (descending): 10 compare-exchange steps. Step (S, D)
// pairs lane i with lane i ^ D; lane i keeps the larger of the pair when i is the lower lane of a
// block sorted descending (blocks of S lanes alternate descending / ascending until S = 16).
template <int D> inline __m512 swap_lanes(__m512 x) {
  if constexpr (D == 1) return _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
  else if constexpr (D == 2) return _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2));
  else if constexpr (D == 4) return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1));
  else return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2));
}
template <int D> inline __m512i swap_lanes(__m512i x) { return _mm512_castps_si512(swap_lanes<D>(_mm512_castsi512_ps(x))); }
template <int S, int D> constexpr __mmask16 keeps_max() {
  unsigned m = 0;
  for (int i = 0; i < 16; ++i) m |= unsigned(((i & D) == 0) == ((i & S) == 0)) << i;
  return __mmask16(m);
}
// Always inlined, with the lambdas: out of line, a block's 16 registers went through memory every
// step (masked stores, then loads that could not be forwarded from them: ~20% of the router's time).
#define OT_INLINE OT_KERNEL_INLINE
template <class F> OT_INLINE inline void bitonic16(F&& step) {
  step.template operator()<2, 1>();
  step.template operator()<4, 2>(); step.template operator()<4, 1>();
  step.template operator()<8, 4>(); step.template operator()<8, 2>(); step.template operator()<8, 1>();
  step.template operator()<16, 8>(); step.template operator()<16, 4>(); step.template operator()<16, 2>(); step.template operator()<16, 1>();
}
// The 16 values of x, descending (values only: 3 ops a step).
OT_INLINE inline __m512 sort16(__m512 x) {
  bitonic16([&]<int S, int D>() OT_INLINE {
    const __m512 y = swap_lanes<D>(x);
    x = _mm512_mask_max_ps(_mm512_min_ps(x, y), keeps_max<S, D>(), x, y);
  });
  return x;
}
// sort16_ids_block sorts (value, id) pairs, descending by value: the values as in sort16, and a
// lane whose value changed takes its partner's id (equal values keep their ids, in no defined
// order: callers check the sorted values for ties).
// The networks run over a block of rows in lockstep: one row's network is a chain of 10 dependent
// steps, the block's rows are independent chains the core overlaps step by step.
OT_INLINE inline void sort16_block(__m512* x) {
  bitonic16([&]<int S, int D>() OT_INLINE {
#pragma GCC unroll 8
    for (int i = 0; i < kRouterBlock; ++i) {
      const __m512 y = swap_lanes<D>(x[i]);
      x[i] = _mm512_mask_max_ps(_mm512_min_ps(x[i], y), keeps_max<S, D>(), x[i], y);
    }
  });
}
OT_INLINE inline void sort16_ids_block(__m512* x, __m512i* id) {
  bitonic16([&]<int S, int D>() OT_INLINE {
#pragma GCC unroll 8
    for (int i = 0; i < kRouterBlock; ++i) {
      const __m512 y = swap_lanes<D>(x[i]);
      const __m512 z = _mm512_mask_max_ps(_mm512_min_ps(x[i], y), keeps_max<S, D>(), x[i], y);
      id[i] = _mm512_mask_mov_epi32(id[i], _mm512_cmp_ps_mask(z, x[i], _CMP_NEQ_UQ), swap_lanes<D>(id[i]));
      x[i] = z;
    }
  });
}

// Top k, first half: given the threshold t (the k-th largest column maximum: k distinct elements
// reach it; sort16_block), the ids of the candidates >= t compressed in expert order into ci (no
// branches: the buffer holds E + 16; their values are gathered back by topk_finish). Returns their
// number n (>= k). The ids are read back after the block's other rows (a load right after the
// compressed stores would wait for them to reach the cache).
inline int topk_collect(const float* key, int64_t nv, __m512 vt, int32_t* ci) {
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int n = 0;
  for (int64_t v = 0; v < nv; ++v, idx = _mm512_add_epi32(idx, step)) {
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(key + 16 * v), vt, _CMP_GE_OQ);
    _mm512_storeu_si512(ci + n, _mm512_maskz_compress_epi32(m, idx));
    n += __builtin_popcount(m);
  }
  return n;
}


// Second half, n <= 16 candidates c (values, in expert order) with ids cid, sorted descending into
// x / id by sort16_ids_block: a tie among the first k + 1 (where the network may lose an id) is
// ranked exactly by counting (ties to the lower id). Ids and values descending in lanes 0..k-1.
inline void topk_finish(__m512 c, __m512i cid, int n, int64_t k, __m512 x, __m512i id, __m512i& ids, __m512& vals, RouterScratch& b) {
  const __mmask16 valid = lanes(n), mk = lanes(k);
  const __m512 next = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_castps_si512(x), 1));
  if (!_mm512_mask_cmp_ps_mask(lanes(std::min<int64_t>(k, 15)), x, next, _CMP_EQ_OQ)) {
    ids = _mm512_maskz_mov_epi32(mk, id);
    vals = _mm512_maskz_mov_ps(mk, x);
    return;
  }
  alignas(64) float cc[16];
  alignas(64) int32_t rk[16], ci[16];
  _mm512_store_ps(cc, c);
  _mm512_store_si512(ci, cid);
  _mm512_store_si512(rk, rank16<true>(cc, c));
  for (uint32_t sel = _mm512_mask_cmplt_epi32_mask(valid, _mm512_load_si512(rk), _mm512_set1_epi32(int(k))); sel; sel &= sel - 1) {
    const int i = __builtin_ctz(sel);
    b.ki[rk[i]] = ci[i];
    b.kv[rk[i]] = cc[i];
  }
  ids = _mm512_maskz_loadu_epi32(mk, b.ki);
  vals = _mm512_maskz_loadu_ps(mk, b.kv);
}

// ---- Group-limited selection for groups of 16 m experts (m >= 1) and at most 16 groups: each
// group's (max, second) pair is folded lane-wise over its m vectors, then the groups' 16 lanes are
// reduced together by a transposing tree (four halving steps, two groups per shuffle), so there is
// no horizontal reduction per group. The lanes of the result hold groups in the order `map` says.
struct Top2 { __m512 a, b; };  // per lane: largest, second largest (multiset)
OT_INLINE inline Top2 merge2(Top2 u, Top2 v, bool top2) {
  if (!top2) return {_mm512_max_ps(u.a, v.a), u.b};
  return {_mm512_max_ps(u.a, v.a), _mm512_max_ps(_mm512_min_ps(u.a, v.a), _mm512_max_ps(u.b, v.b))};
}
template <int Step> OT_INLINE inline __m512 pick(__m512 p, __m512 q, bool hi) {
  if constexpr (Step == 0) return hi ? _mm512_shuffle_f32x4(p, q, 0xEE) : _mm512_shuffle_f32x4(p, q, 0x44);
  else if constexpr (Step == 1) return hi ? _mm512_shuffle_f32x4(p, q, 0xDD) : _mm512_shuffle_f32x4(p, q, 0x88);
  else if constexpr (Step == 2) return hi ? _mm512_shuffle_ps(p, q, 0xEE) : _mm512_shuffle_ps(p, q, 0x44);
  else return hi ? _mm512_shuffle_ps(p, q, 0xDD) : _mm512_shuffle_ps(p, q, 0x88);
}
template <int Step> OT_INLINE inline int tree_step(Top2* g, int n, bool top2) {
  const int out = std::max(1, n / 2);
  for (int i = 0; i < out; ++i) {
    const Top2 p = g[2 * i], q = n > 1 ? g[2 * i + 1] : g[2 * i];
    const Top2 lo{pick<Step>(p.a, q.a, false), top2 ? pick<Step>(p.b, q.b, false) : p.b};
    const Top2 hi{pick<Step>(p.a, q.a, true), top2 ? pick<Step>(p.b, q.b, true) : p.b};
    g[i] = merge2(lo, hi, top2);
  }
  return out;
}
// g[0, n) (n a power of 2 <= 16) -> one vector of per-group results.
OT_INLINE inline Top2 group_tree(Top2* g, int n, bool top2) {
  n = tree_step<0>(g, n, top2);
  n = tree_step<1>(g, n, top2);
  n = tree_step<2>(g, n, top2);
  tree_step<3>(g, n, top2);
  return g[0];
}
struct GroupNet {
  int G = 0, P = 0, m = 0;  // groups, padded to a power of 2, vectors per group
  __m512i inv;              // lane g <- a lane of the tree's result holding group g
};
inline bool group_net(const RouterSpec& s, GroupNet& net) {
  const int64_t gsz = s.E / s.groups;
  if (gsz % 16 || s.groups > 16) return false;
  net.G = int(s.groups);
  net.m = int(gsz / 16);
  net.P = 1;
  while (net.P < net.G) net.P *= 2;
  Top2 g[16];
  for (int i = 0; i < net.P; ++i) g[i] = {_mm512_set1_ps(float(i)), _mm512_setzero_ps()};
  alignas(64) float map[16];
  _mm512_store_ps(map, group_tree(g, net.P, false).a);
  alignas(64) int32_t inv[16] = {};
  for (int l = 15; l >= 0; --l) inv[int(map[l])] = l;
  net.inv = _mm512_load_si512(inv);
  return true;
}
// Group-limited selection in two steps, so that the sort between them runs over a block of rows in
// lockstep (sort16_block; one row's sort is a chain of 10 dependent steps): group_scores gives the
// groups' scores (max, or sum of the top 2) in lanes 0..G-1 (-inf above), keep_groups, given them
// sorted, masks (-inf) the groups outside the k_group best in key (ties to the lower group) and
// returns the column maxima of what is left. P_ / M_ (> 0): the padded group count (= G) and the
// vectors per group fixed at compile time, so the tree and the groups' pairs stay in registers
// (DeepSeek-V3's 8 groups of 32; the generic loops spilled them).
template <int P_ = 0, int M_ = 0, bool Top2Mode = false>
inline __m512 group_scores(const RouterSpec& s, const GroupNet& net, const float* key) {
  const bool top2 = P_ ? Top2Mode : s.group_mode == 1;
  const int P = P_ ? P_ : net.P, M = M_ ? M_ : net.m, G = P_ ? P_ : net.G;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  Top2 g[16];
  for (int i = 0; i < P; ++i) {
    if (i >= G) { g[i] = {ninf, ninf}; continue; }
    const float* p = key + int64_t(i) * M * 16;
    Top2 t{_mm512_load_ps(p), ninf};
    for (int j = 1; j < M; ++j) {
      const __m512 v = _mm512_load_ps(p + 16 * j);
      if (top2) t.b = _mm512_max_ps(t.b, _mm512_min_ps(t.a, v));
      t.a = _mm512_max_ps(t.a, v);
    }
    g[i] = t;
  }
  const Top2 r = group_tree(g, P, top2);
  return _mm512_mask_blend_ps(lanes(G), ninf, _mm512_permutexvar_ps(net.inv, top2 ? _mm512_add_ps(r.a, r.b) : r.a));
}
template <int P_ = 0, int M_ = 0>
inline __m512 keep_groups(const RouterSpec& s, const GroupNet& net, float* key, __m512 sc, __m512 sorted) {
  const int M = M_ ? M_ : net.m, G = P_ ? P_ : net.G;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  const __mmask16 live = lanes(G);
  // Kept: scores above the k_group-th best, then the lowest groups among those equal to it.
  const __m512 tg = _mm512_permutexvar_ps(_mm512_set1_epi32(int(s.k_group - 1)), sorted);
  const uint32_t gt = _mm512_mask_cmp_ps_mask(live, sc, tg, _CMP_GT_OQ), eq = _mm512_mask_cmp_ps_mask(live, sc, tg, _CMP_EQ_OQ);
  uint32_t kept = gt, tied = eq;
  for (int need = int(s.k_group) - __builtin_popcount(gt); need > 0; --need, tied &= tied - 1) kept |= tied & (0u - tied);
  __m512 cm = ninf;
  for (int i = 0; i < G; ++i) {
    float* p = key + int64_t(i) * M * 16;
    for (int j = 0; j < M; ++j) {
      if (kept >> i & 1) cm = _mm512_max_ps(cm, _mm512_load_ps(p + 16 * j));
      else _mm512_store_ps(p + 16 * j, ninf);
    }
  }
  return cm;
}

// Horizontal reductions of kRouterBlock = 8 rows at once by a transposing tree (15 shuffles for
// the block, not 8 per row): lane 4 (i % 4) + i / 4 of the result reduces v[i].
static_assert(kRouterBlock == 8);
template <class Op> inline __m512 reduce8(const __m512* v, Op op) {
  __m512 w[4], x[2];
  for (int i = 0; i < 4; ++i)  // w[i]: 8 partials of v[2i], then 8 of v[2i + 1]
    w[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 2; ++i)  // x[i]: 4 partials of each of v[4i .. 4i + 3]
    x[i] = op(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 z = op(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
  return op(_mm512_shuffle_ps(z, z, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(z, z, _MM_SHUFFLE(3, 1, 3, 1)));
}
inline int reduce8_lane(int i) { return 4 * (i % 4) + i / 4; }

}  // namespace

namespace {
// NV > 0: rows of exactly NV vectors (the common expert counts: loops of known length). Direct:
// fp32 rows read in place, no mask (see route_rows_avx512_rowwise; then no -inf lanes either).
template <int NV, bool Direct> bool route_rows(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  bool valid = true;
  const int64_t E = NV > 0 ? 16 * NV : s.E, k = s.k, nv = (E + 15) / 16, st = b.stride, cst = b.cand_stride;
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  GroupNet net;
  const bool group_vec = groups && group_net(s, net);
  const bool net8x2 = group_vec && net.G == 8 && net.m == 2;  // E 256 in 8 groups (DeepSeek-V3)
  // Softmax over all experts (its sum is needed) unless the weights are a softmax over the k chosen.
  const bool softmax = s.select != Select::topk_softmax && !s.sigmoid;
  // Scores of every expert are kept in b.sc when selection or the scores output needs them.
  const bool keep_sc = !on_x || s.scores;
  // -inf logits (masked experts, padding lanes): -inf keys, and finiteness checked in the load pass.
  const bool has_ninf = !Direct && (s.allowed || E % 16);
  const DType xt = s.x.dtype;
  const size_t row_bytes = size_t(E) * dtype_size(xt);
  float* scores = s.scores ? r.scores.ptr<float>() : nullptr;
  const __m512 ninf = _mm512_set1_ps(kNegInf), l2e = _mm512_set1_ps(kLog2e);
  const __mmask16 mk = lanes(k);
  const __m512i jr = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int32_t(s.R)));
  // Each phase runs over a block of rows before the next starts, so the rows' long dependency
  // chains (max -> exps -> sum; threshold -> candidates -> sort) overlap.
  __m512 cm[kRouterBlock], kv[kRouterBlock];
  __m512i ki[kRouterBlock];
  float mx[kRouterBlock], inv[kRouterBlock], sum[kRouterBlock];  // softmax: 1 / the row's exp sum, the sum
  const float* xa[kRouterBlock];  // selection keys (logits, masked logits or scores)
  const float* xl[kRouterBlock];  // logits
  int ncand[kRouterBlock];
  const bool direct = Direct;
  const bool id_bytes = E <= 256 && has_vbmi2();  // candidate ids compressed as bytes
  const bool finite_by_sum = softmax && !has_ninf;  // see pass 2
  for (int64_t r0b = r0; r0b < r1; r0b += kRouterBlock) {
    const int nb = int(std::min<int64_t>(kRouterBlock, r1 - r0b));
    uint32_t skip = 0, slow = 0;  // rows failing check_rows; rows left to the scalar path
    // Pass 1: logits (xr, padding -inf), finiteness, the allowed logits xa (-inf elsewhere: key
    // when masked, else xr itself) and their column maxima; the rows two blocks on are prefetched
    // (each row starts a new stream for the hardware prefetcher).
    for (int i = 0; i < nb; ++i) {
      const int64_t row = r0b + i;
      float *xr = b.xr + i * st, *key = b.key + i * st;
      const char* xp = static_cast<const char*>(s.x.data) + size_t(row) * row_bytes;
      if (row + 2 * kRouterBlock < s.R)
        for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(xp + 2 * kRouterBlock * row_bytes + o, _MM_HINT_T0);
      const uint8_t* al = !Direct && s.allowed ? s.allowed + row * E : nullptr;
      __m512 c = ninf, nonfinite = _mm512_setzero_ps();  // sums x * 0: NaN once some x is NaN or +-Inf
      int n_allowed = 0;
      for (int64_t v = 0; v < nv; ++v) {
        __mmask16 m = lanes(E - 16 * v), a = m;
        if (al) {
          a &= _mm_test_epi8_mask(_mm_maskz_loadu_epi8(m, al + 16 * v), _mm_set1_epi8(-1));
          n_allowed += __builtin_popcount(a);
        }
        __m512 x = load16(xp, xt, 16 * v, m);
        if (!direct) _mm512_store_ps(xr + 16 * v, x);
        if (!finite_by_sum)
          nonfinite = m == 0xffff ? _mm512_fmadd_ps(x, _mm512_setzero_ps(), nonfinite) : _mm512_mask3_fmadd_ps(x, _mm512_setzero_ps(), nonfinite, m);
        if (al) {
          x = _mm512_mask_blend_ps(a, ninf, x);
          _mm512_store_ps(key + 16 * v, x);
        }
        c = _mm512_max_ps(c, x);
      }
      const bool bad = _mm512_cmp_ps_mask(nonfinite, nonfinite, _CMP_UNORD_Q) != 0;
      if (bad || (al && n_allowed < k)) { valid = false; skip |= 1u << i; }
      cm[i] = c;
      xl[i] = direct ? reinterpret_cast<const float*>(xp) : xr;
      xa[i] = al ? key : xl[i];
    }
    // Selection keys of row i when not the logits: score(v) + bias, -inf where the logit is (masked
    // experts, padding); their column maxima. The keys row may be xa[i] itself (the masked logits):
    // each vector is read before it is overwritten.
    auto make_keys = [&](int i, auto&& score) {
      float* key = b.key + i * st;
      __m512 c = ninf;
      for (int64_t v = 0; v < nv; ++v) {
        __m512 y = score(v);
        if (!s.bias.empty()) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(lanes(E - 16 * v), s.bias.data() + 16 * v));
        if (has_ninf) y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(xa[i] + 16 * v), ninf, _CMP_NEQ_OQ), ninf, y);
        _mm512_store_ps(key + 16 * v, y);
        c = _mm512_max_ps(c, y);
      }
      cm[i] = c;
      xa[i] = key;  // from here on: the selection key
    };
    // Row maxima of the block at once.
    for (int i = nb; i < kRouterBlock; ++i) cm[i] = cm[0];
    alignas(64) float red[16];
    _mm512_store_ps(red, reduce8(cm, [](__m512 a, __m512 c) { return _mm512_max_ps(a, c); }));
    for (int i = 0; i < nb; ++i) { mx[i] = red[reduce8_lane(i)]; inv[i] = 1.f; }  // the largest allowed logit
    if (!s.sigmoid)  // exps with an offset of mx (kExpOffsetLimit): such rows by the scalar row (an
      for (int i = 0; i < nb; ++i)  // infinite max is a bad row, found by the sum below)
        if (!(skip >> i & 1) && std::fabs(mx[i]) >= kExpOffsetLimit && std::isfinite(mx[i])) { skip |= 1u << i; slow |= 1u << i; }
    // Pass 2: softmax exps and their sums (reduced for the block at once), or sigmoids.
    __m512 psum[kRouterBlock];
    for (int i = 0; i < nb; ++i) {
      psum[i] = _mm512_set1_ps(1.f);
      if (skip >> i & 1) continue;
      float* sc = b.sc + i * st;
      if (softmax) {
        const __m512 ml = _mm512_set1_ps(mx[i] * kLog2e);
        __m512 vs = _mm512_setzero_ps(), vs2 = _mm512_setzero_ps(), fs = _mm512_setzero_ps();
        for (int64_t v = 0; v < nv; ++v) {
          __m512 x = _mm512_loadu_ps(xa[i] + 16 * v);
          const __m512 t = _mm512_fmsub_ps(x, l2e, ml);
          if (finite_by_sum) fs = _mm512_fmadd_ps(t, _mm512_setzero_ps(), fs);  // NaN once some t is not finite
          __m512 e = exp2_ps(t);
          if (keep_sc) _mm512_store_ps(sc + 16 * v, e);
          if (v & 1) vs2 = _mm512_add_ps(vs2, e); else vs = _mm512_add_ps(vs, e);
        }
        psum[i] = _mm512_add_ps(_mm512_add_ps(vs, vs2), fs);  // fs is 0, or NaN when some t is not finite
      } else if (s.sigmoid && !on_x) {  // the keys right away (no sum to wait for)
        make_keys(i, [&](int64_t v) {
          const __m512 y = sigmoid_ps(_mm512_loadu_ps(xl[i] + 16 * v));
          _mm512_store_ps(sc + 16 * v, y);
          return y;
        });
      } else if (s.sigmoid && keep_sc) {
        for (int64_t v = 0; v < nv; ++v) _mm512_store_ps(sc + 16 * v, sigmoid_ps(_mm512_loadu_ps(xl[i] + 16 * v)));
      }
    }
    if (softmax) {
      for (int i = nb; i < kRouterBlock; ++i) psum[i] = psum[0];
      _mm512_store_ps(red, reduce8(psum, [](__m512 a, __m512 c) { return _mm512_add_ps(a, c); }));
      for (int i = 0; i < nb; ++i) {
        sum[i] = red[reduce8_lane(i)];
        inv[i] = 1.f / sum[i];
        // Without -inf lanes (mask, padding) the exps' fractional parts are NaN exactly when some
        // logit (or the row max) is not finite: the sum is the finiteness check.
        if (finite_by_sum && std::isnan(inv[i]) && !(skip >> i & 1)) { valid = false; skip |= 1u << i; }
      }
    }
    // Then the keys when not the logits, and the groups' scores.
    __m512 gsc[kRouterBlock];
    for (int i = 0; i < nb; ++i) {
      if (skip >> i & 1) continue;
      float* sc = b.sc + i * st;
      if (!on_x && softmax) {
        const __m512 vi = _mm512_set1_ps(inv[i]);
        make_keys(i, [&](int64_t v) { return _mm512_mul_ps(_mm512_load_ps(sc + 16 * v), vi); });
      }
      if (group_vec) {
        const float* key = xa[i];
        gsc[i] = !net8x2 ? group_scores(s, net, key) : s.group_mode == 1 ? group_scores<8, 2, true>(s, net, key) : group_scores<8, 2, false>(s, net, key);
      } else if (groups) {
        float* key = const_cast<float*>(xa[i]);
        limit_groups_vec(s, key, b.gs);
        __m512 c = _mm512_load_ps(key);
        for (int64_t v = 1; v < nv; ++v) c = _mm512_max_ps(c, _mm512_load_ps(key + 16 * v));
        cm[i] = c;
      }
    }
    if (group_vec) {  // the groups' sorts in lockstep, then each row's group mask
      __m512 srt[kRouterBlock];
      for (int i = 0; i < kRouterBlock; ++i) srt[i] = i < nb && !(skip >> i & 1) ? gsc[i] : ninf;
      sort16_block(srt);
      for (int i = 0; i < nb; ++i) {
        if (skip >> i & 1) continue;
        float* key = const_cast<float*>(xa[i]);  // a copy (see direct)
        cm[i] = net8x2 ? keep_groups<8, 2>(s, net, key, gsc[i], srt[i]) : keep_groups(s, net, key, gsc[i], srt[i]);
      }
    }
    // Top k for every row: thresholds, compressed candidates, their sort.
    __m512 vt[kRouterBlock];
    for (int i = 0; i < kRouterBlock; ++i) vt[i] = i < nb ? cm[i] : ninf;
    sort16_block(vt);
    for (int i = 0; i < nb; ++i) {
      vt[i] = _mm512_permutexvar_ps(_mm512_set1_epi32(int(k - 1)), vt[i]);
      ncand[i] = skip >> i & 1                          ? 0
                 : !(_mm512_cvtss_f32(vt[i]) > kNegInf) ? -1
                 : id_bytes ? topk_collect_bytes(xa[i], nv, vt[i], reinterpret_cast<uint8_t*>(b.cid_rows + i * cst))
                            : topk_collect(xa[i], nv, vt[i], b.cid_rows + i * cst);
    }
    __m512 cx[kRouterBlock], sx[kRouterBlock];
    __m512i sid[kRouterBlock], cid[kRouterBlock];
    for (int i = 0; i < kRouterBlock; ++i) {
      const bool fast = i < nb && ncand[i] >= 0 && ncand[i] <= 16 && !(skip >> i & 1);
      const __mmask16 valid = fast ? lanes(ncand[i]) : 0;
      sid[i] = id_bytes ? _mm512_maskz_cvtepu8_epi32(valid, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.cid_rows + i * cst)))
                        : _mm512_maskz_loadu_epi32(valid, b.cid_rows + i * cst);
      cid[i] = sid[i];
      sx[i] = cx[i] = NV > 0 ? gather_perm<NV>(fast ? xa[i] : xa[0], sid[i], valid)
                             : _mm512_mask_i32gather_ps(ninf, valid, sid[i], fast ? xa[i] : xa[0], 4);
    }
    sort16_ids_block(sx, sid);
    // Sorted ids and selection values in lanes < k.
    for (int i = 0; i < nb; ++i) {
      if (skip >> i & 1) continue;
      if (ncand[i] >= 0 && ncand[i] <= 16) {
        topk_finish(cx[i], cid[i], ncand[i], k, sx[i], sid[i], ki[i], kv[i], b);
        continue;
      }
      if (ncand[i] < 0 || !topk16(xa[i], nv, k, b.ki, b.kv, b)) { slow |= 1u << i; continue; }
      ki[i] = _mm512_maskz_loadu_epi32(mk, b.ki);
      kv[i] = _mm512_maskz_loadu_ps(mk, b.kv);
    }
    // Weights of the chosen experts, outputs.
    for (int i = 0; i < nb; ++i) {
      if ((skip | slow) >> i & 1) continue;
      const int64_t row = r0b + i;
      const float* sc = b.sc + i * st;
      __m512 w;
      if (s.select == Select::topk_softmax) {  // softmax over the k chosen logits (lane 0 is their max)
        __m512 e = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(kv[i], l2e, _mm512_set1_ps(mx[i] * kLog2e))));
        w = _mm512_mul_ps(e, _mm512_set1_ps(1.f / sum_in_order(e, k)));
      } else {
        __m512 y = !on_x     ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, ki[i], sc, 4)
                   : softmax ? exp2_ps(_mm512_fmsub_ps(kv[i], l2e, _mm512_set1_ps(mx[i] * kLog2e)))
                             : sigmoid_ps(kv[i]);
        y = _mm512_maskz_mov_ps(mk, y);
        float mul = softmax ? (s.select == Select::gating ? s.scale : 1.f) / sum[i] : s.scale / (sum_in_order(y, k) + s.eps);
        w = _mm512_mul_ps(y, _mm512_set1_ps(mul));
      }
      write_row16(s, r, row, ki[i], w, row * k + 16 <= r1 * k, jr);
      if (scores) {
        const __m512 vi = _mm512_set1_ps(inv[i]);
        for (int64_t v = 0; v < nv; ++v) {
          __m512 y = _mm512_load_ps(sc + 16 * v);
          _mm512_mask_storeu_ps(scores + row * E + 16 * v, lanes(E - 16 * v), softmax ? _mm512_mul_ps(y, vi) : y);
        }
      }
    }
    for (; slow; slow &= slow - 1)  // uses row slot 0: last; false for a huge-max row that is also not finite
      if (!route_row_scalar(s, r, r0b + __builtin_ctz(slow), b)) valid = false;
  }
  return valid;
}

}  // namespace

bool route_rows_avx512_rowwise(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  // fp32 rows of whole vectors without a mask are read in place (no copy; the group limit writes
  // -inf into its key row, so it needs the copy when it works on the logits).
  const bool direct = s.x.dtype == DType::f32 && !s.allowed && s.E % 16 == 0 && !(limits_groups(s) && select_on_logits(s));
  switch (s.E) {
    case 64: return direct ? route_rows<4, true>(s, r, r0, r1, b) : route_rows<4, false>(s, r, r0, r1, b);
    case 128: return direct ? route_rows<8, true>(s, r, r0, r1, b) : route_rows<8, false>(s, r, r0, r1, b);
    case 256: return direct ? route_rows<16, true>(s, r, r0, r1, b) : route_rows<16, false>(s, r, r0, r1, b);
    default: return direct ? route_rows<0, true>(s, r, r0, r1, b) : route_rows<0, false>(s, r, r0, r1, b);
  }
}

}  // namespace ot::moe::impl
