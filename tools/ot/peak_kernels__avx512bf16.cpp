// Register-only loops for `ot peak`: AVX-512 fp32 FMA and vdpbf16ps on non-zero data (all-zero
// operands can run faster and overstate the peak), and a streaming read of memory.
#include <immintrin.h>

#include <cstdint>

namespace ot::cli::peak {

// 12 independent accumulators (named registers, no arrays: GCC spills arrays of vectors) hide the
// latency on both pipes: acc = step(acc, x, y) on each, x kept opaque so the loop is not folded.
// Returns a checksum so nothing is optimised away.
#define OT_PEAK_ACCS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

template <class V, class Step> float acc_loop(int64_t iters, V x, V y, Step step) {
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.f + 0.01f * i);
#define STEP(i) a##i = step(a##i, x, y);
#define SUM(i) s = _mm512_add_ps(s, a##i);
  OT_PEAK_ACCS(DECL)
  for (int64_t it = 0; it < iters; ++it) {
    OT_PEAK_ACCS(STEP)
    __asm__ volatile("" : "+v"(x));
  }
  __m512 s = _mm512_setzero_ps();
  OT_PEAK_ACCS(SUM)
  return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

float fma_loop(int64_t iters) {
  return acc_loop(iters, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f), [](__m512 a, __m512 x, __m512 y) { return _mm512_fmadd_ps(a, x, y); });
}

float bf16_loop(int64_t iters) {
  // Small non-zero pairs (0.0625 * 0.0627 per product) keep the sums finite.
  return acc_loop(iters, (__m512bh)_mm512_set1_epi16(0x3d80), (__m512bh)_mm512_set1_epi16(0x3d81),
                  [](__m512 a, __m512bh x, __m512bh y) { return _mm512_dpbf16_ps(a, x, y); });
}

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
