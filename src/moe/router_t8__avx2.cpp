// Routers, AVX2 with 8 tokens in the lanes ("t8"), for the softmax routers that select on the
// logits (no mask, bias, groups or scores output; E a multiple of 8 up to 256, k <= 8). The row
// passes stay row-wise (loads, finiteness, 16 column maxima; exps, their sums and the candidates'
// compare masks); every step that was horizontal or a per-row network in the row kernel
// (router__avx2.cpp) is done once for 8 rows with a token per lane:
// - the 8 rows' 16 column maxima are transposed (two 8x8) and sorted per lane by a pruned Batcher
//   network: lane i of output 0 is row i's max, of output k-1 its threshold (the k-th largest
//   maximum of disjoint expert sets: k distinct experts reach it);
// - the exp sums are reduced by one transposing hadd tree;
// - the candidates (>= the threshold, at most 16 a row, in expert order) are transposed into slots
//   and inserted per lane into k sorted (value, id) registers; strict '>' over slots in expert order
//   keeps the lower expert id first on ties, the scalar row's order;
// - the k chosen weights are k vertical exps, transposed back to rows.
// Rows it does not decide (more than 16 candidates; |max| >= kExpOffsetLimit) go to the row kernel;
// a last partial block runs on zero-padded copies of its rows (the padding is never written out).
#include <algorithm>

#include "src/moe/router_net.h"
#include "src/moe/router_simd__avx2.h"

namespace ot::moe::impl {
namespace {

#define OT_T8_AI __attribute__((always_inline))

constexpr int kSlots = 16;  // candidates a row the block takes (more: the row kernel)
// Rows of a partial block from which it pays (T 1: the padded block was 1.6x the row kernel's time).
constexpr int kMinRows = 4;

// 8x8 transpose: v[j] lane i <- v[i] lane j (24 shuffles).
OT_T8_AI inline void transpose8(__m256* v) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + c], 128-bit half h: rows 4i..4i+3 of column c + 4h
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

template <const net::Net& N, class F, size_t... I> OT_T8_AI inline void run_net(F&& f, std::index_sequence<I...>) { (f(N.a[I], N.b[I]), ...); }
// v[0, 16) sorted descending per lane (the first Live outputs).
template <int Live> OT_T8_AI inline void sort_lanes(__m256* v) {
  run_net<net::NetOf<Live>::net>([&](int a, int b) OT_T8_AI {
    const __m256 hi = _mm256_max_ps(v[a], v[b]);
    v[b] = _mm256_min_ps(v[a], v[b]);
    v[a] = hi;
  }, std::make_index_sequence<net::NetOf<Live>::net.n>{});
}

// Lane i <- the sum of p[i]'s 8 lanes.
OT_T8_AI inline __m256 reduce8_add(const __m256* p) {
  const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));  // rows 0-3: lanes 0-3 + 4-7
  const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
}

