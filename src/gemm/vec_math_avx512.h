// 16-lane exp / erf / activations for the AVX-512 epilogue (only *__avx512*.cpp include this).
// exp: Cody-Waite reduction + degree-7 polynomial (~1 ulp); erf: Abramowitz-Stegun 7.1.26
// (|error| < 1.5e-7), enough for fp32 outputs of the exact-erf GELU.
#pragma once
#include <immintrin.h>

#include "ot/gemm.h"

namespace ot::gemm::vm {

// e^x without a clamp: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite), degree-7 Taylor polynomial
// of e^r, scaled by 2^n (vscalefps underflows to 0 and overflows to inf cleanly); about 1 ulp for
// x in [-104, 89], NaN for x = -inf. The one vector exp of the project (epilogues, routers).
// exp_unclamped_n: U vectors in lockstep (each step applied to all U before the next; the same
// operations, so the same bits): a loop whose vectors each wait on the polynomial's chain of
// dependent FMAs interleaves U chains in program order, where the out-of-order window holds only
// about two iterations' worth.
template <int U>
__attribute__((always_inline)) inline void exp_unclamped_n(__m512* x) {
  __m512 n[U], r[U], p[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    n[u] = _mm512_roundscale_ps(_mm512_mul_ps(x[u], _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r[u] = _mm512_fnmadd_ps(n[u], _mm512_set1_ps(0.693145751953125f), x[u]);
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) r[u] = _mm512_fnmadd_ps(n[u], _mm512_set1_ps(1.428606765330187045e-06f), r[u]);
  static constexpr float kC[7] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p[u] = _mm512_set1_ps(1.f / 5040);
#pragma GCC unroll 7
  for (int i = 0; i < 7; ++i)
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) p[u] = _mm512_fmadd_ps(p[u], r[u], _mm512_set1_ps(kC[i]));
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) x[u] = _mm512_scalef_ps(p[u], n[u]);
}
inline __m512 exp_unclamped(__m512 x) {
  exp_unclamped_n<1>(&x);
  return x;
}

// e^x clamped to the normal fp32 range (activations never see inf or denormals from it). x is the
// second operand of min and max, the one they return for a NaN, so NaN stays NaN (as the AVX2 exp;
// with x first a NaN became the upper clamp, e^88).
template <int U>
__attribute__((always_inline)) inline void exp_n(__m512* x) {
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) x[u] = _mm512_max_ps(_mm512_set1_ps(-87.3365447504f), _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x[u]));
  exp_unclamped_n<U>(x);
}
inline __m512 exp(__m512 x) {
  exp_n<1>(&x);
  return x;
}

// 2^t: f = t - floor(t) in [0, 1) by one vreduceps, a degree-5 minimax polynomial (relative error
// 1.5e-7 over the fp32 range, about 1 ulp) and vscalefps, which floors t itself: 7 operations a
// vector. -inf gives 0, NaN gives NaN, 0 below the fp32 range, inf above it. The exp of the
// routers and of the bf16 gated norm, where it is on the critical path (always inlined into their
// large row loops, as exp_n).
__attribute__((always_inline)) inline __m512 exp2(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.8775747157633305e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.989345282316208e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.582631379365921e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24015362560749054f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931530833244324f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999999403953552f));
  return _mm512_scalef_ps(p, t);
}

inline __m512 silu(__m512 x) {
  __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

inline __m512 erf(__m512 x) {
  __m512 ax = _mm512_abs_ps(x);
  __m512 t = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_fmadd_ps(ax, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.f)));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  p = _mm512_mul_ps(p, t);
  __m512 e = exp(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), ax), ax));
  __m512 y = _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.f));
  // copy the sign of x
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)))));
}

inline __m512 gelu(__m512 x) {
  __m512 h = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(h, erf(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f))), h);
}

inline __m512 activate(Act a, __m512 x) {
  switch (a) {
    case Act::relu: return _mm512_max_ps(x, _mm512_setzero_ps());
    case Act::gelu: return gelu(x);
    case Act::silu: return silu(x);
    default: return x;
  }
}

}  // namespace ot::gemm::vm
