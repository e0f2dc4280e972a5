// Routers, AVX-512 with 16 tokens in the lanes ("t16"): every call with E a multiple of 16 up to
// 256, k <= 16 and no mask (softmax or sigmoid scores, any selection, bias, group limit, scores
// output), in blocks of 16 rows; a last partial block runs with its padding lanes idle (the row
// passes skip them), so a row gets the same bits alone as in a batch. The row passes stay
// row-wise (loads, selection keys, exps and their sums, candidate ids compressed as bytes);
// everything that was a horizontal step or a lane network per row is done once for 16 rows with a
// token per lane:
// - the 16 rows' column maxima are transposed (16x16) and sorted per lane by a vertical network
//   (Batcher, pruned to the outputs needed): lane i of output 0 is row i's max, of output k-1 its
//   top-k threshold (the k-th largest column maximum: k distinct elements reach it);
// - the softmax exp sums are reduced by one transposing tree for the 16 rows;
// - group scores: each row's groups folded lane-wise into (largest, second largest), one
//   transposing tree per group for the 16 rows (max, or the top-2 sum), the k_group best groups per
//   lane by a network (ties to the lower group); the threshold from the kept groups' column maxima;
// - the candidates' byte ids (n <= 16 a row) are transposed by two-source byte permutes, their
//   values read, and each (value, id) pair becomes one 64-bit key (order-preserving value bits
//   high, 255 - id low: ties go to the lower id exactly, no tie checks), sorted per lane by the
//   pruned network;
// - the weights of the k chosen are k vertical exps or sigmoids for the 16 rows, transposed back.
// Softmax routers that select on the logits without a group limit (the common case) take the
// threshold with the row max and the candidates with the exps: one row pass fewer. Rows of more
// than 16 candidates take an insertion over their candidates; softmax rows whose max is huge the
// scalar row.
#include "src/moe/router_lane_counts.h"
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
    const __m512 x = Direct ? _mm512_loadu_ps(reinterpret_cast<const float*>(xp) + 16 * v) : load16(xp, xt, 16 * v);
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
OT_T16_AI inline void limit_groups16(const RouterSpec& s, const float* keys, int64_t E, int64_t nv, int rows, __m512* cm, uint32_t* vkeep) {
  const int64_t G = G_ > 0 ? G_ : s.groups, M = M_ > 0 ? M_ : nv / G;
  const bool top2 = s.group_mode == 1;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  __m512 gs[16];
  for (int64_t g = 0; g < G; ++g) {
    auto fold = [&](int i, __m512* f) OT_T16_AI {  // each lane's largest and second largest over the group's vectors
      if (i >= rows) { f[0] = f[1] = ninf; return; }  // padding rows of a partial block (keys may lie past the input)
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
  for (int i = 0; i < rows; ++i) {
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

// A block of 16 rows between its passes (t16_rows: per dtype and score function) and what follows
// them (keys_candidates, select_and_write: one instance per row length and k for all of them).
struct Block {
  int64_t rb = 0;
  int rows = 0;               // real rows (the rest: padding lanes, idle)
  __mmask16 huge = 0;         // softmax rows for the scalar row
  const float* xf = nullptr;  // the rows' fp32 logits (in place or the copy), E apart
  float* keys = nullptr;      // their selection keys, E apart
  __m512 mx, scale;           // softmax: the rows' maxima; the weights' factor so far
  alignas(64) float mxa[16], tha[16];
  alignas(64) int32_t ncand[16];
  uint32_t vkeep[16];  // group limit: per row its kept vectors
  alignas(64) uint8_t cb[16 * 16 + 256 + 64];  // candidate ids, bytes at cb + 16 i (a row's stores run into the next rows')
  __mmask16 idle() const { return __mmask16(~lanes(rows) | huge); }
};

// From the keys' column maxima cm (real rows; without a group limit): the group limit, the
// thresholds and the candidates.
template <int NV, int K> [[gnu::noinline]] void keys_candidates(const RouterSpec& s, __m512* cm, Block& q) {
  constexpr int Live = K > 0 ? K : 16;
  const int64_t E = NV > 0 ? 16 * NV : s.E, nv = E / 16, M = nv / s.groups;
  const bool groups = limits_groups(s);
  if (groups) {
    if (NV == 16 && M == 2) limit_groups16<2, 8>(s, q.keys, E, nv, q.rows, cm, q.vkeep);
    else if (M == 1) limit_groups16<1, 0>(s, q.keys, E, nv, q.rows, cm, q.vkeep);
    else limit_groups16<0, 0>(s, q.keys, E, nv, q.rows, cm, q.vkeep);
  }
  const __mmask16 idle = q.idle();
  for (int i = 0; i < 16; ++i)
    if (idle >> i & 1) cm[i] = _mm512_set1_ps(kNegInf);
  transpose16(cm);
  sort_lanes<Live>(cm);
  _mm512_store_ps(q.tha, cm[K > 0 ? K - 1 : s.k - 1]);
  for (int i = 0; i < 16; ++i) {
    q.ncand[i] = 0;
    if (idle >> i & 1) continue;
    const float* kr = q.keys + i * E;
    const __m512 th = _mm512_set1_ps(q.tha[i]);
    q.ncand[i] = groups ? kept_candidates(kr, q.vkeep[i], th, q.cb + 16 * i) : topk_collect_bytes(kr, nv, th, q.cb + 16 * i);
  }
}

// From the candidates: the top k per lane, their weights (the unbiased scores: the logits
// gathered unless they are the keys), the rows' outputs; rows of many candidates by an insertion,
// huge rows by the scalar row.
template <int NV, int K> [[gnu::noinline]] void select_and_write(const RouterSpec& s, GatingResult& r, int64_t r1, RouterScratch& b, Block& q) {
  constexpr int Live = K > 0 ? K : 16;
  const int64_t E = NV > 0 ? 16 * NV : s.E, nv = E / 16, k = s.k;
  const bool sig = s.sigmoid, on_x = select_on_logits(s), full = !sig && s.select != Select::topk_softmax;
  const __m512 l2e = _mm512_set1_ps(kLog2e), zero = _mm512_setzero_ps();
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i jr = _mm512_mullo_epi32(iota, _mm512_set1_epi32(int32_t(s.R)));
  const __m512i rowoff = _mm512_mullo_epi32(iota, _mm512_set1_epi32(int32_t(E)));
  const __mmask16 idle = q.idle();
  const __m512i nc = _mm512_load_si512(q.ncand);
  const __mmask16 slow = _mm512_mask_cmpgt_epi32_mask(__mmask16(~idle), nc, _mm512_set1_epi32(16));
  const __mmask16 skip = slow | idle, live = __mmask16(~skip);
  __m512i sid[16];
  __m512 sval[16];
  select16<Live, NV>(q.cb, nc, skip, q.keys, E, k, sid, sval);
  __m512 w[16], ids[16], wsum = zero, e0 = zero;
  for (int j = 0; j < 16; ++j) {
    if (j >= k) { w[j] = zero; ids[j] = zero; continue; }
    ids[j] = _mm512_castsi512_ps(sid[j]);
    __m512 lg = sval[j];
    if (!on_x) lg = _mm512_mask_i32gather_ps(zero, live, _mm512_add_epi32(rowoff, sid[j]), q.xf, 4);
    if (sig) {
      w[j] = sigmoid_ps(lg);
    } else {
      if (j == 0) e0 = full ? q.mx : lg;  // topk_softmax: a softmax over the k chosen (lg0 is their max)
      w[j] = exp2_ps(_mm512_fmsub_ps(lg, l2e, _mm512_mul_ps(e0, l2e)));
    }
    wsum = _mm512_add_ps(wsum, w[j]);
  }
  __m512 scale = q.scale;
  if (sig) scale = _mm512_div_ps(scale, _mm512_add_ps(wsum, _mm512_set1_ps(s.eps)));
  else if (!full) scale = _mm512_div_ps(scale, wsum);
  alignas(64) float sca[16];
  _mm512_store_ps(sca, scale);
  scale_and_transpose(ids, w, k, scale);
  if (K == 8 && q.rows == 16) {
    write_pairs8(s, r, q.rb, ids, w);  // (the rows of many candidates and huge rows are rewritten below)
  } else {
    for (int i = 0; i < q.rows; ++i)
      if (!(skip >> i & 1)) write_row16(s, r, q.rb + i, _mm512_castps_si512(ids[i]), w[i], (q.rb + i) * k + 16 <= r1 * k, jr);
  }
  // Rows of more than 16 candidates (~0.4% of random rows at E 128, k 8): their top k by an
  // insertion over the candidates (in expert order; strict '>' keeps the lower id first), stored
  // masked (the next rows are written already).
  for (uint32_t m = slow; m; m &= m - 1) {
    const int i = __builtin_ctz(m);
    float* key = q.keys + i * E;
    if (limits_groups(s))  // the insertion scans the whole row: the other groups' keys -inf first (the block's own keys)
      for (uint32_t u = ~q.vkeep[i] & ((1u << nv) - 1); u; u &= u - 1) _mm512_store_ps(key + 16 * __builtin_ctz(u), _mm512_set1_ps(kNegInf));
    alignas(64) float kv[16];
    alignas(64) int32_t ki[16];
    many_candidates_topk(key, nv, q.tha[i], int(k), kv, ki);
    const __mmask16 mk = lanes(k);
    const __m512i id = _mm512_maskz_load_epi32(mk, ki);
    const __m512 lg = on_x ? _mm512_maskz_load_ps(mk, kv) : _mm512_mask_i32gather_ps(zero, mk, id, q.xf + i * E, 4);
    __m512 y;
    float f = sca[i];
    if (sig) {
      y = _mm512_maskz_mov_ps(mk, sigmoid_ps(lg));
      f = s.scale / (sum_in_order(y, k) + s.eps);
    } else {
      y = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(lg, l2e, _mm512_set1_ps((full ? q.mxa[i] : kv[0]) * kLog2e))));
      if (!full) f = (s.select == Select::gating ? s.scale : 1.f) / sum_in_order(y, k);
    }
    write_row16(s, r, q.rb + i, id, _mm512_mul_ps(y, _mm512_set1_ps(f)), false, jr);
  }
  for (uint32_t m = q.huge; m; m &= m - 1) route_row_scalar(s, r, q.rb + __builtin_ctz(m), b);  // last: it uses b.xr
}

// The passes over a block's rows. Sig: sigmoid scores (gating_top_k norm_type 1), else softmax.
// NV > 0: rows of exactly NV vectors; Direct: fp32 logits read in place; K > 0: k == K (networks
// pruned at compile time).
template <bool Sig, int NV, bool Direct, int K>
bool t16_rows(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  constexpr int Live = K > 0 ? K : 16;
  const int64_t E = NV > 0 ? 16 * NV : s.E, nv = E / 16, k = s.k;
  const DType xt = s.x.dtype;
  const size_t row_bytes = size_t(E) * dtype_size(xt);
  const bool on_x = select_on_logits(s), groups = limits_groups(s);
  // Softmax over all experts (its sum is needed) unless the weights are a softmax over the k chosen.
  const bool full = !Sig && s.select != Select::topk_softmax;
  const bool fused = !Sig && on_x && !groups;  // threshold with the row max, candidates with the exps
  const bool keep = !on_x || s.scores;         // softmax: the probabilities are needed (keys, scores output)
  const Key km = on_x ? Key::logits : s.bias.empty() ? Key::sigmoid : Key::sigmoid_bias;  // (Sig)
  float* scores = s.scores ? r.scores.ptr<float>() : nullptr;
  const __m512 l2e = _mm512_set1_ps(kLog2e), zero = _mm512_setzero_ps(), ninf = _mm512_set1_ps(kNegInf);
  float* copy = Direct ? nullptr : b.xr;  // fp32 copies of a block's rows (stride E)
  float* kbuf = b.key16;                  // the block's keys (or a softmax router's exps on the way)
  Block q;
  for (int64_t rb = r0; rb < r1; rb += 16) {
    q.rb = rb;
    q.rows = int(std::min<int64_t>(16, r1 - rb));
    q.huge = 0;
    const char* xb = static_cast<const char*>(s.x.data) + size_t(rb) * row_bytes;
    const float* xf = Direct ? reinterpret_cast<const float*>(xb) : copy;
    q.xf = xf;
    q.keys = !Sig && on_x ? const_cast<float*>(xf) : kbuf;  // (written only when a copy: see dispatch)
    q.scale = _mm512_set1_ps(Sig || s.select == Select::gating ? s.scale : 1.f);
    __m512 cm[16];
    for (int i = q.rows; i < 16; ++i) cm[i] = ninf;
    if constexpr (Sig) {
      // Pass 1: keys (and the fp32 copy), finiteness, their column maxima (unless the group limit
      // computes them); the scores output.
      __mmask16 bad = 0;
      for (int i = 0; i < q.rows; ++i) {
        const char* xp = xb + size_t(i) * row_bytes;
        const char* pf = rb + 32 <= s.R ? xp + 16 * row_bytes : nullptr;
        float *kr = kbuf + i * E, *cp = Direct ? nullptr : copy + i * E;
        cm[i] = km == Key::sigmoid_bias ? (groups ? keys_row<NV, Direct, Key::sigmoid_bias, false>(xp, xt, nv, s.bias.data(), cp, kr, bad, pf)
                                                  : keys_row<NV, Direct, Key::sigmoid_bias, true>(xp, xt, nv, s.bias.data(), cp, kr, bad, pf))
                : km == Key::sigmoid    ? keys_row<NV, Direct, Key::sigmoid, true>(xp, xt, nv, nullptr, cp, kr, bad, pf)
                                        : keys_row<NV, Direct, Key::logits, true>(xp, xt, nv, nullptr, cp, kr, bad, pf);
        if (scores)
          for (int64_t v = 0; v < nv; ++v) _mm512_storeu_ps(scores + (rb + i) * E + 16 * v, sigmoid_ps(_mm512_loadu_ps(xf + i * E + 16 * v)));
      }
      if (bad) return false;  // check_rows names the row
      keys_candidates<NV, K>(s, cm, q);
    } else {
      // Pass 1: the fp32 copy, finiteness (x * 0 is NaN exactly for NaN / +-Inf; a chain a row, so
      // pass 2 has no check: softmax E 128 b/a 0.94-0.99, AMD Zen 5 VM), the logits' column maxima.
      __m512 nonfinite = zero;
      for (int i = 0; i < q.rows; ++i) {
        const char* xp = xb + size_t(i) * row_bytes;
        if (rb + 32 <= s.R)
          for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(xp + 16 * row_bytes + o, _MM_HINT_T0);
        __m512 c = ninf, nf = zero;
        for (int64_t v = 0; v < nv; ++v) {
          const __m512 x = load16(xp, xt, 16 * v);
          if (!Direct) _mm512_storeu_ps(copy + i * E + 16 * v, x);
          nf = _mm512_fmadd_ps(x, zero, nf);
          c = _mm512_max_ps(c, x);
        }
        nonfinite = _mm512_add_ps(nonfinite, nf);
        cm[i] = c;
      }
      if (_mm512_cmp_ps_mask(nonfinite, zero, _CMP_UNORD_Q)) return false;
      // Row maxima (and, fused, the thresholds) per lane.
      transpose16(cm);
      if (fused) sort_lanes<Live>(cm); else sort_lanes<1>(cm);
      q.mx = cm[0];
      q.huge = exp_offset_too_large(cm[0]) & lanes(q.rows);
      _mm512_store_ps(q.mxa, cm[0]);
      if (fused) _mm512_store_ps(q.tha, cm[K > 0 ? K - 1 : k - 1]);  // (K: a fixed index keeps cm in registers)
      // Pass 2: exps and their sums (kept when the probabilities are needed); fused, the
      // candidates. Row i's pass has its choices fixed at compile time (checks in the unrolled
      // vector loop cost ~10% at T 16384, E 128).
      __m512 psum[16];
      auto row_pass = [&]<bool Fused, bool Full, bool Keep>(int i) OT_T16_AI {
        const float* x = xf + i * E;
        float* er = kbuf + i * E;
        const __m512 th = _mm512_set1_ps(q.tha[i]), ml = _mm512_set1_ps(q.mxa[i] * kLog2e);
        __mmask16 m[NV > 0 ? NV : 16];
        __m512 vs = zero, vs2 = zero;
        for (int64_t v = 0; v < nv; ++v) {
          const __m512 xv = _mm512_loadu_ps(x + 16 * v);
          if constexpr (Fused) m[v] = _mm512_cmp_ps_mask(xv, th, _CMP_GE_OQ);
          if constexpr (Full) {
            const __m512 e = exp2_ps(_mm512_fmsub_ps(xv, l2e, ml));  // t below the fp32 range: -inf, e = 0
            if constexpr (Keep) _mm512_store_ps(er + 16 * v, e);
            if (v & 1) vs2 = _mm512_add_ps(vs2, e); else vs = _mm512_add_ps(vs, e);
          }
        }
        psum[i] = _mm512_add_ps(vs, vs2);
        if constexpr (Fused) q.ncand[i] = compress_ids_bytes(m, nv, q.cb + 16 * i);
      };
      const __mmask16 idle = q.idle();
      for (int i = 0; i < 16; ++i) {
        psum[i] = _mm512_set1_ps(1.f);
        q.ncand[i] = 0;
        if (idle >> i & 1) continue;
        if (!full) row_pass.template operator()<true, false, false>(i);  // (topk_softmax: on the logits, no groups)
        else if (!fused) row_pass.template operator()<false, true, true>(i);
        else if (keep) row_pass.template operator()<true, true, true>(i);
        else row_pass.template operator()<true, true, false>(i);
      }
      if (full) {
        const __m512 sums = reduce16_add(psum);  // in [0.5, 2 E] (but the huge rows)
        q.scale = _mm512_div_ps(q.scale, sums);
        // The probabilities e / sum: the scores output; not on the logits, the keys (+ bias) and
        // their column maxima.
        if (keep) {
          alignas(64) float inv[16];
          _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), sums));
          for (int i = 0; i < q.rows; ++i) {
            cm[i] = ninf;
            if (q.huge >> i & 1) continue;  // (the scalar row redoes it)
            float* er = kbuf + i * E;
            const __m512 vi = _mm512_set1_ps(inv[i]);
            __m512 c = ninf;
            for (int64_t v = 0; v < nv; ++v) {
              const __m512 p = _mm512_mul_ps(_mm512_load_ps(er + 16 * v), vi);
              if (scores) _mm512_storeu_ps(scores + (rb + i) * E + 16 * v, p);
              if (on_x) continue;
              const __m512 y = s.bias.empty() ? p : _mm512_add_ps(p, _mm512_loadu_ps(s.bias.data() + 16 * v));
              _mm512_store_ps(er + 16 * v, y);
              c = _mm512_max_ps(c, y);
            }
            cm[i] = c;
          }
        }
      }
      if (!fused) keys_candidates<NV, K>(s, cm, q);
    }
    select_and_write<NV, K>(s, r, r1, b, q);
  }
  return true;
}

