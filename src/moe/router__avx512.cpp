// Routers, AVX-512 rows (k <= 16), in blocks of kRouterBlock rows carried phase by phase (one row is
// a long dependency chain: the block lets the core overlap rows). Softmax exps by a degree-5 2^x
// (only the sum needs all of them), sigmoids by a reciprocal estimate. Top-k: the threshold t is the
// k-th largest of the 16 column maxima (k distinct elements reach it), the ~10 candidates >= t are
// compressed in expert order and ranked by counting (ties to the lower id, exactly); more than 16
// candidates go to the older general vector top-k (up to 64), a -inf threshold or a tie there to
// route_row_scalar, so ids always match the scalar order (descending, ties to the lower expert id).
#include <algorithm>
#include <cmath>
#include <limits>

#include "src/core/cvt_avx512.h"
#include "src/gemm/vec_math_avx512.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"

namespace ot::moe::impl {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxCand = 64;

// e^x (gemm::vm::exp_unclamped) with x limited to [-104, 89], where it is about 1 ulp.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
  return gemm::vm::exp_unclamped(x);
}
// 1 / (1 + e^-x): reciprocal estimate (2^-14) and one Newton step (about 1 ulp; vdivps is slow).
inline __m512 sigmoid_ps(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  __m512 d = _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x)));
  __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.f)));
}

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// 16 floats of a row (masked lanes read as -inf).
inline __m512 load16(const void* base, DType t, int64_t i, __mmask16 m) {
  const bool full = m == 0xffff;  // plain loads where possible: masked ones are slower on some cores
  __m512 v;
  if (t == DType::f32) {
    const float* p = static_cast<const float*>(base) + i;
    v = full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    __m256i h = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
    v = t == DType::bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h);
  }
  return full ? v : _mm512_mask_blend_ps(m, _mm512_set1_ps(kNegInf), v);
}

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
  __m512 cm = _mm512_load_ps(key);
  for (int64_t v = 1; v < nv; ++v) cm = _mm512_max_ps(cm, _mm512_load_ps(key + 16 * v));
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
    __m512 x = _mm512_load_ps(key + 16 * v);
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

constexpr float kLog2e = 1.44269504088896341f;

// 2^t for t <= 0 (softmax arguments, pre-scaled by log2 e): degree-5 polynomial on the fractional
// part (relative error 2.4e-7, about 2 ulp) and vscalefps; 0 below the fp32 range, NaN for -inf.
// Cheaper than the degree-7 e^x: every expert's exp is on the router's critical path, and the
// tests' fp32 tolerance (1e-5) leaves room.
inline __m512 exp2_ps(__m512 t) {
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3276446843519807e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.675533510744572e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550713092088699e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022120237350464f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931469440460205f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  return _mm512_scalef_ps(p, n);
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

// Top k (1 <= k <= 16) of key[0, 16 nv) given its column maxima cm: ids and values descending in
// lanes 0..k-1 (ties to the lower id). The threshold t is the k-th largest column maximum (k distinct
// elements reach it; about 10 candidates >= t for E 128, k 8); the candidates are compressed in
// expert order and ranked exactly. False (nothing decided) when t is -inf or more than 16 candidates.
bool topk_fast(const float* key, int64_t nv, int64_t k, __m512 cm, __m512i& ids, __m512& vals, RouterScratch& b) {
  const __m512i vk = _mm512_set1_epi32(int(k));
  float* cv = b.cand;
  int32_t* ci = b.cand_id;
  _mm512_store_ps(cv, cm);
  const float t = _mm512_mask_reduce_min_ps(_mm512_cmplt_epi32_mask(rank16<false>(cv, cm), vk), cm);
  if (!(t > kNegInf)) return false;  // -inf may be chosen (masked experts): scalar decides
  const __m512 vt = _mm512_set1_ps(t);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int n = 0;
  for (int64_t v = 0; v < nv; ++v, idx = _mm512_add_epi32(idx, step)) {  // no branches: the buffers hold E + 16
    __m512 x = _mm512_load_ps(key + 16 * v);
    __mmask16 m = _mm512_cmp_ps_mask(x, vt, _CMP_GE_OQ);
    _mm512_storeu_ps(cv + n, _mm512_maskz_compress_ps(m, x));
    _mm512_storeu_si512(ci + n, _mm512_maskz_compress_epi32(m, idx));
    n += __builtin_popcount(m);
  }
  if (n > 16) return false;
  const __mmask16 valid = lanes(n);
  _mm512_mask_storeu_ps(cv, __mmask16(~valid), _mm512_set1_ps(kNegInf));
  const __m512 c = _mm512_loadu_ps(cv);
  // Ranks of the candidates: 0..n-1 (padding -inf ranks after them). Ties among candidates are
  // rare (bf16 logits): the strict count shows them as a short rank sum and the exact count follows.
  __m512i rank = rank16<false>(cv, c);
  if (_mm512_mask_reduce_add_epi32(valid, rank) != n * (n - 1) / 2) rank = rank16<true>(cv, c);
  alignas(64) int32_t rk[16];
  _mm512_store_si512(rk, rank);
  for (uint32_t sel = _mm512_mask_cmplt_epi32_mask(valid, rank, vk); sel; sel &= sel - 1) {
    const int i = __builtin_ctz(sel);
    b.ki[rk[i]] = ci[i];
    b.kv[rk[i]] = cv[i];
  }
  const __mmask16 mk = lanes(k);
  ids = _mm512_maskz_loadu_epi32(mk, b.ki);
  vals = _mm512_maskz_loadu_ps(mk, b.kv);
  return true;
}

// write_row from registers: ids (E for finished rows), weights cast to y's dtype, v1 row_idx.
void write_row16(const RouterSpec& s, GatingResult& r, int64_t row, __m512i ids, __m512 w) {
  const int64_t k = s.k;
  const __mmask16 m = lanes(k);
  if (s.finished && s.finished[row]) ids = _mm512_set1_epi32(int(s.E));
  _mm512_mask_storeu_epi32(r.expert_idx.ptr<int32_t>() + row * k, m, ids);
  const DType yt = r.y.dtype();
  if (yt == DType::f32) {
    _mm512_mask_storeu_ps(r.y.ptr<float>() + row * k, m, w);
  } else {
    __m256i h = yt == DType::bf16 ? simd::f32_to_bf16x16(w) : simd::f32_to_f16x16(w);
    _mm256_mask_storeu_epi16(r.y.ptr<uint16_t>() + row * k, m, h);
  }
  if (s.row_idx) {
    __m512i j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _mm512_mask_storeu_epi32(r.row_idx.ptr<int32_t>() + row * k, m,
                             _mm512_add_epi32(_mm512_mullo_epi32(j, _mm512_set1_epi32(int32_t(s.R))), _mm512_set1_epi32(int32_t(row))));
  }
}

}  // namespace

