// Internals of the TN form (grouped_gemm_tn: tn_form.cpp, tn_form__avx512.cpp,
// tn_kernel__avx512bf16.cpp).
#pragma once
#include <cstdint>

#include "src/gemm/backward_forms.h"

namespace ot::gemm::detail {

// The direct-store path (bf16 operands, AVX512_BF16): B panels of 64 columns, 6-row kernel.
inline constexpr int kTnNR = 64;
inline constexpr int kTnMR = 6;

// C rows [0, rows) (rows <= kTnMR) x columns [0, width) (width <= 64) (=|+=) A^T x B over Kp (even)
// with A^T row r at a + r * lda (pairs adjacent) and B one 64-column panel. C fp32 or bf16 (row
// stride ldc elements), written from the accumulators: whole 64-byte lines with streaming stores
// when not accumulating, the rest with masked stores.
void tn_kernel_bf16_avx512bf16(int rows, int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, void* c, DType c_dtype, int64_t ldc,
                               int width, bool accumulate);

}  // namespace ot::gemm::detail
