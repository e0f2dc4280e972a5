// fp32 FMA rate loop (rate_loops.h).
#include "src/gemm/rate_loops.h"
#include "src/gemm/rate_loops_acc.h"

namespace ot::gemm::detail {

float fma_loop_avx512(int64_t iters) {
  return acc_loop_zmm(iters, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f), [](__m512 a, __m512 x, __m512 y) { return _mm512_fmadd_ps(a, x, y); });
}

}  // namespace ot::gemm::detail
