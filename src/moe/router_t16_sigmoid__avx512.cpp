// gating_top_k with sigmoid scores (DeepSeek-V3: bias for selection only, group-limited top-k,
// renorm, routed scaling), 16 tokens in the lanes (the layout of router_t16__avx512.cpp). Per
// block of 16 rows:
// - row-wise: the logits' sigmoids (as the row kernel computes them, so the keys are the same
//   fp32 values) + bias = the selection keys, stored for the block (16 x E floats);
// - the group scores: each row's groups folded lane-wise into (largest, second largest) over their
//   vectors, then one transposing tree per group for the 16 rows (lane = row): max, or the top-2 sum;
// - the k_group best groups per lane: a vertical sorting network gives the k_group-th best score,
//   the groups above it and then the lowest groups equal to it are kept (ties to the lower group);
// - row-wise again: the column maxima over the kept groups give each row's threshold (the k-th largest, per lane after a transpose and a network);
//   the candidates >= it among the kept groups' experts are compressed as byte ids, then selected per lane as in the softmax
//   kernel (64-bit (value, id) keys: ties to the lower id exactly);
// - the weights: the k chosen logits gathered, k vertical sigmoids, their sum, the scaling.
// Partial blocks and rows of more than 16 candidates are done as in the softmax kernel.
#include "src/moe/router_t16__avx512.h"

#include "src/moe/router_vbmi_begin.h"

namespace ot::moe::impl {
using namespace rsimd;
using namespace t16;
namespace {

// Per lane (row), the bits of the k_group best groups of gs[0, G) (ties to the lower group). N: the
// sorting network's inputs (8 where G <= 8 is known at compile time: 19 comparators, not 63).
template <int N>
OT_T16_AI inline __m512i keep_groups16(const __m512* gs, int64_t G, int64_t k_group) {
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  const __m512i one = _mm512_set1_epi32(1);
  __m512 srt[N];
  for (int g = 0; g < N; ++g) srt[g] = g < G ? gs[g] : ninf;
  sort_lanes<N, N>(srt);
  const __m512 tg = srt[k_group - 1];
  __m512i above = _mm512_setzero_si512(), taken = _mm512_setzero_si512(), kept = _mm512_setzero_si512();
  for (int g = 0; g < G; ++g) above = _mm512_mask_add_epi32(above, _mm512_cmp_ps_mask(gs[g], tg, _CMP_GT_OQ), above, one);
  const __m512i need = _mm512_sub_epi32(_mm512_set1_epi32(int32_t(k_group)), above);
  for (int g = 0; g < G; ++g) {
    const __mmask16 eq = _mm512_cmp_ps_mask(gs[g], tg, _CMP_EQ_OQ) & _mm512_cmplt_epi32_mask(taken, need);
    taken = _mm512_mask_add_epi32(taken, eq, taken, one);
    kept = _mm512_mask_or_epi32(kept, eq | _mm512_cmp_ps_mask(gs[g], tg, _CMP_GT_OQ), kept, _mm512_set1_epi32(1 << g));
  }
  return kept;
}

// The ids of a row's keys >= th among its kept vectors (bit v of vk: vector v), in expert order, as
// bytes into cb (n + 64 bytes); returns n. Four kept vectors a byte compress, their masks and ids
// built in registers (at 4 of 8 groups: 2 compresses a row, was 4 over every vector, with the masks
// stored to an array and reloaded).
OT_T16_AI inline int kept_candidates(const float* kr, uint32_t vk, __m512 th, uint8_t* cb) {
  int n = 0;
  while (vk) {
    __mmask16 m[4];
    __m128i id[4];
    for (int j = 0; j < 4; ++j) {
      const int v = vk ? __builtin_ctz(vk) : 0;
      m[j] = vk ? _mm512_cmp_ps_mask(_mm512_load_ps(kr + 16 * v), th, _CMP_GE_OQ) : __mmask16(0);
      id[j] = _mm_load_si128(reinterpret_cast<const __m128i*>(kIota8.data() + 16 * v));
      vk &= vk - 1;
    }
    const __mmask64 mm = _mm512_kunpackd(_mm512_kunpackw(m[3], m[2]), _mm512_kunpackw(m[1], m[0]));
    const __m512i ids = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(id[0]), id[1], 1)),
                                           _mm256_inserti128_si256(_mm256_castsi128_si256(id[2]), id[3], 1), 1);
    _mm512_storeu_si512(cb + n, _mm512_maskz_compress_epi8(mm, ids));
    n += int(__builtin_popcountll(mm));
  }
  return n;
}