// Slots [0, n) (slot j lane i: row i's j-th candidate, in expert order) inserted per lane into the
// K sorted (value, id) registers kv / ki (best first). The candidate is compared with every level's
// old value at once (g_l: it goes above level l; monotone in l), levels below its place shift down
// by one: no chain through the levels, and strict '>' keeps an equal earlier (lower-id) entry first.
template <int K> void insert_slots(const __m256* V, const __m256* I, int n, __m256* kv, __m256* ki) {
  for (int j = 0; j < n; ++j) {
    const __m256 x = V[j], id = I[j];
    __m256 g[K];
    for (int l = 0; l < K; ++l) g[l] = _mm256_cmp_ps(x, kv[l], _CMP_GT_OQ);
    for (int l = K - 1; l > 0; --l) {
      kv[l] = _mm256_blendv_ps(kv[l], _mm256_blendv_ps(x, kv[l - 1], g[l - 1]), g[l]);
      ki[l] = _mm256_blendv_ps(ki[l], _mm256_blendv_ps(id, ki[l - 1], g[l - 1]), g[l]);
    }
    kv[0] = _mm256_blendv_ps(kv[0], x, g[0]);
    ki[0] = _mm256_blendv_ps(ki[0], id, g[0]);
  }
}
void insert_slots(int k, const __m256* V, const __m256* I, int n, __m256* kv, __m256* ki) {
  switch (k) {
    case 1: return insert_slots<1>(V, I, n, kv, ki);
    case 2: return insert_slots<2>(V, I, n, kv, ki);
    case 3: return insert_slots<3>(V, I, n, kv, ki);
    case 4: return insert_slots<4>(V, I, n, kv, ki);
    case 5: return insert_slots<5>(V, I, n, kv, ki);
    case 6: return insert_slots<6>(V, I, n, kv, ki);
    case 7: return insert_slots<7>(V, I, n, kv, ki);
    default: return insert_slots<8>(V, I, n, kv, ki);
  }
}

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
  transpose8(cm);
  transpose8(cm + 8);
  sort_lanes<8>(cm);
  alignas(32) float mxa[8], tha[8];
  _mm256_store_ps(mxa, cm[0]);
  _mm256_store_ps(tha, cm[k - 1]);
  const __m256 mx = cm[0];
  const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), mx), _mm256_set1_ps(kExpOffsetLimit), _CMP_GE_OQ);
  const unsigned real = (1u << rows) - 1;
  unsigned redo = unsigned(_mm256_movemask_ps(big)) & real;  // rows for the row kernel
  // Pass 2: exps and their sums (softmax over all experts), the candidates >= the threshold
  // compressed in expert order to the values cv and ids ci (whole 8-lane stores, and 16 -inf past
  // the candidates: a row's slots are max(E, 32) apart).
  constexpr int ld2 = std::max(8 * NV, 32);
  alignas(32) float cv[8 * ld2];
  alignas(32) int32_t ci[8 * ld2];
  __m256 psum[8];
  int nmax = 0;
  for (int i = 0; i < 8; ++i) {
    psum[i] = _mm256_set1_ps(1.f);  // (rows not decided here)
    float* cvi = cv + ld2 * i;
    int32_t* cii = ci + ld2 * i;
    if (!(real >> i & 1) || (redo >> i & 1)) {
      _mm256_store_ps(cvi, ninf);
      _mm256_store_ps(cvi + 8, ninf);
      continue;
    }
    const float* p = x + i * ld;
    const __m256 th = _mm256_set1_ps(tha[i]), ml = _mm256_set1_ps(mxa[i] * kLog2e);
    __m256 s0 = zero, s1 = zero;
    int n = 0;
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      const __m256 xv = _mm256_loadu_ps(p + 8 * v);
      if (softmax) {
        const __m256 e = exp2_offset(_mm256_fmsub_ps(xv, l2e, ml));
        if (v & 1) s1 = _mm256_add_ps(s1, e); else s0 = _mm256_add_ps(s0, e);
      }
      const unsigned m = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(xv, th, _CMP_GE_OQ)));
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.data() + 8 * m)));
      _mm256_storeu_ps(cvi + n, _mm256_permutevar8x32_ps(xv, q));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cii + n), _mm256_add_epi32(q, _mm256_set1_epi32(8 * v)));
      n += __builtin_popcount(m);
    }
    psum[i] = _mm256_add_ps(s0, s1);
    if (n > kSlots) {
      redo |= 1u << i;
      n = 0;
    }
    _mm256_storeu_ps(cvi + n, ninf);
    _mm256_storeu_ps(cvi + n + 8, ninf);
    nmax = std::max(nmax, n);
  }
  // Slots: V[j] / I[j] lane i = row i's j-th candidate (ids as float bits).
  __m256 V[16], I[16];
  for (int h = 0; h < (nmax > 8 ? 2 : 1); ++h) {
    for (int i = 0; i < 8; ++i) {
      V[8 * h + i] = _mm256_load_ps(cv + ld2 * i + 8 * h);
      I[8 * h + i] = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ci + ld2 * i + 8 * h)));
    }
    transpose8(V + 8 * h);
    transpose8(I + 8 * h);
  }
  __m256 kv[8], ki[8];
  for (int l = 0; l < 8; ++l) kv[l] = ki[l] = ninf;
  insert_slots(k, V, I, nmax, kv, ki);
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
  transpose8(kv);
  transpose8(ki);
  for (int i = 0; i < rows; ++i) {
    if (redo >> i & 1) continue;
    alignas(32) int32_t ids[8];
    alignas(32) float w[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ids), _mm256_castps_si256(ki[i]));
    _mm256_store_ps(w, kv[i]);
    write_row8(s, r, rb + i, ids, w);
  }
  bool ok = true;
  for (unsigned m = redo; m; m &= m - 1) ok &= route_rows_avx2(s, r, rb + __builtin_ctz(m), rb + __builtin_ctz(m) + 1, b);  // last: it uses b.xr
  return ok;
}

