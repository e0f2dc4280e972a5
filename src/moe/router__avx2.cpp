// Routers, AVX2 rows (k <= 16), one row at a time, for cores without AVX-512 (8 lanes, no mask
// registers, no compress). Softmax exps and sigmoids by a degree-5 2^x (8 lanes). Top-k: the
// threshold t is the k-th largest of 16 column maxima (folded to 8, 4, 2 for k <= 4, 2, 1):
// those are maxima of disjoint expert sets, so k distinct experts reach t. The candidates >= t are
// compressed in expert order by a 256-entry permute table, then ranked exactly by counting (ties to
// the lower expert id, the scalar row's order): without ties one compare a candidate pair, with ties
// an extra equal-and-lower-id term. Rows the kernel does not decide go to route_row_scalar: a -inf
// threshold (masked or group-limited experts chosen), more than kMaxCand candidates (flat rows), and
// softmax rows whose max is huge (the exps' offset, kExpOffsetLimit), so ids always match the scalar
// order. Group scores of whole vectors by lane-wise top-2 (else the scalar row's limit_groups).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/moe/router_simd__avx2.h"

namespace ot::moe::impl {
namespace {

constexpr int kMaxCand = 64;

// The k-th largest of the g (<= 16) values in lo (lanes 0..7) and hi (8..15): the smallest value
// that fewer than k of the others exceed.
inline float kth_largest(__m256 lo, __m256 hi, int g, int64_t k) {
  alignas(32) float c[16];
  _mm256_store_ps(c, lo);
  _mm256_store_ps(c + 8, hi);
  __m256i n0 = _mm256_setzero_si256(), n1 = _mm256_setzero_si256();
  for (int j = 0; j < g; ++j) {
    const __m256 bj = _mm256_broadcast_ss(c + j);
    n0 = _mm256_sub_epi32(n0, _mm256_castps_si256(_mm256_cmp_ps(bj, lo, _CMP_GT_OQ)));
    if (g > 8) n1 = _mm256_sub_epi32(n1, _mm256_castps_si256(_mm256_cmp_ps(bj, hi, _CMP_GT_OQ)));
  }
  const __m256i vk = _mm256_set1_epi32(int(k)), iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  // Lanes that count (< g) with fewer than k larger ones: their minimum.
  const __m256i in0 = _mm256_and_si256(_mm256_cmpgt_epi32(vk, n0), _mm256_cmpgt_epi32(_mm256_set1_epi32(g), iota));
  __m256 m = _mm256_blendv_ps(inf, lo, _mm256_castsi256_ps(in0));
  if (g > 8) {
    const __m256i in1 = _mm256_and_si256(_mm256_cmpgt_epi32(vk, n1), _mm256_cmpgt_epi32(_mm256_set1_epi32(g - 8), iota));
    m = _mm256_min_ps(m, _mm256_blendv_ps(inf, hi, _mm256_castsi256_ps(in1)));
  }
  return -hmax(_mm256_sub_ps(_mm256_setzero_ps(), m));
}

// Ranks of the n candidates c (expert order; c padded with -inf to a multiple of 8, aligned):
// rank[i] = #{j : c_j > c_i}, plus with Ties #{j < i : c_j == c_i} (ties to the lower expert id).
// Returns the sum of the ranks over i < n. NQ = ceil(n / 8) vectors (the counts stay in registers).
template <int NQ, bool Ties> int rank_candidates(const float* c, int n, int32_t* rank) {
  __m256i r[NQ];
  for (int q = 0; q < NQ; ++q) r[q] = _mm256_setzero_si256();
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int j = 0; j < n; ++j) {
    const __m256 bj = _mm256_broadcast_ss(c + j);
    for (int q = 0; q < NQ; ++q) {
      const __m256 cq = _mm256_load_ps(c + 8 * q);
      __m256 m = _mm256_cmp_ps(bj, cq, _CMP_GT_OQ);
      if (Ties) {
        const __m256i after = _mm256_cmpgt_epi32(_mm256_add_epi32(iota, _mm256_set1_epi32(8 * q)), _mm256_set1_epi32(j));  // i > j
        m = _mm256_or_ps(m, _mm256_and_ps(_mm256_cmp_ps(bj, cq, _CMP_EQ_OQ), _mm256_castsi256_ps(after)));
      }
      r[q] = _mm256_sub_epi32(r[q], _mm256_castps_si256(m));
    }
  }
  __m256i sum = _mm256_setzero_si256();
  for (int q = 0; q < NQ; ++q) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(rank + 8 * q), r[q]);
    sum = _mm256_add_epi32(sum, _mm256_and_si256(r[q], simd::first_lanes(n - 8 * q)));
  }
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}
template <bool Ties> int rank_candidates(const float* c, int n, int32_t* rank) {
  static_assert(kMaxCand == 64);
  switch ((n + 7) / 8) {
    case 1: return rank_candidates<1, Ties>(c, n, rank);
    case 2: return rank_candidates<2, Ties>(c, n, rank);
    case 3: return rank_candidates<3, Ties>(c, n, rank);
    case 4: return rank_candidates<4, Ties>(c, n, rank);
    case 5: return rank_candidates<5, Ties>(c, n, rank);
    case 6: return rank_candidates<6, Ties>(c, n, rank);
    case 7: return rank_candidates<7, Ties>(c, n, rank);
    default: return rank_candidates<8, Ties>(c, n, rank);
  }
}

