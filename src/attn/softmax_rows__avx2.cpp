// AVX2 causal softmax rows (softmax_rows.h): 8 lanes with the library's vector exp (gemm::vm::exp),
// the row's tail (< 8 keys) in scalar code.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "src/attn/softmax_rows.h"
#include "src/gemm/vec_math_avx2.h"

namespace ot::attn {
namespace {
float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
}  // namespace

void softmax_rows_avx2(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in) {
  for (int64_t t = 0; t < T; ++t) {
    float* p = P + t * ld;
    const int64_t n = std::min(S, off + t + 1), nv = n / 8 * 8;
    if (lse_in) {
      const float l = lse_in[t];
      int64_t j = 0;
      for (; j < nv; j += 8) _mm256_storeu_ps(p + j, gemm::vm::exp(_mm256_sub_ps(_mm256_loadu_ps(p + j), _mm256_set1_ps(l))));
      for (; j < n; ++j) p[j] = std::exp(p[j] - l);
    } else {
      __m256 mv = _mm256_set1_ps(-INFINITY);
      for (int64_t j = 0; j < nv; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + j));
      float m = hmax(mv);
      for (int64_t j = nv; j < n; ++j) m = std::max(m, p[j]);
      __m256 sv = _mm256_setzero_ps();
      for (int64_t j = 0; j < nv; j += 8) {
        const __m256 e = gemm::vm::exp(_mm256_sub_ps(_mm256_loadu_ps(p + j), _mm256_set1_ps(m)));
        _mm256_storeu_ps(p + j, e);
        sv = _mm256_add_ps(sv, e);
      }
      float sum = hsum(sv);
      for (int64_t j = nv; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < n; ++j) p[j] *= inv;
      if (lse) lse[t] = m + std::log(sum);
    }
    std::fill(p + n, p + S, 0.f);
  }
}

}  // namespace ot::attn