// Rows [r0, r1) in blocks of 8; rows not of fp32 and a last partial block of kMinRows or more
// through fp32 copies in b.xr (the padding rows zero); a shorter one by the row kernel.
template <int NV> bool t8_rows(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  constexpr int64_t E = 8 * NV;
  const DType xt = s.x.dtype;
  bool ok = true;
  for (int64_t rb = r0; rb < r1; rb += 8) {
    const int rows = int(std::min<int64_t>(8, r1 - rb));
    if (rows < kMinRows) {  // a padded block would cost more than these rows one at a time
      ok &= route_rows_avx2(s, r, rb, r1, b);
      break;
    }
    if (xt == DType::f32 && rows == 8) {
      ok &= t8_block<NV>(s, r, rb, rows, s.x.ptr<float>() + rb * E, E, rb + 16 <= s.R, b);
      continue;
    }
    float* c = b.xr;
    for (int i = 0; i < 8; ++i)
      for (int v = 0; v < NV; ++v)
        _mm256_storeu_ps(c + i * E + 8 * v, i < rows ? load8(s.x.data, xt, (rb + i) * E + 8 * v, 8) : _mm256_setzero_ps());
    ok &= t8_block<NV>(s, r, rb, rows, c, E, false, b);
  }
  return ok;
}

}  // namespace

bool t8_applies(const RouterSpec& s) {
  return s.R >= kMinRows && s.k <= 8 && !s.sigmoid && select_on_logits(s) && !limits_groups(s) && !s.allowed && !s.scores && s.E % 8 == 0 && s.E <= 256;
}

bool route_rows_t8(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  switch (s.E / 8) {
#define OT_T8_CASE(NV) \
  case NV: return t8_rows<NV>(s, r, r0, r1, b);
    OT_T8_CASE(1) OT_T8_CASE(2) OT_T8_CASE(3) OT_T8_CASE(4) OT_T8_CASE(5) OT_T8_CASE(6) OT_T8_CASE(7) OT_T8_CASE(8)
    OT_T8_CASE(9) OT_T8_CASE(10) OT_T8_CASE(11) OT_T8_CASE(12) OT_T8_CASE(13) OT_T8_CASE(14) OT_T8_CASE(15) OT_T8_CASE(16)
    OT_T8_CASE(17) OT_T8_CASE(18) OT_T8_CASE(19) OT_T8_CASE(20) OT_T8_CASE(21) OT_T8_CASE(22) OT_T8_CASE(23) OT_T8_CASE(24)
    OT_T8_CASE(25) OT_T8_CASE(26) OT_T8_CASE(27) OT_T8_CASE(28) OT_T8_CASE(29) OT_T8_CASE(30) OT_T8_CASE(31) OT_T8_CASE(32)
#undef OT_T8_CASE
  }
  return route_rows_avx2(s, r, r0, r1, b);  // not reached: t8_applies takes E 8..256
}

}  // namespace ot::moe::impl
