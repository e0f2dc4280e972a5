// The 16-tokens-in-lanes router kernel's building blocks (router_t16__avx512.cpp): vertical
// sorting networks, 16x16 transposes, transposing reduction trees, the candidates' (value, id) keys
// and their per-lane sort, the k = 8 row stores. Only for translation units built with the AVX-512
// flags; its functions get the VBMI targets (they run only where CPUID has them).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "src/core/kernel_inline.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"
#include "src/moe/router_net.h"
#include "src/moe/router_simd__avx512.h"

#include "src/moe/router_vbmi_begin.h"

namespace ot::moe::impl::t16 {
using namespace rsimd;
using net::NetOf;

#define OT_T16_AI OT_KERNEL_INLINE

template <const net::Net& N, class F, size_t... I> OT_T16_AI inline void run_net(F&& f, std::index_sequence<I...>) { (f(N.a[I], N.b[I]), ...); }

// v[0, N) sorted descending per lane (the first Live outputs).
template <int Live, int N = 16> OT_T16_AI inline void sort_lanes(__m512* v) {
  run_net<NetOf<Live, N>::net>([&](int a, int b) OT_T16_AI {
    const __m512 hi = _mm512_max_ps(v[a], v[b]);
    v[b] = _mm512_min_ps(v[a], v[b]);
    v[a] = hi;
  }, std::make_index_sequence<NetOf<Live, N>::net.n>{});
}
template <int Live> OT_T16_AI inline void sort_lanes(__m512i* v) {
  run_net<NetOf<Live>::net>([&](int a, int b) OT_T16_AI {
    const __m512i hi = _mm512_max_epi64(v[a], v[b]);
    v[b] = _mm512_min_epi64(v[a], v[b]);
    v[a] = hi;
  }, std::make_index_sequence<NetOf<Live>::net.n>{});
}

// 16x16 transpose: v[j] lane i <- v[i] lane j (64 shuffles).
OT_T16_AI inline void transpose16(__m512* v) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  auto hi = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  for (int i = 0; i < 4; ++i) {  // u[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
    u[4 * i] = lo(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 b0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), b1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 b2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), b3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    v[c] = _mm512_shuffle_f32x4(b0, b2, 0x88);
    v[4 + c] = _mm512_shuffle_f32x4(b0, b2, 0xDD);
    v[8 + c] = _mm512_shuffle_f32x4(b1, b3, 0x88);
    v[12 + c] = _mm512_shuffle_f32x4(b1, b3, 0xDD);
  }
}

// A transposing reduction tree over 16 vectors of C components each (v[c][i]: component c of input
// i, overwritten): lane i of the result (returned in v[c][0], tree16_rows order) reduces input i's 16 lanes by merge(lo, hi, out),
// which combines two C-component partials lane-wise. 15 merges and 4 shuffles of each component a
// merge for 16 rows (no horizontal step per row). From = 8: the first level was done by tree16_pair
// (v[c][i] holds its output i), the rest runs on 8 inputs.
template <int C, int From = 16, class Merge> OT_T16_AI inline void tree16(__m512* const (&v)[C], Merge&& merge) {
  auto level = [&](int n, auto&& lo_of, auto&& hi_of) OT_T16_AI {
    for (int i = 0; i < n / 2; ++i) {
      __m512 lo[C], hi[C];
      for (int c = 0; c < C; ++c) { lo[c] = lo_of(v[c][2 * i], v[c][2 * i + 1]); hi[c] = hi_of(v[c][2 * i], v[c][2 * i + 1]); }
      __m512 out[C];
      merge(lo, hi, out);
      for (int c = 0; c < C; ++c) v[c][i] = out[c];
    }
  };
  // lanes 0-7: v[2i] folded, 8-15: v[2i + 1]
  if constexpr (From == 16) level(16, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_f32x4(p, q, 0x44); }, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_f32x4(p, q, 0xEE); });
  // 128-bit lane q: v[4i + q] folded
  level(8, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_f32x4(p, q, 0x88); }, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_f32x4(p, q, 0xDD); });
  // lane q: [v[8i + q] x2, v[8i + 4 + q] x2]
  level(4, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_ps(p, q, 0x44); }, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_ps(p, q, 0xEE); });
  // lane q: [v[q], v[4 + q], v[8 + q], v[12 + q]]: element 4q + m holds row 4m + q
  level(2, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_ps(p, q, 0x88); }, [](__m512 p, __m512 q) OT_T16_AI { return _mm512_shuffle_ps(p, q, 0xDD); });
}
// tree16's first level for one pair of inputs (p: input 2i, q: input 2i + 1; C components) into
// out (its output i).
template <int C, class Merge> OT_T16_AI inline void tree16_pair(const __m512* p, const __m512* q, __m512* out, Merge&& merge) {
  __m512 lo[C], hi[C];
  for (int c = 0; c < C; ++c) { lo[c] = _mm512_shuffle_f32x4(p[c], q[c], 0x44); hi[c] = _mm512_shuffle_f32x4(p[c], q[c], 0xEE); }
  merge(lo, hi, out);
}
// tree16's lane order back to rows: lane i <- row i.
OT_T16_AI inline __m512 tree16_rows(__m512 z) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

