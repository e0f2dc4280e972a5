// The streaming read of memory for `ot peak` (AVX-512); the multiplier loops are the library's
// (src/gemm/rate_loops.h).
#include <immintrin.h>

#include <cstdint>

namespace ot::cli::peak {

// Sums n floats (n % 64 == 0) with four independent accumulators.
float read_sum(const float* p, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i < n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

}  // namespace ot::cli::peak
