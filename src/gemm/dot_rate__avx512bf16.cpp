// Measures how vdpbf16ps compares with fp32 FMAs on this CPU (see bf16_dot_is_fast in driver.cpp):
// AMD Zen 4/5 run it at twice the FMA flop rate, Intel Cooper Lake to Emerald Rapids at half
// (one zmm every 2 cycles). Twelve independent accumulators on each side hide the latencies.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ot::gemm::detail {

namespace {

#define OT_RATE_ACCS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// Seconds for iters x 12 steps; x stays opaque to the compiler so nothing folds.
template <class V, class Step> double time_loop(int iters, V x, V y, Step step, float* sink) {
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.f + 0.01f * i);
#define STEP(i) a##i = step(a##i, x, y);
#define SUM(i) s = _mm512_add_ps(s, a##i);
  OT_RATE_ACCS(DECL)
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    OT_RATE_ACCS(STEP)
    __asm__ volatile("" : "+v"(x));
  }
  __m512 s = _mm512_setzero_ps();
  OT_RATE_ACCS(SUM)
  *sink += _mm512_reduce_add_ps(s);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#undef DECL
#undef STEP
#undef SUM
}

}  // namespace

double bf16_dot_to_fma_flop_ratio() {
  constexpr int kIters = 4000;  // ~48k instructions a loop: 15-35 us
  float sink = 0.f;
  double dot = 1e30, fma = 1e30;
  for (int rep = 0; rep < 3; ++rep) {  // interleaved, best of three: a busy sibling thread only slows a sample
    dot = std::min(dot, time_loop(kIters, (__m512bh)_mm512_set1_epi16(0x3d80), (__m512bh)_mm512_set1_epi16(0x3d81),
                                  [](__m512 a, __m512bh x, __m512bh y) { return _mm512_dpbf16_ps(a, x, y); }, &sink));
    fma = std::min(fma, time_loop(kIters, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f),
                                  [](__m512 a, __m512 x, __m512 y) { return _mm512_fmadd_ps(a, x, y); }, &sink));
  }
  __asm__ volatile("" ::"x"(sink));
  return (64.0 / dot) / (32.0 / fma);  // vdpbf16ps zmm: 32 products + 32 sums; an FMA zmm: 16 + 16
}

}  // namespace ot::gemm::detail
