// AVX2 row hooks of the GDN layer kernels (see layer_row_math_generic.h): 8 lanes at a time with
// the library's conversions (src/core/cvt_avx2.h) and exp (src/gemm/vec_math_avx2.h). Only for
// *__avx2.cpp translation units; internal linkage.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "src/core/cvt_avx2.h"
#include "src/core/elem_at.h"
#include "src/gemm/vec_math_avx2.h"

namespace ot::gdn::detail {
namespace {

inline void load_row(const void* p, DType t, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    const __m256 v = simd::load_n(p, t, i, m);
    if (m == 8) _mm256_storeu_ps(dst + i, v);
    else _mm256_maskstore_ps(dst + i, simd::first_lanes(m), v);
  }
}
inline void store_row(const float* src, void* p, DType t, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    const __m256 v = m == 8 ? _mm256_loadu_ps(src + i) : _mm256_maskload_ps(src + i, simd::first_lanes(m));
    simd::store_n(p, t, i, m, v);
  }
}
inline __m256 sigmoid8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.f);
  return _mm256_div_ps(one, _mm256_add_ps(one, gemm::vm::exp(_mm256_sub_ps(_mm256_setzero_ps(), v))));
}
// The loops below run over whole vectors: callers' rows are padded to a multiple of 8 floats.
inline void sigmoid_row(const float* v, float* sig, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(sig + i, sigmoid8(_mm256_loadu_ps(v + i)));
}
inline void silu_row(float* v, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    _mm256_storeu_ps(v + i, _mm256_mul_ps(x, sigmoid8(x)));
  }
}
inline void silu_grad_row(const float* a, float* g, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i), s = sigmoid8(x);
    const __m256 d = _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), d));
  }
}

}  // namespace
}  // namespace ot::gdn::detail
