// Scalar micro-kernels (always available): the same tile contract as the vector kernels, for both
// panel layouts (a B packed for a higher ISA still works after the cap is lowered).
#include <cstring>

#include "ot/numeric.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// One row at a time: acc[48] (+)= sum_k A(r, k) * B(k, :), with the layout's element loaders.
template <class LoadA, class LoadB>
static void rows_scalar(int mr, int64_t kc, float* c, int64_t ldc, bool load_c, LoadA a_at, LoadB b_at) {
  for (int r = 0; r < mr; ++r) {
    float acc[kNR];
    for (int j = 0; j < kNR; ++j) acc[j] = load_c ? c[r * ldc + j] : 0.f;
    for (int64_t k = 0; k < kc; ++k) {
      float av = a_at(r, k);
      for (int j = 0; j < kNR; ++j) acc[j] += av * b_at(k, j);
    }
    std::memcpy(c + r * ldc, acc, sizeof acc);
  }
}

void kernel_scalar_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const float*>(a);
  auto B = static_cast<const float*>(b);
  rows_scalar(mr, kc, c, ldc, load_c, [&](int r, int64_t k) { return A[r * lda + k]; }, [&](int64_t k, int j) { return B[k * kNR + j]; });
}

// vnni panel: k-pairs interleaved, element (k, j) at (k / 2) * 96 + 2 * j + k % 2.
void kernel_scalar_vnni(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const uint16_t*>(a);
  auto B = static_cast<const uint16_t*>(b);
  rows_scalar(mr, kc, c, ldc, load_c, [&](int r, int64_t k) { return bf16_to_f32(A[r * lda + k]); },
              [&](int64_t k, int j) { return bf16_to_f32(B[(k >> 1) * 2 * kNR + 2 * j + (k & 1)]); });
}

}  // namespace ot::gemm::detail