enum class RowResult { done, scalar, bad };

// One row: ids / weights / scores written, or left to the scalar row, or bad (nothing written).
RowResult route_row(const RouterSpec& s, GatingResult& r, int64_t row, RouterScratch& b) {
  const int64_t E = s.E, k = s.k, nv = (E + 7) / 8;
  float *xr = b.xr, *key = b.key, *sc = b.sc;
  const DType xt = s.x.dtype;
  const char* xp = static_cast<const char*>(s.x.data) + size_t(row * E) * dtype_size(xt);
  const uint8_t* al = s.allowed ? s.allowed + row * E : nullptr;
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  const __m256 ninf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps();
  // Pass 1: logits (padding -inf), finiteness, the allowed logits (-inf elsewhere, into key when
  // masked) and their column maxima over even / odd vectors (16 columns).
  __m256 c0 = ninf, c1 = ninf, nonfinite = zero;  // sums x * 0: NaN once some x is NaN or +-Inf
  int n_allowed = 0;
  int64_t v0 = 0;
  if (!al)  // whole vectors without a mask, two at a time (no per-vector branches)
    for (const bool f32 = xt == DType::f32, bf16 = xt == DType::bf16; v0 + 2 <= E / 8; v0 += 2) {
      const float* pf = reinterpret_cast<const float*>(xp) + 8 * v0;
      const uint16_t* ph = reinterpret_cast<const uint16_t*>(xp) + 8 * v0;
      const __m256 x0 = f32 ? _mm256_loadu_ps(pf) : simd::half8_to_f32(ph, bf16);
      const __m256 x1 = f32 ? _mm256_loadu_ps(pf + 8) : simd::half8_to_f32(ph + 8, bf16);
      _mm256_store_ps(xr + 8 * v0, x0);
      _mm256_store_ps(xr + 8 * v0 + 8, x1);
      nonfinite = _mm256_fmadd_ps(x0, zero, _mm256_fmadd_ps(x1, zero, nonfinite));
      c0 = _mm256_max_ps(c0, x0);
      c1 = _mm256_max_ps(c1, x1);
    }
  for (int64_t v = v0; v < nv; ++v) {
    const int64_t rem = E - 8 * v;
    __m256 x = load8(xp, xt, 8 * v, rem);
    _mm256_store_ps(xr + 8 * v, x);
    nonfinite = _mm256_fmadd_ps(rem >= 8 ? x : _mm256_and_ps(x, _mm256_castsi256_ps(simd::first_lanes(rem))), zero, nonfinite);
    if (al) {
      uint64_t bytes = 0;
      std::memcpy(&bytes, al + 8 * v, size_t(std::min<int64_t>(rem, 8)));
      const __m256 off = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(bytes))), _mm256_setzero_si256()));
      n_allowed += 8 - __builtin_popcount(unsigned(_mm256_movemask_ps(off)));  // tail lanes read as 0: not allowed
      x = _mm256_blendv_ps(x, ninf, off);
      _mm256_store_ps(key + 8 * v, x);
    }
    if (v & 1) c1 = _mm256_max_ps(c1, x); else c0 = _mm256_max_ps(c0, x);
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(nonfinite, nonfinite, _CMP_UNORD_Q)) || (al && n_allowed < k)) return RowResult::bad;
  const float* xa = al ? key : xr;  // allowed logits
  const float mx = hmax(_mm256_max_ps(c0, c1));
  const bool softmax = s.select != Select::topk_softmax && !s.sigmoid;
  if (!s.sigmoid && std::fabs(mx) >= kExpOffsetLimit) return RowResult::scalar;
  // Pass 2: scores (softmax exps, unnormalised, 0 where masked; or sigmoids).
  const __m256 l2e = _mm256_set1_ps(kLog2e), ml = _mm256_set1_ps(mx * kLog2e);
  // Rows the 8-tokens-in-lanes kernel also takes (no -inf lanes: no mask, whole vectors) get its
  // exps (exp2_offset), sums and weights bit for bit, so a row's weights do not depend on which
  // kernel routed it (a call split into tasks sends a task's last rows here); exp2_ps elsewhere
  // (it gives masked experts an exact 0).
  const bool lanes_bits = !al && E % 8 == 0;
  auto exps = [&](__m256 t) { return lanes_bits ? exp2_offset(t) : exp2_ps(t); };
  float inv = 1.f, sum = 1.f;
  if (softmax) {
    __m256 s0 = zero, s1 = zero;
    int64_t v = 0;
    for (; v + 2 <= nv; v += 2) {  // two vectors a step: no per-vector branch on the accumulator
      const __m256 e0 = exps(_mm256_fmsub_ps(_mm256_load_ps(xa + 8 * v), l2e, ml));
      const __m256 e1 = exps(_mm256_fmsub_ps(_mm256_load_ps(xa + 8 * v + 8), l2e, ml));
      _mm256_store_ps(sc + 8 * v, e0);
      _mm256_store_ps(sc + 8 * v + 8, e1);
      s0 = _mm256_add_ps(s0, e0);
      s1 = _mm256_add_ps(s1, e1);
    }
    if (v < nv) {
      const __m256 e = exps(_mm256_fmsub_ps(_mm256_load_ps(xa + 8 * v), l2e, ml));
      _mm256_store_ps(sc + 8 * v, e);
      s0 = _mm256_add_ps(s0, e);
    }
    sum = hsum_pairs(_mm256_add_ps(s0, s1));
    inv = 1.f / sum;
  } else if (s.sigmoid) {
    for (int64_t v = 0; v < nv; ++v) _mm256_store_ps(sc + 8 * v, sigmoid_ps(_mm256_load_ps(xr + 8 * v)));
  }
  // Selection keys: the allowed logits, or score + bias (-inf where the allowed logit is).
  const float* kp = xa;
  if (!on_x) {
    const __m256 vi = _mm256_set1_ps(inv);
    c0 = c1 = ninf;
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t rem = E - 8 * v;
      __m256 y = _mm256_load_ps(sc + 8 * v);
      if (softmax) y = _mm256_mul_ps(y, vi);
      if (!s.bias.empty()) {
        const float* bp = s.bias.data() + 8 * v;
        y = _mm256_add_ps(y, rem >= 8 ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, simd::first_lanes(rem)));
      }
      y = _mm256_blendv_ps(y, ninf, _mm256_cmp_ps(_mm256_load_ps(xa + 8 * v), ninf, _CMP_EQ_OQ));
      _mm256_store_ps(key + 8 * v, y);
      if (v & 1) c1 = _mm256_max_ps(c1, y); else c0 = _mm256_max_ps(c0, y);
    }
    kp = key;
  }
  if (groups) {  // the scalar row's group limit on the keys (a copy of the logits when those are the keys)
    if (kp != key) std::memcpy(key, kp, size_t(nv) * 32);
    kp = key;
    const int64_t gsz = E / s.groups;
    if (gsz % 8 == 0) {  // groups of whole vectors: lane-wise (largest, second largest), then across lanes
      for (int64_t g = 0; g < s.groups; ++g) {
        const float* p = key + g * gsz;
        __m256 a = _mm256_loadu_ps(p), a2 = ninf;
        for (int64_t i = 8; i < gsz; i += 8) {
          const __m256 v = _mm256_loadu_ps(p + i);
          a2 = _mm256_max_ps(a2, _mm256_min_ps(a, v));
          a = _mm256_max_ps(a, v);
        }
        const float A = hmax(a);
        if (s.group_mode == 0) { b.gs[g] = A; continue; }
        const __m256 at = _mm256_cmp_ps(a, _mm256_set1_ps(A), _CMP_EQ_OQ);  // the second is A again when 2 lanes hold it
        b.gs[g] = A + (__builtin_popcount(unsigned(_mm256_movemask_ps(at))) >= 2 ? A : std::max(hmax(a2), hmax(_mm256_blendv_ps(a, ninf, at))));
      }
      keep_groups(s, key, b.gs);
    } else {
      limit_groups(s, key, b.gs);
    }
    c0 = c1 = ninf;
    for (int64_t v = 0; v < nv; ++v)
      if (v & 1) c1 = _mm256_max_ps(c1, _mm256_load_ps(key + 8 * v)); else c0 = _mm256_max_ps(c0, _mm256_load_ps(key + 8 * v));
  }
  // Threshold: the k-th largest of g column maxima over disjoint expert sets.
  // (g = 2k to 4k columns: a tighter threshold than g = k, fewer candidates to rank; 16 for k 5..8
  // was ~10% fewer instructions a row than 8 at E 128.)
  int g = 16;
  if (k <= 4) { c0 = _mm256_max_ps(c0, c1); g = 8; }
  if (k <= 2) { c0 = _mm256_max_ps(c0, _mm256_permute2f128_ps(c0, c0, 1)); g = 4; }
  if (k <= 1) { c0 = _mm256_max_ps(c0, _mm256_permute_ps(c0, _MM_SHUFFLE(1, 0, 3, 2))); g = 2; }
  const float t = kth_largest(c0, c1, g, k);
  if (!(t > kNegInf)) return RowResult::scalar;  // -inf keys may be chosen: the scalar row decides
  // Candidates >= t in expert order (whole 8-lane stores: the buffers hold E + 80).
  const __m256 vt = _mm256_set1_ps(t);
  float* cv = b.cand;
  int32_t* ci = b.cand_id;
  int n = 0;
  for (int64_t v = 0; v < nv; ++v) {
    const __m256 x = _mm256_load_ps(kp + 8 * v);
    const unsigned m = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(x, vt, _CMP_GE_OQ)));
    const __m256i p = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.data() + 8 * m)));
    _mm256_storeu_ps(cv + n, _mm256_permutevar8x32_ps(x, p));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ci + n), _mm256_add_epi32(p, _mm256_set1_epi32(int(8 * v))));
    n += __builtin_popcount(m);
    if (n > kMaxCand) return RowResult::scalar;  // flat rows: the scalar row
  }
  const float* cc = cv;  // b.cand: 64-byte aligned
  _mm256_storeu_ps(cv + n, ninf);
  alignas(32) int32_t rk[kMaxCand + 8];
  // Ranks: a permutation of 0..n-1 (sum n(n-1)/2) exactly when no two candidates tie; else again
  // with ties to the lower id (still a permutation).
  if (rank_candidates<false>(cc, n, rk) != n * (n - 1) / 2) rank_candidates<true>(cc, n, rk);
  alignas(32) int32_t ids[kMaxCand + 8];  // every candidate in rank order (no branch a candidate)
  alignas(32) float kv[kMaxCand + 8];
  for (int i = 0; i < n; ++i) { ids[rk[i]] = ci[i]; kv[rk[i]] = cc[i]; }
  // Weights.
  float* vals = b.vals;
  if (s.select == Select::topk_softmax) {  // softmax over the k chosen logits (kv[0] their max)
    const __m256 m0 = _mm256_set1_ps(kv[0] * kLog2e);
    __m256 e[2];
    alignas(32) float ev[16];
    for (int q = 0; q < (k + 7) / 8; ++q) {
      e[q] = _mm256_and_ps(exps(_mm256_fmsub_ps(_mm256_loadu_ps(kv + 8 * q), l2e, m0)), _mm256_castsi256_ps(simd::first_lanes(k - 8 * q)));
      _mm256_store_ps(ev + 8 * q, e[q]);
    }
    float esum = 0.f;  // in order, as the lanes kernel sums the chosen
    for (int64_t j = 0; j < k; ++j) esum += ev[j];
    const __m256 vi = _mm256_set1_ps(1.f / esum);
    for (int q = 0; q < (k + 7) / 8; ++q) _mm256_storeu_ps(vals + 8 * q, _mm256_mul_ps(e[q], vi));
  } else {  // the chosen scores by a gather (ids in rank order), one multiply
    __m256 y[2];
    for (int q = 0; q < (k + 7) / 8; ++q) {
      const __m256 m = _mm256_castsi256_ps(simd::first_lanes(k - 8 * q));
      y[q] = _mm256_mask_i32gather_ps(zero, sc, _mm256_load_si256(reinterpret_cast<const __m256i*>(ids + 8 * q)), m, 4);
      _mm256_storeu_ps(vals + 8 * q, y[q]);
    }
    float mul = softmax ? (s.select == Select::gating ? s.scale : 1.f) / sum : 1.f;
    if (!softmax && s.select == Select::gating) {  // sigmoid gating: the sum in the scalar row's order
      float ssum = 0;
      for (int64_t j = 0; j < k; ++j) ssum += vals[j];
      mul = s.scale / (ssum + s.eps);
    }
    const __m256 vm = _mm256_set1_ps(mul);
    for (int q = 0; q < (k + 7) / 8; ++q) _mm256_storeu_ps(vals + 8 * q, _mm256_mul_ps(y[q], vm));
  }
  write_row8(s, r, row, ids, vals);
  if (s.scores) {
    float* out = r.scores.ptr<float>() + row * E;
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t v = 0;
    for (; 8 * v + 8 <= E; ++v) _mm256_storeu_ps(out + 8 * v, _mm256_mul_ps(_mm256_load_ps(sc + 8 * v), vi));
    for (int64_t e = 8 * v; e < E; ++e) out[e] = sc[e] * inv;
  }
  return RowResult::done;
}

}  // namespace

bool route_rows_avx2(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  bool valid = true;
  for (int64_t row = r0; row < r1; ++row) {
    const RowResult res = route_row(s, r, row, b);
    if (res == RowResult::bad) valid = false;
    else if (res == RowResult::scalar && !route_row_scalar(s, r, row, b)) valid = false;
  }
  return valid;
}

}  // namespace ot::moe::impl