template <bool Sig, int NV> bool dispatch(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  // A softmax router's group limit on the logits writes -inf into rows of many candidates: a copy.
  const bool direct = s.x.dtype == DType::f32 && (Sig || !(limits_groups(s) && select_on_logits(s)));
  return with_direct_and_k(s, direct, [&](auto d, auto k) { return t16_rows<Sig, NV, decltype(d)::value, decltype(k)::value>(s, r, r0, r1, b); });
}

}  // namespace

bool t16_applies(const RouterSpec& s) {
  const bool groups_ok = !limits_groups(s) || ((s.E / s.groups) % 16 == 0 && s.groups <= 16);
  return has_vbmi_and_vbmi2() && s.k <= 16 && !s.allowed && s.E % 16 == 0 && s.E <= 256 && groups_ok;
}

bool route_rows_t16(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  if (s.sigmoid) {
    switch (s.E) {
      case 64: return dispatch<true, 4>(s, r, r0, r1, b);
      case 128: return dispatch<true, 8>(s, r, r0, r1, b);
      case 256: return dispatch<true, 16>(s, r, r0, r1, b);
      default: return dispatch<true, 0>(s, r, r0, r1, b);
    }
  }
  bool ok = true;
  if (with_lane_vectors<16>(s.E, [&](auto nv) { return ok = dispatch<false, decltype(nv)::value>(s, r, r0, r1, b), true; })) return ok;
  return dispatch<false, 0>(s, r, r0, r1, b);
}

}  // namespace ot::moe::impl

#include "src/moe/router_vbmi_end.h"