// The selection keys: the logits (sigmoid without bias and without the top-2 sum: same order), the
// sigmoids, or the sigmoids + bias.
enum class Key { logits, sigmoid, sigmoid_bias };

// Pass 1 for one row: its keys into kr (and the fp32 copy into cp unless Direct); the lanes of
// non-finite logits or'ed into bad; returns the column maxima of the keys (Max: else -inf, the
// group limit computes its own). pf: the row to prefetch (a line a vector), or null.
template <int NV, bool Direct, Key KM, bool Max>
OT_T16_AI inline __m512 keys_row(const char* xp, DType xt, int64_t nv, const float* bias, float* cp, float* kr, __mmask16& bad, const char* pf) {
  const int64_t n = NV > 0 ? NV : nv;
  __m512 c = _mm512_set1_ps(kNegInf);
  __mmask16 b0 = 0, b1 = 0;  // two accumulators: short dependency chains
#pragma GCC unroll 16
  for (int64_t v = 0; v < n; ++v) {
    if (pf) _mm_prefetch(pf + (Direct ? 64 : 32) * v, _MM_HINT_T0);  // the vector's bytes (bf16: each line twice)
    const __m512 x = Direct ? _mm512_loadu_ps(reinterpret_cast<const float*>(xp) + 16 * v) : load16(xp, xt, 16 * v, 0xffff);
    if (!Direct) _mm512_store_ps(cp + 16 * v, x);
    const __mmask16 nf = _mm512_fpclass_ps_mask(x, 0x99);  // NaN (quiet, signalling), +Inf, -Inf
    if (v & 1) b1 |= nf; else b0 |= nf;
    const __m512 y = KM == Key::logits ? x : KM == Key::sigmoid ? sigmoid_ps(x) : sigmoid_add_ps(x, _mm512_loadu_ps(bias + 16 * v));
    _mm512_store_ps(kr + 16 * v, y);
    if (Max) c = _mm512_max_ps(c, y);
  }
  bad |= b0 | b1;
  return c;
}

// Group limit for the block (M_, G_ > 0: vectors a group and groups fixed at compile time): the
// group scores per lane, the k_group best groups kept; cm[i]: the column maxima of row i's kept
// keys, vkeep[i]: bit v set where row i's vector v is in a kept group (the other groups' keys are
// left as they are: the candidates are taken from the kept vectors only).
template <int M_, int G_>
OT_T16_AI inline void limit_groups16(const RouterSpec& s, const float* keys, int64_t E, int64_t nv, __m512* cm, uint32_t* vkeep) {
  const int64_t G = G_ > 0 ? G_ : s.groups, M = M_ > 0 ? M_ : nv / G;
  const bool top2 = s.group_mode == 1;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  __m512 gs[16];
  for (int64_t g = 0; g < G; ++g) {
    auto fold = [&](int i, __m512* f) OT_T16_AI {  // each lane's largest and second largest over the group's vectors
      const float* p = keys + i * E + g * M * 16;
      __m512 x = _mm512_load_ps(p), y = ninf;
      for (int64_t j = 1; j < M; ++j) {
        const __m512 v = _mm512_load_ps(p + 16 * j);
        if (top2) y = _mm512_max_ps(y, _mm512_min_ps(x, v));
        x = _mm512_max_ps(x, v);
      }
      f[0] = x;
      f[1] = y;
    };
    gs[g] = top2 ? group_score16<true>(fold) : group_score16<false>(fold);
  }
  alignas(64) int32_t kept[16];
  _mm512_store_si512(kept, keep_groups16<(G_ > 0 && G_ <= 8) ? 8 : 16>(gs, G, s.k_group));
  const uint32_t group_bits = (1u << M) - 1;
  for (int i = 0; i < 16; ++i) {
    const float* kr = keys + i * E;
    __m512 c = ninf;
    uint32_t vk = 0;
    for (uint32_t u = uint32_t(kept[i]); u; u &= u - 1) {
      const int64_t v = __builtin_ctz(u) * M;
      vk |= group_bits << v;
      for (int64_t j = 0; j < M; ++j) c = _mm512_max_ps(c, _mm512_load_ps(kr + 16 * (v + j)));
    }
    cm[i] = c;
    vkeep[i] = vk;
  }
}

