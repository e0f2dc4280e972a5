// AVX2 pieces the router kernels share (router__avx2.cpp: rows; router_t8__avx2.cpp: 8 tokens in
// lanes): masked row loads, horizontal max / sum, 2^x, sigmoid, the row stores. Only for
// translation units built with the AVX2 flags (*__avx2.cpp); internal to each (anonymous namespace).
#pragma once
#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "src/core/cvt_avx2.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"

namespace ot::moe::impl {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;
// |row max| from which the softmax exps' offset fl(max log2 e) is off by more than 1 (see
// router_simd__avx512.h, kExpOffsetLimit): such rows go to the scalar row.
constexpr float kExpOffsetLimit = 16777216.f;  // 2^24

// Lane l of entry m: the l-th set bit of m (the rest 0): a compress of 8 lanes by one vpermps.
alignas(64) constexpr auto kCompress = [] {
  std::array<uint8_t, 256 * 8> a{};
  for (int m = 0; m < 256; ++m)
    for (int b = 0, n = 0; b < 8; ++b)
      if (m >> b & 1) a[size_t(8 * m + n++)] = uint8_t(b);
  return a;
}();

// 8 floats of a row from element i (lanes >= rem read as -inf).
inline __m256 load8(const void* base, DType t, int64_t i, int64_t rem) {
  __m256 v;
  if (rem >= 8) {
    if (t == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    return simd::half8_to_f32(static_cast<const uint16_t*>(base) + i, t == DType::bf16);
  }
  const __m256i m = simd::first_lanes(rem);
  if (t == DType::f32) {
    v = _mm256_maskload_ps(static_cast<const float*>(base) + i, m);
  } else {
    uint16_t h[8] = {};
    std::memcpy(h, static_cast<const uint16_t*>(base) + i, size_t(rem) * 2);
    v = simd::half8_to_f32(h, t == DType::bf16);
  }
  return _mm256_blendv_ps(_mm256_set1_ps(kNegInf), v, _mm256_castsi256_ps(m));
}

inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// The sum of v's lanes as the 8-tokens-in-lanes kernels' transposing hadd tree adds a row:
// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)).
inline float hsum_pairs(__m256 v) {
  const __m256 h = _mm256_hadd_ps(v, v), q = _mm256_hadd_ps(h, h);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
}

// 2^f for f in [0, 1): the AVX-512 kernels' degree-5 minimax polynomial (about 1 ulp).
inline __m256 exp2_poly(__m256 f) {
  __m256 p = _mm256_set1_ps(1.8775747157633305e-3f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.989345282316208e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.582631379365921e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24015362560749054f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931530833244324f));
  return _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.9999999403953552f));
}
// 2^t: t clamped to [-252, 254] (beyond, 2^t is 0 or +inf in fp32 anyway), 2^f (f = t - floor(t))
// scaled by 2^n in two halves (each a normal power of 2: the result underflows to 0 and overflows to
// +inf as it should). -inf gives 0.
inline __m256 exp2_ps(__m256 t) {
  t = _mm256_max_ps(_mm256_min_ps(t, _mm256_set1_ps(254.f)), _mm256_set1_ps(-252.f));
  const __m256 fl = _mm256_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 p = exp2_poly(_mm256_sub_ps(t, fl));
  const __m256i n = _mm256_cvtps_epi32(fl), n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
// 2^t by round-to-nearest for t in [-126, 128], in two parts, 2^t = kExp2Lead q scale: n = round(t)
// by the magic-number add (t + 1.5 2^23 + 127 in [2^23, 2^24) rounds to an integer: its low mantissa
// bits are n + 127, `slli 23` of them is scale = 2^n; n = 128 gives +inf); q = 2^f / kExp2Lead,
// f = t - n in [-0.5, 0.5], by a degree-5 minimax polynomial (relative error 7.5e-8) divided by its
// leading coefficient kExp2Lead (monic: the first step is an add, no register copy). vs the floor
// form (roundps, cvtps2dq and a bias add; exp2_ps): 2 ops fewer.
constexpr float kExp2Lead = 1.3276472167819943e-3f;
struct Exp2Parts {
  __m256 q, scale;
};
inline Exp2Parts exp2_parts(__m256 t) {
  const __m256 magic = _mm256_set1_ps(12583039.f);  // 1.5 2^23 + 127
  const __m256 y = _mm256_add_ps(t, magic);
  const __m256 f = _mm256_sub_ps(t, _mm256_sub_ps(y, magic));
  __m256 q = _mm256_add_ps(f, _mm256_set1_ps(7.2877351819961362f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(41.808646172809651f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(180.93752180790146f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(522.08670970993553f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(753.21219297885680f));
  return {q, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(y), 23))};
}
// 2^t / kExp2Lead for the softmax exps offset by the row max (t <= ~1: fl(max log2 e) may round
// down by half an ulp, kExpOffsetLimit; the constant factor cancels in the softmax's ratios: use it
// for the sums and the weights alike). t clamped below at -126 (an exp below 2^-126 counts as
// 2^-126: under 1e-37 of a sum >= 1). 11 ops a vector.
inline __m256 exp2_offset(__m256 t) {
  const Exp2Parts e = exp2_parts(_mm256_max_ps(t, _mm256_set1_ps(-126.f)));
  return _mm256_mul_ps(e.q, e.scale);
}
// 1 / (1 + 2^(-x log2 e)) with 2^t from exp2_parts, t clamped to [-126, 128]: x > 87.3 gives 1
// (as it rounds anyway), x < -88.38 gives 0 (true: below 4.2e-39, denormal; -inf, the padding, too).
// 16 ops a vector (by exp2_ps: 22).
inline __m256 sigmoid_ps(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 t = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(x, _mm256_set1_ps(-kLog2e)), _mm256_set1_ps(128.f)), _mm256_set1_ps(-126.f));
  const Exp2Parts e = exp2_parts(t);
  return _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_mul_ps(e.q, _mm256_set1_ps(kExp2Lead)), e.scale, one));
}

