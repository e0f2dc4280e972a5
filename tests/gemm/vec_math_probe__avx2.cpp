// Built with the AVX2 flags (ot_isa_sources); no gtest or std templates here, only the probe.
#include <immintrin.h>

#include "src/gemm/vec_math_avx2.h"
#include "vec_math_probe.h"

namespace ot::gemm::testing {

void vec_math_avx2(VecFn f, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    float in[8] = {}, out[8];
    for (int64_t k = 0; k < 8 && i + k < n; ++k) in[k] = x[i + k];
    __m256 v = _mm256_loadu_ps(in);
    switch (f) {
      case VecFn::exp: v = vm::exp(v); break;
      case VecFn::silu: v = vm::silu(v); break;
      case VecFn::erf: v = vm::erf(v); break;
      case VecFn::gelu: v = vm::gelu(v); break;
    }
    _mm256_storeu_ps(out, v);
    for (int64_t k = 0; k < 8 && i + k < n; ++k) y[i + k] = out[k];
  }
}

}  // namespace ot::gemm::testing
