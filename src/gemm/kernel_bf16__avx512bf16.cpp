// AVX-512 BF16 micro-kernel: MR x 48 fp32 tile, vdpbf16ps on k-pairs (one 32-bit broadcast of
// A's pair, three loads of the vnni B panel, 3*MR dot products per pair). The narrow form computes
// NZ = 1 or 2 of the panel's three 16-column zmm columns (a 32-column last panel, or a thread's
// share of a panel split at 16 columns), reading only those columns' cache lines.
#include <immintrin.h>

#include <cstring>

#include "src/gemm/internal.h"
#include "src/gemm/tile_io_avx512.h"

namespace ot::gemm::detail {

constexpr int64_t kPf = 32;  // k-pairs ahead (6 KiB of panel)

// b and c point at the first of the NZ zmm columns (b: its first k-pair, still 96 elements per pair).
template <int MR, int NZ>
static void tile_bf16(int64_t kc, const uint16_t* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c) {
  __m512 acc[MR][NZ];
  load_acc(acc, c, ldc, load_c);
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;  // pair k/2 starts at (k/2) * 96 elements
    // The B stream runs ahead of the hardware prefetcher's reach at small M (each weight line is
    // used by few rows): fetch the lines kPf k-pairs ahead (the panel continues contiguously).
    __m512bh bv[NZ];
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(bk + kPf * 2 * kNR + 32 * j), _MM_HINT_T0);
      bv[j] = (__m512bh)_mm512_load_si512(bk + 32 * j);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + k, 4);
      __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 3
      for (int j = 0; j < NZ; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
    }
  }
  store_acc(acc, c, ldc);
}

// The whole-panel tile, written out (its code is the one measured in docs/moe.md; the generic form
// above compiles to extra pointer spills around the loop at NZ = 3).
template <int MR>
static void tile_bf16_panel(int64_t kc, const uint16_t* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c) {
  __m512 acc[MR][3];
  load_acc(acc, c, ldc, load_c);
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;  // pair k/2 starts at (k/2) * 96 elements
    _mm_prefetch(reinterpret_cast<const char*>(bk + kPf * 2 * kNR), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bk + kPf * 2 * kNR + 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bk + kPf * 2 * kNR + 64), _MM_HINT_T0);
    __m512bh b0 = (__m512bh)_mm512_load_si512(bk), b1 = (__m512bh)_mm512_load_si512(bk + 32), b2 = (__m512bh)_mm512_load_si512(bk + 64);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + k, 4);
      __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
    }
  }
  store_acc(acc, c, ldc);
}

void kernel_avx512_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  with_mr(mr, [&](auto R) { tile_bf16_panel<decltype(R)::value>(kc, static_cast<const uint16_t*>(a), lda, static_cast<const uint16_t*>(b), c, ldc, load_c); });
}

void kernel_avx512_bf16_cols(int mr, int j0, int nz, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  const uint16_t* bj = static_cast<const uint16_t*>(b) + 32 * j0;  // zmm column j0 of a vnni pair row: 16 columns x 2
  float* cj = c + 16 * j0;
  with_mr(mr, [&](auto R) {
    constexpr int M = decltype(R)::value;
    switch (nz) {
      case 1: tile_bf16<M, 1>(kc, static_cast<const uint16_t*>(a), lda, bj, cj, ldc, load_c); break;
      case 2: tile_bf16<M, 2>(kc, static_cast<const uint16_t*>(a), lda, bj, cj, ldc, load_c); break;
      default: tile_bf16_panel<M>(kc, static_cast<const uint16_t*>(a), lda, bj, cj, ldc, load_c); break;
    }
  });
}

}  // namespace ot::gemm::detail
