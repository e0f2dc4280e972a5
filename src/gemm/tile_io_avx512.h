// Load and store of a zmm register tile acc[MR][NZ] (row r, zmm column j at c + r * ldc + 16 j),
// shared by the AVX-512 micro-kernels. Internal linkage: each kernel file builds its own copy with
// its own ISA flags. Only for translation units built with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ot::gemm::detail {
namespace {

// acc = the tile at c when load_c, else zeros.
template <int MR, int NZ>
__attribute__((always_inline)) inline void load_acc(__m512 (&acc)[MR][NZ], const float* c, int64_t ldc, bool load_c) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) acc[r][j] = load_c ? _mm512_loadu_ps(c + r * ldc + 16 * j) : _mm512_setzero_ps();
}

template <int MR, int NZ>
__attribute__((always_inline)) inline void store_acc(const __m512 (&acc)[MR][NZ], float* c, int64_t ldc) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) _mm512_storeu_ps(c + r * ldc + 16 * j, acc[r][j]);
}

}  // namespace
}  // namespace ot::gemm::detail