bool route_rows_avx512(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  bool valid = true;
  const int64_t E = s.E, k = s.k, nv = (E + 15) / 16, st = b.stride;
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  // Softmax over all experts (its sum is needed) unless the weights are a softmax over the k chosen.
  const bool softmax = s.select != Select::topk_softmax && !s.sigmoid;
  // Scores of every expert are kept in b.sc when selection or the scores output needs them.
  const bool keep_sc = !on_x || s.scores;
  const DType xt = s.x.dtype;
  float* scores = s.scores ? r.scores.ptr<float>() : nullptr;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  const __mmask16 mk = lanes(k);
  // Each phase runs over a block of rows before the next starts, so the rows' long dependency
  // chains (max -> exps -> sum; threshold -> candidates -> ranks) overlap.
  __m512 cm[kRouterBlock], kv[kRouterBlock];
  __m512i ki[kRouterBlock];
  float mx[kRouterBlock], inv[kRouterBlock];
  float* xa[kRouterBlock];
  for (int64_t r0b = r0; r0b < r1; r0b += kRouterBlock) {
    const int nb = int(std::min<int64_t>(kRouterBlock, r1 - r0b));
    uint32_t skip = 0, slow = 0;  // rows failing check_rows; rows left to the scalar path
    // Pass 1: logits (xr, padding -inf), finiteness, the allowed logits xa (-inf elsewhere: key
    // when masked, else xr itself) and their column maxima.
    for (int i = 0; i < nb; ++i) {
      const int64_t row = r0b + i;
      float *xr = b.xr + i * st, *key = b.key + i * st;
      const char* xp = static_cast<const char*>(s.x.data) + size_t(row * E) * dtype_size(xt);
      const uint8_t* al = s.allowed ? s.allowed + row * E : nullptr;
      __m512 c = ninf;
      __mmask16 bad = 0;
      int n_allowed = 0;
      for (int64_t v = 0; v < nv; ++v) {
        __mmask16 m = lanes(E - 16 * v), a = m;
        if (al) {
          a &= _mm_test_epi8_mask(_mm_maskz_loadu_epi8(m, al + 16 * v), _mm_set1_epi8(-1));
          n_allowed += __builtin_popcount(a);
        }
        __m512 x = load16(xp, xt, 16 * v, m);
        bad |= _mm512_mask_fpclass_ps_mask(m, x, 0x99);  // NaN or +-Inf
        _mm512_store_ps(xr + 16 * v, x);
        if (al) {
          x = _mm512_mask_blend_ps(a, ninf, x);
          _mm512_store_ps(key + 16 * v, x);
        }
        c = _mm512_max_ps(c, x);
      }
      if (bad || (al && n_allowed < k)) { valid = false; skip |= 1u << i; }
      cm[i] = c;
      xa[i] = al ? key : xr;
    }
    // Pass 2: softmax exps and their sum, or sigmoids; then the keys when not the logits.
    for (int i = 0; i < nb; ++i) {
      if (skip >> i & 1) continue;
      float* sc = b.sc + i * st;
      mx[i] = _mm512_reduce_max_ps(cm[i]);  // the largest allowed logit
      inv[i] = 1.f;
      if (softmax) {
        const __m512 ml = _mm512_set1_ps(mx[i] * kLog2e);
        __m512 vs = _mm512_setzero_ps();
        for (int64_t v = 0; v < nv; ++v) {
          __m512 x = _mm512_load_ps(xa[i] + 16 * v);  // -inf lanes: exp2_ps gives NaN, masked to 0
          __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_OQ), exp2_ps(_mm512_fmsub_ps(x, _mm512_set1_ps(kLog2e), ml)));
          if (keep_sc) _mm512_store_ps(sc + 16 * v, e);
          vs = _mm512_add_ps(vs, e);
        }
        inv[i] = 1.f / _mm512_reduce_add_ps(vs);
      } else if (s.sigmoid && keep_sc) {
        for (int64_t v = 0; v < nv; ++v) _mm512_store_ps(sc + 16 * v, sigmoid_ps(_mm512_load_ps(b.xr + i * st + 16 * v)));
      }
      if (!on_x) {
        float* key = b.key + i * st;
        const __m512 vi = _mm512_set1_ps(inv[i]);
        __m512 c = ninf;
        for (int64_t v = 0; v < nv; ++v) {
          __m512 y = _mm512_load_ps(sc + 16 * v);
          if (softmax) y = _mm512_mul_ps(y, vi);
          if (!s.bias.empty()) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(lanes(E - 16 * v), s.bias.data() + 16 * v));
          y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_load_ps(xa[i] + 16 * v), ninf, _CMP_NEQ_OQ), ninf, y);
          _mm512_store_ps(key + 16 * v, y);
          c = _mm512_max_ps(c, y);
        }
        cm[i] = c;
        xa[i] = key;  // from here on: the selection key
      }
      if (groups) {
        float* key = xa[i];
        limit_groups_vec(s, key, b.gs);
        __m512 c = _mm512_load_ps(key);
        for (int64_t v = 1; v < nv; ++v) c = _mm512_max_ps(c, _mm512_load_ps(key + 16 * v));
        cm[i] = c;
      }
    }
    // Top k: sorted ids and selection values in lanes < k.
    for (int i = 0; i < nb; ++i) {
      if (skip >> i & 1) continue;
      if (topk_fast(xa[i], nv, k, cm[i], ki[i], kv[i], b)) continue;
      if (!topk16(xa[i], nv, k, b.ki, b.kv, b)) { slow |= 1u << i; continue; }
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
        __m512 e = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(kv[i], _mm512_set1_ps(kLog2e), _mm512_set1_ps(mx[i] * kLog2e))));
        w = _mm512_mul_ps(e, _mm512_set1_ps(1.f / _mm512_reduce_add_ps(e)));
      } else {
        __m512 y = !on_x     ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, ki[i], sc, 4)
                   : softmax ? exp2_ps(_mm512_fmsub_ps(kv[i], _mm512_set1_ps(kLog2e), _mm512_set1_ps(mx[i] * kLog2e)))
                             : sigmoid_ps(kv[i]);
        y = _mm512_maskz_mov_ps(mk, y);
        float mul = softmax ? inv[i] * (s.select == Select::gating ? s.scale : 1.f) : s.scale / (_mm512_reduce_add_ps(y) + s.eps);
        w = _mm512_mul_ps(y, _mm512_set1_ps(mul));
      }
      write_row16(s, r, row, ki[i], w);
      if (scores) {
        const __m512 vi = _mm512_set1_ps(inv[i]);
        for (int64_t v = 0; v < nv; ++v) {
          __m512 y = _mm512_load_ps(sc + 16 * v);
          _mm512_mask_storeu_ps(scores + row * E + 16 * v, lanes(E - 16 * v), softmax ? _mm512_mul_ps(y, vi) : y);
        }
      }
    }
    for (; slow; slow &= slow - 1) route_row_scalar(s, r, r0b + __builtin_ctz(slow), b);  // uses row slot 0: last
  }
  return valid;
}

}  // namespace ot::moe::impl
