// AVX2 piece of the TN form (grouped_gemm_tn, tn_form.cpp): A^T widened to fp32 for the AVX2 bf16
// kernel's fp32-A entry (kernel_avx2_bf16_f32a), which broadcasts A from memory instead of
// widening the same A rows again for every panel of the unit.
#include <immintrin.h>

#include "src/core/cvt_avx2.h"
#include "src/core/transpose_avx2.h"
#include "src/gemm/tn_form.h"

namespace ot::gemm::detail {

void pack_cols_f32_avx2(const uint16_t* src, int64_t ld, int64_t K, int64_t M, float* dst, int64_t ldd, int64_t kp) {
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const int nm = int(M - m0 < 8 ? M - m0 : 8);
    for (int64_t k0 = 0; k0 < kp; k0 += 8) {
      const int nk = int(K - k0 < 8 ? (K - k0 > 0 ? K - k0 : 0) : 8);
      __m256 r[8];  // r[i] = A row k0 + i, columns m0 .. m0 + 7 (rows past K: 0, the pair padding)
      for (int i = 0; i < 8; ++i) {
        if (i >= nk) { r[i] = _mm256_setzero_ps(); continue; }
        r[i] = simd::load_n(src, DType::bf16, (k0 + i) * ld + m0, nm);
      }
      simd::transpose8x8(r);  // r[q] = columns k0 .. k0 + 7 of A^T row m0 + q
      const __m256i mk = simd::first_lanes(kp - k0);
      for (int q = 0; q < nm; ++q) _mm256_maskstore_ps(dst + (m0 + q) * ldd + k0, mk, r[q]);
    }
  }
}

}  // namespace ot::gemm::detail
