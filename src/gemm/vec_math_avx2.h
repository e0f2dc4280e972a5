// 8-lane exp / erf / activations for the AVX2 epilogue (only *__avx2.cpp include this): the
// formulas and accuracy of vec_math_avx512.h (exp ~1 ulp, erf |error| < 1.5e-7). Internal linkage
// (anonymous namespace): no other ISA's translation unit can share a copy.
#pragma once
#include <immintrin.h>

#include "ot/gemm.h"

namespace ot::gemm::vm {
namespace {

// e^x clamped to the normal fp32 range, as vm::exp: x = n ln2 + r (Cody-Waite), degree-7 Taylor
// polynomial of e^r, times 2^n built in the exponent bits. AVX2 has no vscalefps, so n is kept in
// [-126, 127] (2^n a normal float): the clamp of x to [ln FLT_MIN, 127.5 ln2] already does that
// except that 127.5 may round to 128; with n = 127 there, r = 0.5 ln2 is still in range.
// -inf -> FLT_MIN, +inf -> ~2.4e38 (never inf), NaN -> NaN (x is the NaN-passing operand of min/max).
inline __m256 exp(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3365447504f), _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  n = _mm256_min_ps(n, _mm256_set1_ps(127.f));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  // NaN: n converts to INT_MIN and the scale is garbage, but p is NaN and so is the product.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline __m256 silu(__m256 x) {
  __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

inline __m256 erf(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 ax = _mm256_andnot_ps(sign, x);
  __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(ax, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  __m256 e = exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), ax), ax));
  __m256 y = _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.f));
  return _mm256_or_ps(y, _mm256_and_ps(x, sign));  // copy the sign of x
}

inline __m256 gelu(__m256 x) {
  __m256 h = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(h, erf(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f))), h);
}

inline __m256 activate(Act a, __m256 x) {
  switch (a) {
    case Act::relu: return _mm256_max_ps(x, _mm256_setzero_ps());
    case Act::gelu: return gelu(x);
    case Act::silu: return silu(x);
    default: return x;
  }
}

}  // namespace
}  // namespace ot::gemm::vm
