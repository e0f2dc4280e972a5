// The 8-tokens-in-lanes AVX2 router kernel's building blocks (router_t8__avx2.cpp): the vertical
// sorting network, the candidates (a bitmask) into slots, their per-lane top-k insertion, the
// block's row stores, the loop over blocks. Only for translation units built with the AVX2 flags;
// internal to each (anonymous namespace).
#pragma once
#include <algorithm>
#include <type_traits>
#include <utility>

#include "src/core/kernel_inline.h"
#include "src/core/transpose_avx2.h"
#include "src/moe/router_lane_counts.h"
#include "src/moe/router_net.h"
#include "src/moe/router_simd__avx2.h"

namespace ot::moe::impl {
namespace {

#define OT_T8_AI OT_KERNEL_INLINE

constexpr int kSlots = 16;  // candidates a row the block takes (more: the row kernel)
// Rows of a partial block from which it pays (T 1: the padded block was 1.6x the row kernel's time).
constexpr int kMinRows = 4;

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

// A block's candidate slots, slot-major: lane i of slot j is row i's j-th candidate (expert order),
// so the insertion loads them without a transpose. Values past a row's candidates stay -inf (never
// inserted: the ids there are never read).
struct Slots {
  alignas(32) float v[kSlots * 8];
  alignas(32) int32_t id[kSlots * 8];
  int nmax = 0;  // the most candidates of a decided row
  OT_T8_AI Slots() {
    for (int j = 0; j < kSlots; ++j) _mm256_store_ps(v + 8 * j, _mm256_set1_ps(kNegInf));
  }
};

// m ? b : a (_mm256_blendv_ps) into a's register, in a form GCC (12) cannot rewrite as
// (m < 0 ? b : a): when one mask feeds two blends it materializes that compare (a vpcmpgtd a mask,
// 7 a slot in insert_slots at k 8), and the in-place form needs no register copy.
OT_T8_AI inline __m256 blendv(__m256 a, __m256 b, __m256 m) {
  asm("vblendvps %2, %1, %0, %0" : "+x"(a) : "xm"(b), "x"(m));
  return a;
}
// Slots [0, n) (V / I + 8 j, lane i: row i's j-th candidate, in expert order) inserted per lane into
// K sorted (value, id) pairs, best first, from -inf (kv / ki[l], l < K). With g_l = x > kv[l] (old
// values; monotone in l: g_{l-1} implies g_l; each compare serves two levels) level l takes the
// candidate where g_l, the level above where g_{l-1}: max(kv[l], min(x, kv[l-1])) and two in-place
// blends of its id. No chain through the levels, and strict '>' keeps an equal earlier (lower-id)
// entry first. The pairs stay in registers (locals; through the pointers they were loaded and stored each slot).
template <int K> OT_T8_AI inline void insert_slots(const float* V, const int32_t* I, int n, __m256* kvo, __m256* kio) {
  __m256 kv[K], ki[K];
  for (int l = 0; l < K; ++l) kv[l] = ki[l] = _mm256_set1_ps(kNegInf);
  for (int j = 0; j < n; ++j) {
    const __m256 x = _mm256_load_ps(V + 8 * j), id = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(I + 8 * j)));
    __m256 g = _mm256_cmp_ps(x, kv[K - 1], _CMP_GT_OQ);
    for (int l = K - 1; l > 0; --l) {
      const __m256 up = _mm256_cmp_ps(x, kv[l - 1], _CMP_GT_OQ);
      ki[l] = blendv(blendv(ki[l], id, g), ki[l - 1], up);
      kv[l] = _mm256_max_ps(kv[l], _mm256_min_ps(x, kv[l - 1]));
      g = up;
    }
    ki[0] = blendv(ki[0], id, g);
    kv[0] = _mm256_max_ps(kv[0], x);
  }
  for (int l = 0; l < K; ++l) {
    kvo[l] = kv[l];
    kio[l] = ki[l];
  }
}
void insert_slots(int k, const float* V, const int32_t* I, int n, __m256* kv, __m256* ki) {
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

// A row's candidates (keys >= its threshold) as a bitmask in expert order, NV vectors of keys: the
// compare masks of 4 vectors packed to bytes (packs interleave the 128-bit halves: dwords c0lo c1lo
// c2lo c3lo c0hi ...; one vpermd restores the order), one movemask -> 32 bits. Replaces a movemask
// and test a vector and the compress table (an earlier form): the slots are filled per set bit.
template <int NV> struct Cands {
  static constexpr int kWords = (NV + 7) / 8;
  uint64_t m[kWords] = {};
  __m256 c[4];
  // Vector v's compare (call with v = 0, 1, .. NV - 1 in an unrolled loop: the packing folds).
  OT_T8_AI void add(int v, __m256 key, __m256 th) {
    c[v & 3] = _mm256_cmp_ps(th, key, _CMP_LE_OQ);  // (th first: key may stay a memory operand)
    if ((v & 3) != 3 && v != NV - 1) return;
    for (int j = (v & 3) + 1; j < 4; ++j) c[j] = _mm256_setzero_ps();
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(_mm256_castps_si256(c[0]), _mm256_castps_si256(c[1])),
                                         _mm256_packs_epi32(_mm256_castps_si256(c[2]), _mm256_castps_si256(c[3])));
    const uint32_t b = uint32_t(_mm256_movemask_epi8(_mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))));
    m[v / 8] |= uint64_t(b) << (32 * ((v / 4) & 1));
  }
  OT_T8_AI void keep_only(const uint64_t* w) {
    for (int i = 0; i < kWords; ++i) m[i] &= w[i];
  }
  OT_T8_AI int count() const {
    int n = 0;
    for (int w = 0; w < kWords; ++w) n += __builtin_popcountll(m[w]);
    return n;
  }
  // Row i's candidates (keys p) into the slots; more than kSlots: the row kernel's (redo).
  OT_T8_AI void to_slots(const float* p, int i, unsigned& redo, Slots& s) const {
    const int n = count();
    if (n > kSlots) {
      redo |= 1u << i;
      return;
    }
    float* v = s.v + i;
    int32_t* id = s.id + i;
    for (int w = 0; w < kWords; ++w)
      for (uint64_t b = m[w]; b; b &= b - 1, v += 8, id += 8) {
        const uint64_t e = uint64_t(__builtin_ctzll(b));  // (64-bit: no sign extension for the load)
        *v = p[64 * w + e];
        *id = int32_t(e) + 64 * w;
      }
    s.nmax = std::max(s.nmax, n);
  }
};
// A row the block decides: real, and not in redo (for the row kernel).
OT_T8_AI inline bool decided(int i, unsigned real, unsigned redo) { return (real >> i & 1) && !(redo >> i & 1); }
// The block's slots -> per lane the top k (value, id) pairs, best first, ties to the lower id
// (kv / ki[l], ids as float bits).
OT_T8_AI inline void top_slots(const Slots& s, int k, __m256* kv, __m256* ki) {
  for (int l = 0; l < 8; ++l) kv[l] = ki[l] = _mm256_set1_ps(kNegInf);  // (levels past k)
  insert_slots(k, s.v, s.id, s.nmax, kv, ki);
}
// The block's outputs: weights w[l] and ids ki[l] (lane i: row i; l < k) transposed back to rows and
// written for its real rows but those in redo, which the row kernel does (last: it uses b.xr).
OT_T8_AI inline bool write_block(const RouterSpec& s, GatingResult& r, int64_t rb, int rows, unsigned redo, __m256* w, __m256* ki,
                                 RouterScratch& b) {
  simd::transpose8x8(w);
  simd::transpose8x8(ki);
  const int64_t k = s.k;
  if (r.y.dtype() == DType::f32) {
    // Whole 8-lane stores (write_row8 a row was ~130 instructions of ~1000 a row at E 128, k 8):
    // with k < 8 row i's store runs into the next rows, which are written after it (here, or by
    // the row kernel: redo); a store that would pass the block's last row is masked (another
    // thread's rows or the end of the outputs follow).
    float* y = r.y.ptr<float>() + rb * k;
    int32_t* out = r.expert_idx.ptr<int32_t>() + rb * k;
    int32_t* ri = s.row_idx ? r.row_idx.ptr<int32_t>() + rb * k : nullptr;
    const __m256i jr = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(int32_t(s.R)));  // v1: j R + row
    const __m256i mk = simd::first_lanes(k), ide = _mm256_set1_epi32(int32_t(s.E));
    for (int i = 0; i < rows; ++i) {
      if (redo >> i & 1) continue;
      const __m256i id = s.finished && s.finished[rb + i] ? ide : _mm256_castps_si256(ki[i]);
      const __m256i rv = _mm256_add_epi32(jr, _mm256_set1_epi32(int32_t(rb + i)));
      if ((rows - i) * k >= 8) {
        _mm256_storeu_ps(y + i * k, w[i]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * k), id);
        if (ri) _mm256_storeu_si256(reinterpret_cast<__m256i*>(ri + i * k), rv);
      } else {
        _mm256_maskstore_ps(y + i * k, mk, w[i]);
        _mm256_maskstore_epi32(out + i * k, mk, id);
        if (ri) _mm256_maskstore_epi32(ri + i * k, mk, rv);
      }
    }
  } else {
    for (int i = 0; i < rows; ++i) {
      if (redo >> i & 1) continue;
      alignas(32) int32_t ids[8];
      alignas(32) float wr[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ids), _mm256_castps_si256(ki[i]));
      _mm256_store_ps(wr, w[i]);
      write_row8(s, r, rb + i, ids, wr);
    }
  }
  bool ok = true;
  for (unsigned m = redo; m; m &= m - 1) ok &= route_rows_avx2(s, r, rb + __builtin_ctz(m), rb + __builtin_ctz(m) + 1, b);  // last: it uses b.xr
  return ok;
}

// Rows [r0, r1) in blocks of 8 by block(rb, rows, x, pf) (x: 8 rows of E = 8 NV fp32 floats, the
// first `rows` real; pf: prefetch the next 8): fp32 rows in place; rows of other dtypes and a last
// partial block of kMinRows or more through fp32 copies in b.xr (the padding rows zero); a shorter
// one by the row kernel.
template <int NV, class Block> bool t8_blocks(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b, Block&& block) {
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
      ok &= block(rb, rows, s.x.ptr<float>() + rb * E, rb + 16 <= s.R);
      continue;
    }
    float* c = b.xr;
    for (int i = 0; i < 8; ++i)
      for (int v = 0; v < NV; ++v)
        _mm256_storeu_ps(c + i * E + 8 * v, i < rows ? load8(s.x.data, xt, (rb + i) * E + 8 * v, 8) : _mm256_setzero_ps());
    ok &= block(rb, rows, c, false);
  }
  return ok;
}
}  // namespace
}  // namespace ot::moe::impl
