// The streaming read of memory for `ot peak` (AVX-512); the multiplier loops are the library's
// (src/gemm/rate_loops.h).
#include <immintrin.h>

#include <cstdint>

#include "read_sum_loop.h"

namespace ot::cli::peak {

// Sums n floats (n % 64 == 0, p 64-byte aligned).
float read_sum(const float* p, int64_t n) {
  return _mm512_reduce_add_ps(read_sum_loop<16>(p, n, _mm512_setzero_ps(), [](const float* q) { return _mm512_load_ps(q); },
                                                [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
}

}  // namespace ot::cli::peak
