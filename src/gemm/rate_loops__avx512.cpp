// fp32 FMA rate loop (rate_loops.h).
#include "src/gemm/rate_loops.h"
#include "src/gemm/rate_loops_acc.h"

namespace ot::gemm::detail {

float fma_loop_avx512(int64_t iters) {
  return acc_loop_zmm(iters, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f), [](__m512 a, __m512 x, __m512 y) { return _mm512_fmadd_ps(a, x, y); });
}

}  // namespace ot::gemm::detail

#include "src/gemm/vnni_target_begin.h"
namespace ot::gemm::detail {

// vpdpbusd rate loop (rate_loops.h; the W8A8 kernel's multiplier): 12 named accumulators, each
// step an inline asm that keeps the accumulator in its register (GCC 12 moves it around the
// intrinsic, and does not inline a lambda across the target attribute).
#define OT_I8_ACCS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
float int8_dot_loop(int64_t iters) {
  __m512i x = _mm512_set1_epi8(3);
  const __m512i y = _mm512_set1_epi8(-5);
#define OT_I8_DECL(i) __m512i a##i = _mm512_set1_epi32(i);
#define OT_I8_STEP(i) asm("vpdpbusd %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(y));
#define OT_I8_SUM(i) s = _mm512_add_epi32(s, a##i);
  OT_I8_ACCS(OT_I8_DECL)
  for (int64_t it = 0; it < iters; ++it) {
    OT_I8_ACCS(OT_I8_STEP)
    __asm__ volatile("" : "+v"(x));
  }
  __m512i s = _mm512_setzero_si512();
  OT_I8_ACCS(OT_I8_SUM)
#undef OT_I8_DECL
#undef OT_I8_STEP
#undef OT_I8_SUM
#undef OT_I8_ACCS
  return float(_mm512_reduce_add_epi32(s));
}

}  // namespace ot::gemm::detail
#include "src/gemm/vnni_target_end.h"
