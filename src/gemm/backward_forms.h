// Internals of the backward forms: NT/NN (grouped_gemm_nt / _nn: backward_forms.cpp, vectorised
// pieces in backward_forms__avx512.cpp and backward_forms__avx2.cpp) and TN (grouped_gemm_tn:
// tn_form.cpp, tn_form__avx512.cpp).
// What both use is declared here.
#pragma once
#include <cstdint>

#include "ot/numeric.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// Element `off` of a bf16 / fp16 / fp32 array, as fp32 (scalar fallbacks and references).
inline float elem(const void* p, DType t, int64_t off) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}
inline int64_t pad_pairs(Layout l, int64_t K) { return l == Layout::f32 ? K : (K + 1) / 2 * 2; }  // no K padding beyond a pair
inline int64_t panels_of(int64_t N) { return (N + kNR - 1) / kNR; }
inline Kernel thin_kernel(Layout l) { return select_kernel(l, 1); }  // M = 1: never the AMX tiles

// store_tile_avx512 / store_tile_avx2 below, or their scalar equivalent.
void store_tile(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate);

// dst[p * 48 + j] = row j's dword p, for j < rows (<= 48) and p < P; rows j >= `rows` get zeros.
// Row j starts at src + j * ld_bytes (any alignment). A bf16 k-pair is one dword, so this packs
// a vnni panel from [N][K] storage (P = K/2 pairs); for fp32 it packs an f32 panel (P = K).
// pf_bytes > 0: also prefetch (into L2) the same rows pf_bytes further on (the next K chunk).
void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes = 0);
// transpose_dwords_avx512 on AVX2 (8x8 blocks; backward_forms__avx2.cpp).
void transpose_dwords_avx2(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes = 0);
// The same with row j at src[j] (j < rows), into a panel of `width` (a multiple of 16) dwords per row p.
void transpose_dword_rows_avx512(const char* const* src, int rows, int64_t P, uint32_t* dst, int width, int64_t pf_bytes = 0);
// c[j][i] (=|+=) t[i][j] for i < n, j < m (fp32; t rows ldt apart, readable up to a multiple of
// 16 columns past m).
void store_transposed_avx512(const float* t, int64_t ldt, int n, int m, float* c, int64_t ldc, bool accumulate);

// bf16 k-pair panel [ceil(K/2)][panel][2] (panel 48: the engine's; 64: TN's direct path) from K
// rows of `width` (<= panel) bf16 columns (row k at src + k * ld): rows 2p and 2p+1 interleaved;
// columns >= width and the odd tail's partner are 0.
void pack_rows_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst, int panel = kNR);
// pack_rows_vnni_avx512 on AVX2, for the engine's 48-column panel.
void pack_rows_vnni_avx2(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst);
// A^T for the TN form (tn_form__avx512.cpp): src [K][M] bf16 (row k at src + k * ld) -> dst [M][2 * ceil(K/2)] bf16
// (row stride ldd), pairs (k, k+1) adjacent, the odd tail's partner 0.
void pack_cols_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int64_t M, uint16_t* dst, int64_t ldd);

// C rows [0, rows) x columns [0, width) (=|+=) tile (fp32, row stride ldt); C fp32 or bf16 (round
// to nearest even). Without accumulate, whole 64-byte lines of C are written with streaming stores
// (no read-for-ownership of the gradient memory); the rest with masked stores.
void store_tile_avx512(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate);
void store_fence_avx512();
// store_tile_avx512 on AVX2 (backward_forms__avx2.cpp); ends with a store fence when it streamed.
void store_tile_avx2(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate);

}  // namespace ot::gemm::detail