// Lane i <- the sum of v[i]'s 16 lanes (45 ops and one permute for 16 rows).
OT_T16_AI inline __m512 reduce16_add(const __m512* v) {
  __m512 t[16];
  for (int i = 0; i < 16; ++i) t[i] = v[i];
  tree16<1>({t}, [](const __m512* lo, const __m512* hi, __m512* out) OT_T16_AI { out[0] = _mm512_add_ps(lo[0], hi[0]); });
  return tree16_rows(t[0]);
}

// Lane i <- the group score of row i from its lane-wise fold (fold(i, f): f[0] the largest, f[1]
// the second largest of each lane's experts in the group): the largest of the 16 lanes (Top2: plus
// the second largest of the multiset). Each pair of rows is folded just before the tree's first
// level merges it, so the 16 rows' folds are never live at once (with Top2 they were 32 registers
// and spilled to the stack).
template <bool Top2, class Fold> OT_T16_AI inline __m512 group_score16(Fold&& fold) {
  auto merge = [](const __m512* lo, const __m512* hi, __m512* out) OT_T16_AI {
    out[0] = _mm512_max_ps(lo[0], hi[0]);
    if constexpr (Top2) out[1] = _mm512_max_ps(_mm512_min_ps(lo[0], hi[0]), _mm512_max_ps(lo[1], hi[1]));
  };
  constexpr int C = Top2 ? 2 : 1;
  __m512 a[8], b[8];
  for (int i = 0; i < 8; ++i) {
    __m512 p[2], q[2], out[2];
    fold(2 * i, p);
    fold(2 * i + 1, q);
    tree16_pair<C>(p, q, out, merge);
    a[i] = out[0];
    b[i] = out[1];
  }
  if constexpr (Top2) {
    tree16<2, 8>({a, b}, merge);
    return tree16_rows(_mm512_add_ps(a[0], b[0]));
  } else {
    tree16<1, 8>({a}, merge);
    return tree16_rows(a[0]);
  }
}

// Byte transpose: column c of B_p (p = 0..3) at byte 16 c + i = row i's byte 4 p + c, with rows
// 4q..4q+3 in A_q: rows 0-7 from the pair (A0, A1), 8-15 from (A2, A3), the same index for both.
alignas(64) constexpr auto kByteT = [] {
  std::array<uint8_t, 256> a{};
  for (int p = 0; p < 4; ++p)
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 16; ++i) a[size_t(64 * p + 16 * c + i)] = uint8_t(16 * (i & 7) + 4 * p + c);
  return a;
}();

// Order-preserving int32 of a float (signed compare), -0 made +0 first (it ties with +0); an
// involution on the bits.
OT_T16_AI inline __m512i ordered(__m512i u) { return _mm512_xor_si512(u, _mm512_and_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(0x7fffffff))); }

