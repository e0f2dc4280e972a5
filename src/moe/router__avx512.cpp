// Routers, AVX-512 rows (k <= 16): vectorised exp for softmax / sigmoid, and a top-k that decides
// exactly or hands the row back to the scalar path. The top-k takes a threshold t that at least k
// elements reach (the smallest of k maxima over disjoint sets of columns), compresses the few
// candidates >= t, and ranks them by counting; ranks that are not a permutation (a tie) or too
// many candidates send the row to route_row_scalar, so ids always match the scalar order
// (descending, ties to the lower expert id).
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

// e^x (gemm::vm::exp_unclamped); Clamp limits x to [-104, 89], where it is about 1 ulp. Unclamped
// it serves finite softmax arguments (<= 0) and gives NaN for x = -inf.
template <bool Clamp = true> inline __m512 exp_ps(__m512 x) {
  if (Clamp) x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
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

}  // namespace

bool route_rows_avx512(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  bool valid = true;
  const int64_t E = s.E, k = s.k, nv = (E + 15) / 16;
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  const bool softmax = s.select != Select::topk_softmax && !s.sigmoid;
  // Sigmoid of every expert only when selection or the scores output needs it; else of the k chosen.
  const bool sig_all = s.sigmoid && (!on_x || s.scores);
  const DType xt = s.x.dtype;
  float* scores = s.scores ? r.scores.ptr<float>() : nullptr;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  for (int64_t row = r0; row < r1; ++row) {
    const char* xp = static_cast<const char*>(s.x.data) + size_t(row * E) * dtype_size(xt);
    const uint8_t* al = s.allowed ? s.allowed + row * E : nullptr;
    // Pass 1: logits (padding -inf), the allowed lanes, the max over them and (on logits) the key.
    __m512 vmax = ninf;
    __mmask16 bad = 0;
    for (int64_t v = 0; v < nv; ++v) {
      __mmask16 m = lanes(E - 16 * v), a = m;
      if (al) a &= _mm_test_epi8_mask(_mm_maskz_loadu_epi8(m, al + 16 * v), _mm_set1_epi8(-1));
      __m512 x = load16(xp, xt, 16 * v, m);
      bad |= _mm512_mask_fpclass_ps_mask(m, x, 0x99);  // NaN or +-Inf
      _mm512_store_ps(b.xr + 16 * v, x);
      b.amask[v] = a;
      __m512 xa = _mm512_mask_blend_ps(a, ninf, x);
      if (on_x && (al || groups)) _mm512_store_ps(b.key + 16 * v, xa);  // else the key is xr itself
      vmax = _mm512_max_ps(vmax, xa);
    }
    if (al) {
      int n = 0;
      for (int64_t v = 0; v < nv; ++v) n += __builtin_popcount(b.amask[v]);
      bad |= n < k;
    }
    if (bad) { valid = false; continue; }
    // Pass 2: scores (softmax over the allowed: unnormalised exps and their sum; sigmoid) and,
    // when selection is not on the logits, the key: score (+ bias), -inf where disallowed.
    float inv = 1.f;
    if (softmax) {
      const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
      __m512 vs = _mm512_setzero_ps();
      for (int64_t v = 0; v < nv; ++v) {
        // Disallowed and padding lanes (-inf: NaN unclamped) are zeroed by the mask.
        __m512 e = _mm512_maskz_mov_ps(b.amask[v], exp_ps<false>(_mm512_sub_ps(_mm512_load_ps(b.xr + 16 * v), vm)));
        _mm512_store_ps(b.sc + 16 * v, e);
        vs = _mm512_add_ps(vs, e);
      }
      inv = 1.f / _mm512_reduce_add_ps(vs);
    } else if (sig_all) {
      for (int64_t v = 0; v < nv; ++v) _mm512_store_ps(b.sc + 16 * v, sigmoid_ps(_mm512_load_ps(b.xr + 16 * v)));
    }
    if (!on_x) {
      const __m512 vi = _mm512_set1_ps(inv);
      for (int64_t v = 0; v < nv; ++v) {
        __m512 sc = _mm512_load_ps(b.sc + 16 * v);
        if (softmax) sc = _mm512_mul_ps(sc, vi);
        if (!s.bias.empty()) sc = _mm512_add_ps(sc, load16(s.bias.data(), DType::f32, 16 * v, lanes(E - 16 * v)));
        _mm512_store_ps(b.key + 16 * v, _mm512_mask_blend_ps(b.amask[v], ninf, sc));
      }
    }
    const float* key = on_x && !al && !groups ? b.xr : b.key;
    if (groups) limit_groups_vec(s, b.key, b.gs);
    if (!topk16(key, nv, k, b.ki, b.kv, b)) { route_row_scalar(s, r, row, b); continue; }
    // Weights of the chosen experts.
    float* vals = b.vals;
    if (s.select == Select::topk_softmax) {  // softmax over the k chosen logits (kv[0] is their max)
      __mmask16 m = lanes(k);
      __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, b.kv), _mm512_set1_ps(b.kv[0]))));
      _mm512_mask_storeu_ps(vals, m, _mm512_mul_ps(e, _mm512_set1_ps(1.f / _mm512_reduce_add_ps(e))));
    } else if (softmax) {
      float mul = inv * (s.select == Select::gating ? s.scale : 1.f);
      for (int64_t j = 0; j < k; ++j) vals[j] = b.sc[b.ki[j]] * mul;
    } else {  // sigmoid, renormalised over the k
      if (sig_all) {
        for (int64_t j = 0; j < k; ++j) vals[j] = b.sc[b.ki[j]];
      } else {
        for (int64_t j = 0; j < k; ++j) vals[j] = b.xr[b.ki[j]];
        __mmask16 m = lanes(k);
        _mm512_mask_storeu_ps(vals, m, sigmoid_ps(_mm512_maskz_loadu_ps(m, vals)));
      }
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += vals[j];
      float mul = s.scale / (sum + s.eps);
      for (int64_t j = 0; j < k; ++j) vals[j] *= mul;
    }
    write_row(s, r, row, b.ki, vals);
    if (scores) {
      const __m512 vi = _mm512_set1_ps(inv);
      for (int64_t v = 0; v < nv; ++v)
        _mm512_mask_storeu_ps(scores + row * E + 16 * v, lanes(E - 16 * v), softmax ? _mm512_mul_ps(_mm512_load_ps(b.sc + 16 * v), vi)
                                                                                      : _mm512_load_ps(b.sc + 16 * v));
    }
  }
  return valid;
}

}  // namespace ot::moe::impl