// NV > 0: rows of exactly NV vectors; K > 0: k == K (networks pruned at compile time).
template <int NV, bool Direct, int K>
bool t16_sigmoid_rows(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  constexpr int Live = K > 0 ? K : 16;
  const int64_t E = NV > 0 ? 16 * NV : s.E, nv = E / 16, k = s.k;
  const DType xt = s.x.dtype;
  const size_t row_bytes = size_t(E) * dtype_size(xt);
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  const Key km = on_x ? Key::logits : s.bias.empty() ? Key::sigmoid : Key::sigmoid_bias;
  const int64_t M = nv / s.groups;  // vectors a group (t16_sigmoid_applies: whole vectors)
  float* scores = s.scores ? r.scores.ptr<float>() : nullptr;
  const __m512 zero = _mm512_setzero_ps();
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i jr = _mm512_mullo_epi32(iota, _mm512_set1_epi32(int32_t(s.R)));
  const __m512i rowoff = _mm512_mullo_epi32(iota, _mm512_set1_epi32(int32_t(E)));
  float* copy = Direct ? nullptr : b.xr;  // fp32 copies of a block's bf16 / fp16 rows (stride E)
  float* keys = b.key16;                  // the block's selection keys (stride E)
  alignas(64) uint8_t cb[16 * 16 + 256 + 64];
  alignas(64) float tha[16];
  alignas(64) int32_t ncand[16];
  for (int64_t rb = r0; rb + 16 <= r1; rb += 16) {
    const char* xb = static_cast<const char*>(s.x.data) + size_t(rb) * row_bytes;
    const float* xf = Direct ? reinterpret_cast<const float*>(xb) : copy;
    // Pass 1: keys (and the fp32 copy), finiteness, the column maxima; the scores output.
    __m512 cm[16];
    __mmask16 bad = 0;
    for (int i = 0; i < 16; ++i) {
      const char* xp = xb + size_t(i) * row_bytes;
      const char* pf = rb + 32 <= s.R ? xp + 16 * row_bytes : nullptr;
      float *kr = keys + i * E, *cp = Direct ? nullptr : copy + i * E;
      cm[i] = km == Key::sigmoid_bias ? (groups ? keys_row<NV, Direct, Key::sigmoid_bias, false>(xp, xt, nv, s.bias.data(), cp, kr, bad, pf)
                                                : keys_row<NV, Direct, Key::sigmoid_bias, true>(xp, xt, nv, s.bias.data(), cp, kr, bad, pf))
              : km == Key::sigmoid    ? keys_row<NV, Direct, Key::sigmoid, true>(xp, xt, nv, nullptr, cp, kr, bad, pf)
                                      : keys_row<NV, Direct, Key::logits, true>(xp, xt, nv, nullptr, cp, kr, bad, pf);
      if (scores)
        for (int64_t v = 0; v < nv; ++v) _mm512_storeu_ps(scores + (rb + i) * E + 16 * v, sigmoid_ps(_mm512_loadu_ps(xf + i * E + 16 * v)));
    }
    if (bad) return false;
    uint32_t vkeep[16];
    if (groups) {
      if (NV == 16 && M == 2) limit_groups16<2, 8>(s, keys, E, nv, cm, vkeep);
      else if (M == 1) limit_groups16<1, 0>(s, keys, E, nv, cm, vkeep);
      else limit_groups16<0, 0>(s, keys, E, nv, cm, vkeep);
    }
    // Thresholds per lane: the k-th largest column maximum.
    transpose16(cm);
    sort_lanes<Live>(cm);
    _mm512_store_ps(tha, cm[k - 1]);
    // Candidates (ids as bytes at cb + 16 i; a row's stores run into the next rows', written after it).
    for (int i = 0; i < 16; ++i) {
      const float* kr = keys + i * E;
      const __m512 th = _mm512_set1_ps(tha[i]);
      ncand[i] = groups ? kept_candidates(kr, vkeep[i], th, cb + 16 * i) : topk_collect_bytes(kr, nv, th, cb + 16 * i);
    }
    const __m512i nc = _mm512_load_si512(ncand);
    const __mmask16 slow = _mm512_cmpgt_epi32_mask(nc, _mm512_set1_epi32(16));
    __m512i sid[16];
    __m512 sval[16];
    select16<Live, NV>(cb, nc, slow, keys, E, k, sid, sval);
    // Weights: the chosen experts' sigmoids (unbiased), renormalised and scaled.
    __m512 w[16], ids[16], sum = zero;
    for (int j = 0; j < 16; ++j) {
      if (j >= k) { w[j] = zero; ids[j] = zero; continue; }
      const __m512 lg = on_x ? sval[j] : _mm512_mask_i32gather_ps(zero, __mmask16(~slow), _mm512_add_epi32(rowoff, sid[j]), xf, 4);
      w[j] = sigmoid_ps(lg);
      sum = _mm512_add_ps(sum, w[j]);
      ids[j] = _mm512_castsi512_ps(sid[j]);
    }
    const __m512 mul = _mm512_div_ps(_mm512_set1_ps(s.scale), _mm512_add_ps(sum, _mm512_set1_ps(s.eps)));
    scale_and_transpose(ids, w, k, mul);
    if constexpr (K == 8) {
      write_pairs8(s, r, rb, ids, w);  // (the rows of many candidates are rewritten below)
    } else {
      for (int i = 0; i < 16; ++i)
        if (!(slow >> i & 1)) write_row16(s, r, rb + i, _mm512_castps_si512(ids[i]), w[i], (rb + i) * k + 16 <= r1 * k, jr);
    }
    // Rows of more than 16 candidates: an insertion over them (in expert order; strict '>' keeps
    // the lower id first), stored masked (the next rows are written already).
    for (uint32_t m = slow; m; m &= m - 1) {
      const int i = __builtin_ctz(m);
      float* key = keys + i * E;
      if (groups)  // the insertion scans the whole row: the other groups' keys -inf first
        for (uint32_t u = ~vkeep[i] & ((1u << nv) - 1); u; u &= u - 1) _mm512_store_ps(key + 16 * __builtin_ctz(u), _mm512_set1_ps(kNegInf));
      alignas(64) float kv[16];
      alignas(64) int32_t ki[16];
      many_candidates_topk(key, nv, tha[i], int(k), kv, ki);
      const __mmask16 mk = lanes(k);
      const __m512i id = _mm512_maskz_load_epi32(mk, ki);
      const __m512 y = _mm512_maskz_mov_ps(mk, sigmoid_ps(_mm512_mask_i32gather_ps(zero, mk, id, xf + i * E, 4)));
      write_row16(s, r, rb + i, id, _mm512_mul_ps(y, _mm512_set1_ps(s.scale / (sum_in_order(y, k) + s.eps))), false, jr);
    }
  }
  return true;
}

template <int NV> bool dispatch(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return with_direct_and_k(s, [&](auto direct, auto k) { return t16_sigmoid_rows<NV, decltype(direct)::value, decltype(k)::value>(s, r, r0, r1, b); });
}

}  // namespace

bool t16_sigmoid_applies(const RouterSpec& s) {
  const bool groups_ok = !limits_groups(s) || ((s.E / s.groups) % 16 == 0 && s.groups <= 16);
  return has_vbmi_and_vbmi2() && s.select == Select::gating && s.sigmoid && s.k <= 16 && !s.allowed && s.E % 16 == 0 && s.E <= 256 && groups_ok;
}

bool route_rows_t16_sigmoid(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  return whole_blocks_then_rows(s, r, r0, r1, b, [&](int64_t a, int64_t e) {
    switch (s.E) {
      case 64: return dispatch<4>(s, r, a, e, b);
      case 128: return dispatch<8>(s, r, a, e, b);
      case 256: return dispatch<16>(s, r, a, e, b);
      default: return dispatch<0>(s, r, a, e, b);
    }
  });
}

}  // namespace ot::moe::impl

#include "src/moe/router_vbmi_end.h"
