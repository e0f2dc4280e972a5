// Scalar micro-kernels (always available): the same tile contract as the vector kernels, for both
// panel layouts (a B packed for a higher ISA still works after the cap is lowered).
#include <cstring>

#include "ot/numeric.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

void kernel_scalar_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const float*>(a);
  auto B = static_cast<const float*>(b);
  for (int r = 0; r < mr; ++r) {
    float acc[kNR];
    for (int j = 0; j < kNR; ++j) acc[j] = load_c ? c[r * ldc + j] : 0.f;
    for (int64_t k = 0; k < kc; ++k) {
      float av = A[r * lda + k];
      for (int j = 0; j < kNR; ++j) acc[j] += av * B[k * kNR + j];
    }
    std::memcpy(c + r * ldc, acc, sizeof acc);
  }
}

void kernel_scalar_vnni(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const uint16_t*>(a);
  auto B = static_cast<const uint16_t*>(b);
  for (int r = 0; r < mr; ++r) {
    float acc[kNR];
    for (int j = 0; j < kNR; ++j) acc[j] = load_c ? c[r * ldc + j] : 0.f;
    for (int64_t k = 0; k < kc; ++k) {
      float av = bf16_to_f32(A[r * lda + k]);
      const uint16_t* bk = B + (k >> 1) * 2 * kNR + (k & 1);
      for (int j = 0; j < kNR; ++j) acc[j] += av * bf16_to_f32(bk[2 * j]);
    }
    std::memcpy(c + r * ldc, acc, sizeof acc);
  }
}

}  // namespace ot::gemm::detail
