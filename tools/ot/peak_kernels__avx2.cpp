// AVX2 loops for `ot peak` on CPUs without AVX-512: fp32 FMA on ymm registers and a streaming read
// of memory (the same shapes as the AVX-512 loops, half the lanes).
#include <immintrin.h>

#include <cstdint>

#include "read_sum_loop.h"
#include "src/gemm/rate_loops_acc.h"

namespace ot::cli::peak {

namespace {
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
}  // namespace

// 12 independent accumulators hide the FMA latency on both pipes (src/gemm/rate_loops_acc.h).
float fma_loop_avx2(int64_t iters) {
  return hsum(gemm::detail::acc_loop(
      iters, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-3f), [](float f) { return _mm256_set1_ps(f); },
      [](__m256 a, __m256 x, __m256 y) { return _mm256_fmadd_ps(a, x, y); }, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); }));
}

// Sums n floats (n % 32 == 0, p 32-byte aligned).
float read_sum_avx2(const float* p, int64_t n) {
  return hsum(read_sum_loop<8>(p, n, _mm256_setzero_ps(), [](const float* q) { return _mm256_load_ps(q); },
                               [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); }));
}

}  // namespace ot::cli::peak