// The candidates of a block's 16 rows (row i's ids as bytes at cb + 16 i, nc lane i of them; the
// rows of `slow` skipped: never read, so they may be padding past the input) -> per lane the top
// Live (value, id) pairs, descending, ties to the lower id: id[j] and val[j] for j < k, the values
// read from xf (rows E floats apart, +0 for -0).
// Rows of an even NV vectors (E = 16 NV, up to 256): the values by gather_perm a row and one
// transpose (a vgatherdps zmm measured ~19 cycles here, Zen 5: 5% of the E 128 softmax router;
// E 256 since gather_perm's blend tree: sigmoid E 256 b/a 0.98-0.99, 2026-12-01); else (NV 0, odd)
// by a vgatherdps a candidate slot.
template <int Live, int NV = 0>
OT_T16_AI inline void select16(const uint8_t* cb, __m512i nc, __mmask16 slow, const float* xf, int64_t E, int64_t k, __m512i* id, __m512* val) {
  constexpr bool perm = NV > 0 && NV % 2 == 0;
  alignas(64) uint8_t bt[256];
  __m512i keys[2][16];
  // Candidate ids transposed: slot j of the 16 rows at bt + 16 j.
  {
    const __m512i a0 = _mm512_load_si512(cb), a1 = _mm512_load_si512(cb + 64), a2 = _mm512_load_si512(cb + 128),
                  a3 = _mm512_load_si512(cb + 192);
    for (int p = 0; p < 4; ++p) {
      const __m512i idx = _mm512_load_si512(kByteT.data() + 64 * p);
      _mm512_store_si512(bt + 64 * p, _mm512_mask_blend_epi8(__mmask64(0xFF00FF00FF00FF00ull), _mm512_permutex2var_epi8(a0, idx, a1),
                                                              _mm512_permutex2var_epi8(a2, idx, a3)));
    }
  }
  // Keys: (ordered value, 255 - id); -inf (below every finite value) past a row's candidates.
  const __mmask16 live = __mmask16(~slow);
  __m512 pv[16];  // perm: slot j's values (lane i: row i's), -inf past a row's candidates
  if constexpr (perm) {
    alignas(64) int32_t n[16];
    _mm512_store_si512(n, nc);
    for (int i = 0; i < 16; ++i)
      pv[i] = !(live >> i & 1) ? _mm512_set1_ps(kNegInf)
                               : gather_perm<NV>(xf + i * E, _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(cb + 16 * i))), lanes(n[i]));
    transpose16(pv);
  }
  const __m512i rowoff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int32_t(E)));
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < 16; ++j) {
    const __m512i id = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bt + 16 * j)));
    const __mmask16 m = live & _mm512_cmpgt_epi32_mask(nc, _mm512_set1_epi32(j));
    const __m512 v = _mm512_add_ps(perm ? pv[j] : _mm512_mask_i32gather_ps(_mm512_set1_ps(kNegInf), m, _mm512_add_epi32(rowoff, id), xf, 4), zero);
    const __m512i o = ordered(_mm512_castps_si512(v)), lo = _mm512_sub_epi32(_mm512_set1_epi32(255), id);
    keys[0][j] = _mm512_unpacklo_epi32(lo, o);
    keys[1][j] = _mm512_unpackhi_epi32(lo, o);
  }
  for (int h = 0; h < 2; ++h) {
    __m512i q[16];
    for (int j = 0; j < 16; ++j) q[j] = keys[h][j];
    sort_lanes<Live>(q);
    for (int j = 0; j < Live; ++j) keys[h][j] = q[j];
  }
  // Qword keys hold the rows in unpack order: lo = rows {0,1,4,5,..}, hi = {2,3,6,7,..}.
  const __m512i sel_id = _mm512_setr_epi32(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30);
  const __m512i sel_val = _mm512_add_epi32(sel_id, _mm512_set1_epi32(1));
  for (int j = 0; j < k; ++j) {
    id[j] = _mm512_sub_epi32(_mm512_set1_epi32(255), _mm512_permutex2var_epi32(keys[0][j], sel_id, keys[1][j]));
    val[j] = _mm512_castsi512_ps(ordered(_mm512_permutex2var_epi32(keys[0][j], sel_val, keys[1][j])));
  }
}

