// Internals of the backward forms (grouped_gemm_nt / grouped_gemm_tn): the vectorised pieces live
// in backward_forms__avx512.cpp, the drivers and scalar fallbacks in backward_forms.cpp.
#pragma once
#include <cstdint>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// dst[p * 48 + j] = row j's dword p, for j < rows (<= 48) and p < P; rows j >= `rows` get zeros.
// Row j starts at src + j * ld_bytes (any alignment). A bf16 k-pair is one dword, so this packs
// a vnni panel from [N][K] storage (P = K/2 pairs); for fp32 it packs an f32 panel (P = K).
// pf_bytes > 0: also prefetch (into L2) the same rows pf_bytes further on (the next K chunk).
void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst, int64_t pf_bytes = 0);

// bf16 k-pair panel [ceil(K/2)][48][2] from K rows of `width` (<= 48) bf16 columns (row k at
// src + k * ld): rows 2p and 2p+1 interleaved; columns >= width and the odd tail's partner are 0.
void pack_rows_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int width, uint16_t* dst);
// A^T for the TN form: src [K][M] bf16 (row k at src + k * ld) -> dst [M][2 * ceil(K/2)] bf16
// (row stride ldd), pairs (k, k+1) adjacent, the odd tail's partner 0.
void pack_cols_vnni_avx512(const uint16_t* src, int64_t ld, int64_t K, int64_t M, uint16_t* dst, int64_t ldd);

// C rows [0, rows) x columns [0, width) (=|+=) tile (fp32, row stride ldt); C fp32 or bf16 (round
// to nearest even). Without accumulate, whole 64-byte lines of C are written with streaming stores
// (no read-for-ownership of the gradient memory); the rest with masked stores.
void store_tile_avx512(const float* tile, int64_t ldt, int rows, int width, void* c, DType c_dtype, int64_t ldc, bool accumulate);
void store_fence_avx512();

}  // namespace ot::gemm::detail
