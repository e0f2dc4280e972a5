// AVX-512 causal softmax rows (softmax_rows.h): 16 lanes, masked tails, the library's vector exp
// (gemm::vm::exp, ~1 ulp; the scalar expf was a fifth of the attention forward).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "src/attn/softmax_rows.h"
#include "src/gemm/vec_math_avx512.h"

namespace ot::attn {

void softmax_rows_avx512(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in) {
  for (int64_t t = 0; t < T; ++t) {
    float* p = P + t * ld;
    const int64_t n = std::min(S, off + t + 1);
    auto mask = [&](int64_t j) { return n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1); };
    if (lse_in) {
      const __m512 l = _mm512_set1_ps(lse_in[t]);
      for (int64_t j = 0; j < n; j += 16)
        _mm512_mask_storeu_ps(p + j, mask(j), gemm::vm::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask(j), p + j), l)));
    } else {
      __m512 mv = _mm512_set1_ps(-INFINITY);
      for (int64_t j = 0; j < n; j += 16) mv = _mm512_mask_max_ps(mv, mask(j), mv, _mm512_maskz_loadu_ps(mask(j), p + j));
      const float m = _mm512_reduce_max_ps(mv);
      const __m512 vm = _mm512_set1_ps(m);
      __m512 sv = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j += 16) {
        const __m512 e = gemm::vm::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask(j), p + j), vm));
        _mm512_mask_storeu_ps(p + j, mask(j), e);
        sv = _mm512_mask_add_ps(sv, mask(j), sv, e);
      }
      const float sum = _mm512_reduce_add_ps(sv);
      const __m512 inv = _mm512_set1_ps(1.f / sum);
      for (int64_t j = 0; j < n; j += 16) _mm512_mask_storeu_ps(p + j, mask(j), _mm512_mul_ps(_mm512_maskz_loadu_ps(mask(j), p + j), inv));
      if (lse) lse[t] = m + std::log(sum);
    }
    std::fill(p + n, p + S, 0.f);
  }
}

}  // namespace ot::attn
