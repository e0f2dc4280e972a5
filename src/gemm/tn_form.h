// Internals of the TN form (grouped_gemm_tn: tn_form.cpp, tn_form__avx512.cpp,
// tn_kernel__avx512bf16.cpp, tn_form__avx2.cpp).
#pragma once
#include <cstdint>

#include "src/gemm/backward_forms.h"

namespace ot::gemm::detail {

// The direct-store path (bf16 operands, AVX512_BF16): B panels of 64 columns, 6-row kernel.
inline constexpr int kTnNR = 64;
inline constexpr int kTnMR = 6;

// C rows [0, nrows) (nrows <= kTnMR) x columns [0, N) (=|+=) A^T x B over Kp (even), along the
// np 64-column panels of B (panel p at b + p * panel_elems; columns p * 64 ..), with A^T row r at
// a + r * lda (pairs adjacent). C fp32 or bf16 (row stride ldc elements), written from the
// accumulators: whole 64-byte lines with streaming stores when not accumulating and C is 64-byte
// aligned, the rest with masked stores. bf16 C: vcvtne2ps2bf16 (round to nearest even, results
// below bf16's normal range flushed to zero). widen: fp32 FMAs on widened operands instead of
// vdpbf16ps (where bf16_dot_preferred() is false).
void tn_rows_bf16_avx512bf16(int nrows, int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, size_t panel_elems, int64_t np, void* c,
                             DType c_dtype, int64_t ldc, int64_t N, bool accumulate, bool widen);

// A^T as fp32 (tn_form__avx2.cpp): src [K][M] bf16 (row k at src + k * ld) -> dst [M][kp] fp32 (row
// stride ldd >= kp), column k of row m = src[k][m], columns K .. kp - 1 zero.
void pack_cols_f32_avx2(const uint16_t* src, int64_t ld, int64_t K, int64_t M, float* dst, int64_t ldd, int64_t kp);

}  // namespace ot::gemm::detail
