// vdpbf16ps rate loop (rate_loops.h). AMD Zen 4/5 run vdpbf16ps at twice the FMAs' flop rate, Intel
// Cooper Lake to Emerald Rapids at half (one zmm every 2 cycles).
#include "src/gemm/rate_loops.h"
#include "src/gemm/rate_loops_acc.h"

namespace ot::gemm::detail {

float bf16_dot_loop(int64_t iters) {
  // Small non-zero pairs (0.0625 * 0.0627 per product) keep the sums finite.
  return acc_loop_zmm(iters, (__m512bh)_mm512_set1_epi16(0x3d80), (__m512bh)_mm512_set1_epi16(0x3d81),
                  [](__m512 a, __m512bh x, __m512bh y) { return _mm512_dpbf16_ps(a, x, y); });
}

}  // namespace ot::gemm::detail
