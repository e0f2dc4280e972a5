// AVX-512 pieces of the 16-tokens-in-lanes router kernel (router_t16__avx512.cpp): row loads, 2^x,
// sigmoid, the candidate collection, the row stores.
// Only for translation units built with the AVX-512 flags (*__avx512*.cpp).
#pragma once
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <limits>

#include "src/core/cvt_avx512.h"
#include "src/core/kernel_inline.h"
#include "src/gemm/vec_math_avx512.h"
#include "src/moe/router_plan.h"

namespace ot::moe::impl::rsimd {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// 16 floats of a row from element i, as fp32.
inline __m512 load16(const void* base, DType t, int64_t i) {
  if (t == DType::f32) return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
  return t == DType::bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h);
}

constexpr float kLog2e = 1.44269504088896341f;

// 2^t (gemm::vm::exp2: vreduceps, a degree-5 polynomial, vscalefps; about 1 ulp). Every expert's
// exp is on the router's critical path; the tests' fp32 tolerance is 1e-5.
OT_KERNEL_INLINE inline __m512 exp2_ps(__m512 t) { return gemm::vm::exp2(t); }

// The softmax exps take 2^(x log2 e - m) with m = fl(max log2 e): the max's own exp is 2^d, d the
// rounding error of m, a factor common to the row that cancels in the normalisation while it stays
// in range. From |max| ~1.5e9 on, d reaches +-128 and the exps overflow or underflow (NaN weights:
// the rows of +-1e30 in the tests, hidden until their compare counted NaN): rows whose
// max is at least this large (d <= 1 below it) go to the scalar row.
inline constexpr float kExpOffsetLimit = 16777216.f;  // 2^24
inline __mmask16 exp_offset_too_large(__m512 mx) {
  return _mm512_cmp_ps_mask(_mm512_abs_ps(mx), _mm512_set1_ps(kExpOffsetLimit), _CMP_GE_OQ);
}

// 1 / (1 + 2^(-x log2 e)) by one vdivps (correctly rounded): on this core (Zen 5) it measured ~35%
// faster a vector than a reciprocal estimate + Newton step (13 ops, a longer dependency chain; the
// keys of the sigmoid router's pass 1 are ~16 of these a token). No clamp is needed: 2^t = +inf
// gives 1 / inf = 0, the sigmoid of x < -88 (as in fp64 up to a denormal); x = +-inf / NaN are the
// callers' errors.
inline __m512 sigmoid_ps(__m512 x) {
  return _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(-kLog2e)))));
}
inline __m512 sigmoid_add_ps(__m512 x, __m512 b) { return _mm512_add_ps(sigmoid_ps(x), b); }

// row[id] in the lanes of `valid` (-inf elsewhere) for a row of NV (even) vectors, by two-source
// permutes of its 32-expert pairs, then a blend tree on the id's pair bits (5, 6, ..): 2 loads and
// ~2 ops a pair instead of a vgatherdps (16 element loads; ~10% of the softmax router's time). The
// tree (NV / 2 - 1 blends, one bit test a level) replaced a compare + masked move a pair (AMD Zen 5
// VM, 2026-12-01: E 128 softmax b/a 0.97-0.98 in cache), and makes the E 256 rows (8 pairs) cheaper than the gather.
template <int NV> OT_KERNEL_INLINE inline __m512 gather_perm(const float* row, __m512i id, __mmask16 valid) {
  static_assert(NV % 2 == 0);
  __m512 p[NV / 2];
  for (int q = 0; q < NV / 2; ++q) p[q] = _mm512_permutex2var_ps(_mm512_loadu_ps(row + 32 * q), id, _mm512_loadu_ps(row + 32 * q + 16));
  for (int n = NV / 2, bit = 5; n > 1; n = (n + 1) / 2, ++bit) {
    const __mmask16 hi = _mm512_test_epi32_mask(id, _mm512_set1_epi32(1 << bit));
    for (int q = 0; 2 * q + 1 < n; ++q) p[q] = _mm512_mask_blend_ps(hi, p[2 * q], p[2 * q + 1]);
    if (n & 1) p[n / 2] = p[n - 1];
  }
  return _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid, p[0]);
}

// Top-k candidates: the ids of the experts whose key is >= vt (per lane), compressed in expert order
// as bytes (E <= 256) on cores with AVX512_VBMI2: one vpcompressb per 4 vectors (64 experts). cb
// must hold n + 64 bytes (no branches: every store is whole). Returns n.
alignas(64) inline constexpr auto kIota8 = [] {
  std::array<uint8_t, 256> a{};
  for (int i = 0; i < 256; ++i) a[size_t(i)] = uint8_t(i);
  return a;
}();
// The ids of the set bits of m[0, nv) (bit l of m[v]: expert 16 v + l) compressed as bytes into cb.
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) inline int compress_ids_bytes(const __mmask16* m, int64_t nv, uint8_t* cb) {
  int n = 0;
  for (int64_t g = 0; g < nv; g += 4) {
    const __mmask16 m0 = m[g], m1 = g + 1 < nv ? m[g + 1] : 0, m2 = g + 2 < nv ? m[g + 2] : 0, m3 = g + 3 < nv ? m[g + 3] : 0;
    const __mmask64 mm = _mm512_kunpackd(_mm512_kunpackw(m3, m2), _mm512_kunpackw(m1, m0));
    _mm512_storeu_si512(cb + n, _mm512_maskz_compress_epi8(mm, _mm512_load_si512(kIota8.data() + 16 * g)));
    n += int(__builtin_popcountll(mm));
  }
  return n;
}
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) inline int topk_collect_bytes(const float* key, int64_t nv, __m512 vt, uint8_t* cb) {
  __mmask16 m[16];
  for (int64_t v = 0; v < nv; ++v) m[v] = _mm512_cmp_ps_mask(_mm512_loadu_ps(key + 16 * v), vt, _CMP_GE_OQ);
  return compress_ids_bytes(m, nv, cb);
}
// The 16-tokens-in-lanes kernels need both (byte permutes and byte compress).
inline bool has_vbmi_and_vbmi2() {
  static const bool yes = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
  return yes;
}

// Lanes [0, k) of v summed in lane order: the order of the block's vertical sum over the chosen,
// for the rows of many candidates.
inline float sum_in_order(__m512 v, int64_t k) {
  alignas(64) float a[16];
  _mm512_store_ps(a, v);
  float s = 0.f;
  for (int64_t j = 0; j < k; ++j) s += a[j];
  return s;
}

// write_row from registers: ids (E for finished rows), weights cast to y's dtype, v1 row_idx.
// `whole`: all 16 lanes are stored unmasked (masked stores are slow on some cores); the lanes past
// k land in the next rows' slots, which the caller writes later.
// jr: lane j holds j * R (row_idx is k-major).
inline void write_row16(const RouterSpec& s, GatingResult& r, int64_t row, __m512i ids, __m512 w, bool whole, __m512i jr) {
  const int64_t k = s.k;
  const __mmask16 m = whole ? __mmask16(0xffff) : lanes(k);
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
    _mm512_mask_storeu_epi32(r.row_idx.ptr<int32_t>() + row * k, m, _mm512_add_epi32(jr, _mm512_set1_epi32(int32_t(row))));
  }
}

}  // namespace ot::moe::impl::rsimd