// The top k of a row of more than 16 candidates (keys >= th, nv vectors at key): the candidates'
// byte ids in expert order, then an insertion (strict '>' keeps the lower id first on ties).
// kv / ki: the k keys and ids, best first.
inline void many_candidates_topk(const float* key, int64_t nv, float th, int k, float* kv, int32_t* ki) {
  alignas(64) uint8_t cand[256 + 64];
  const int n = topk_collect_bytes(key, nv, _mm512_set1_ps(th), cand);
  int have = 0;
  for (int c = 0; c < n; ++c) {
    const float v = key[cand[c]];
    if (have == k && !(v > kv[k - 1])) continue;
    int pos = have < k ? have++ : k - 1;
    for (; pos > 0 && v > kv[pos - 1]; --pos) { kv[pos] = kv[pos - 1]; ki[pos] = ki[pos - 1]; }
    kv[pos] = v;
    ki[pos] = cand[c];
  }
}

// f(direct, k) for the two choices the kernel is compiled for: direct (std::true_type) when the
// logits are read in place, and k as std::integral_constant 8 when k == 8, else 0 (any k).
template <class F> bool with_direct_and_k(const RouterSpec& s, bool direct, F&& f) {
  auto by_k = [&](auto d) { return s.k == 8 ? f(d, std::integral_constant<int, 8>{}) : f(d, std::integral_constant<int, 0>{}); };
  return direct ? by_k(std::true_type{}) : by_k(std::false_type{});
}

// The block's k choices (ids[j], w[j]: choice j of every row, a row per lane) as a vector per row
// (ids[i], w[i]: row i's choices), each weight times mul.
OT_T16_AI inline void scale_and_transpose(__m512* ids, __m512* w, int64_t k, __m512 mul) {
  for (int64_t j = 0; j < k; ++j) w[j] = _mm512_mul_ps(w[j], mul);
  transpose16(w);
  transpose16(ids);
}

// The outputs of 16 rows for k = 8 (ids, weights in lanes 0-7 of ids[i] / w[i]), two rows a vector.
inline void write_pairs8(const RouterSpec& s, GatingResult& r, int64_t rb, const __m512* ids, const __m512* w) {
  const __m512i jr8 = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_epi32(int32_t(s.R))),
                                       _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  int32_t* ip = r.expert_idx.ptr<int32_t>() + rb * 8;
  int32_t* rp = s.row_idx ? r.row_idx.ptr<int32_t>() + rb * 8 : nullptr;
  const DType yt = r.y.dtype();
  for (int m = 0; m < 8; ++m) {
    __m512i id = _mm512_castps_si512(_mm512_shuffle_f32x4(ids[2 * m], ids[2 * m + 1], 0x44));
    if (s.finished) {
      const uint8_t* f = s.finished + rb + 2 * m;
      id = _mm512_mask_mov_epi32(id, __mmask16((f[0] ? 0x00ff : 0) | (f[1] ? 0xff00 : 0)), _mm512_set1_epi32(int32_t(s.E)));
    }
    _mm512_storeu_si512(ip + 16 * m, id);
    const __m512 y = _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x44);
    if (yt == DType::f32) _mm512_storeu_ps(r.y.ptr<float>() + (rb + 2 * m) * 8, y);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.y.ptr<uint16_t>() + (rb + 2 * m) * 8), yt == DType::bf16 ? simd::f32_to_bf16x16(y) : simd::f32_to_f16x16(y));
    if (rp) _mm512_storeu_si512(rp + 16 * m, _mm512_add_epi32(jr8, _mm512_set1_epi32(int32_t(rb + 2 * m))));
  }
}
}  // namespace ot::moe::impl::t16

#include "src/moe/router_vbmi_end.h"