// write_row (router.cpp) for k <= 16 by 8-lane stores: ids (E for finished rows), y in its dtype,
// the v1 row_idx (j R + row). vals and ids hold whole vectors (lanes past k ignored).
inline void write_row8(const RouterSpec& s, GatingResult& r, int64_t row, const int32_t* ids, const float* vals) {
  const int64_t k = s.k;
  const bool fin = s.finished && s.finished[row];
  int32_t* out = r.expert_idx.ptr<int32_t>() + row * k;
  int32_t* ri = s.row_idx ? r.row_idx.ptr<int32_t>() + row * k : nullptr;
  const DType yt = r.y.dtype();
  void* yp = r.y.ptr<char>() + size_t(row * k) * dtype_size(yt);
  for (int q = 0; q < (k + 7) / 8; ++q) {
    const int64_t rem = k - 8 * q;
    const __m256i m = simd::first_lanes(rem);
    const __m256i id = fin ? _mm256_set1_epi32(int(s.E)) : _mm256_load_si256(reinterpret_cast<const __m256i*>(ids + 8 * q));
    // Plain stores for whole vectors: vmaskmov stores are slow on AMD cores (Zen 3: ~10% of the
    // 8-tokens-in-lanes softmax router's samples at E 128, k 8).
    if (rem >= 8) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * q), id);
    else _mm256_maskstore_epi32(out + 8 * q, m, id);
    const __m256 w = _mm256_loadu_ps(vals + 8 * q);
    if (yt == DType::f32) {
      if (rem >= 8) _mm256_storeu_ps(static_cast<float*>(yp) + 8 * q, w);
      else _mm256_maskstore_ps(static_cast<float*>(yp) + 8 * q, m, w);
    } else {
      const __m128i h = yt == DType::bf16 ? simd::f32_to_bf16x8(w) : simd::f32_to_f16x8(w);
      uint16_t* yh = static_cast<uint16_t*>(yp) + 8 * q;
      if (rem >= 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yh), h);
      } else {
        alignas(16) uint16_t t[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
        std::memcpy(yh, t, size_t(rem) * 2);
      }
    }
    if (ri) {
      const __m256i j = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * q));
      const __m256i v = _mm256_add_epi32(_mm256_mullo_epi32(j, _mm256_set1_epi32(int32_t(s.R))), _mm256_set1_epi32(int32_t(row)));
      if (rem >= 8) _mm256_storeu_si256(reinterpret_cast<__m256i*>(ri + 8 * q), v);
      else _mm256_maskstore_epi32(ri + 8 * q, m, v);
    }
  }
}

}  // namespace
}  // namespace ot::moe::impl
