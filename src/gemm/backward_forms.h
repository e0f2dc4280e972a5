// Internals of the backward forms (grouped_gemm_nt / grouped_gemm_tn): the vectorised pieces live
// in backward_forms__avx512.cpp, the drivers and scalar fallbacks in backward_forms.cpp.
#pragma once
#include <cstdint>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// dst[p * 48 + j] = row j's dword p, for j < rows (<= 48) and p < P; rows j >= `rows` get zeros.
// Row j starts at src + j * ld_bytes (any alignment). A bf16 k-pair is one dword, so this packs
// a vnni panel from [N][K] storage (P = K/2 pairs); for fp32 it packs an f32 panel (P = K).
void transpose_dwords_avx512(const char* src, int64_t ld_bytes, int rows, int64_t P, uint32_t* dst);

// C rows [0, rows) x columns [0, width) (=|+=) tile (row stride 48). Without accumulate, full
// 64-byte-aligned rows use streaming stores (no read-for-ownership of the gradient memory).
void store_tile_avx512(const float* tile, int rows, int width, float* c, int64_t ldc, bool accumulate);
void store_fence_avx512();

}  // namespace ot::gemm::detail
