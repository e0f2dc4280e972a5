// The accumulator loop behind rate_loops.h (and `ot peak`'s AVX2 loop), for the per-ISA files that
// instantiate it (internal linkage: each file's copy is built with its own flags). 12 named
// registers, no arrays (GCC spills arrays of vectors), hide the latency on both pipes: acc =
// step(acc, x, y) on each, x kept opaque so the loop is not folded.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ot::gemm::detail {
namespace {

#define OT_RATE_ACCS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// The sum of the 12 accumulators after iters steps; splat(float) makes an accumulator (zmm or ymm),
// add sums two.
template <class V, class Splat, class Step, class Add>
auto acc_loop(int64_t iters, V x, V y, Splat splat, Step step, Add add) {
#define OT_RATE_DECL(i) auto a##i = splat(1.f + 0.01f * i);
#define OT_RATE_STEP(i) a##i = step(a##i, x, y);
#define OT_RATE_SUM(i) s = add(s, a##i);
  OT_RATE_ACCS(OT_RATE_DECL)
  for (int64_t it = 0; it < iters; ++it) {
    OT_RATE_ACCS(OT_RATE_STEP)
    __asm__ volatile("" : "+v"(x));
  }
  auto s = splat(0.f);
  OT_RATE_ACCS(OT_RATE_SUM)
  return s;
#undef OT_RATE_DECL
#undef OT_RATE_STEP
#undef OT_RATE_SUM
}

// acc_loop on zmm accumulators, summed to a float.
template <class V, class Step>
float acc_loop_zmm(int64_t iters, V x, V y, Step step) {
  return _mm512_reduce_add_ps(acc_loop(iters, x, y, [](float f) { return _mm512_set1_ps(f); }, step,
                                       [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
}

#undef OT_RATE_ACCS

}  // namespace
}  // namespace ot::gemm::detail
