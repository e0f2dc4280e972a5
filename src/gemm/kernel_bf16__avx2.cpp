// AVX2 bf16 micro-kernel on the vnni panel (machines without a bf16 dot product): bf16 weights stay
// bf16 in memory and widen in registers. A ymm of a panel's pair row holds 8 columns x (k, k+1) as
// 32-bit lanes; a bf16 is the high half of its fp32, so k even = lane << 16, k odd = lane & 0xffff0000
// (exact). Products and sums are fp32 FMAs, as in the scalar kernel. Rows run in groups of <= 4 over
// 16-column passes (8 accumulators, 4 widened B vectors), or of 5-6 (tile6_bf16: 12 accumulators);
// each pass broadcasts A from fp32 rows in memory (a load, no ALU op): widening A per pass cost 4
// vector ops per row and k pair, more than the B widening, and held the kernel near half the FMA peak. The driver packs A as fp32 once per
// row block for kernel_avx2_bf16_f32a; kernel_avx2_bf16 (bf16 A, its other callers) widens a
// group's A rows once per K chunk into an L1 buffer, ~5% of the kernel's time in L1 and more when
// A comes from L2. A tile of 5-6 rows is one group (docs/gemm.md "AVX2 kernels"), of 7-8 rows a
// group of 4 and the rest over each K chunk in turn (with full 8-row
// tiles in the driver, 29 rows are 7 groups of 4 and 1 row, not 5 of 4 and 3 of 3): each
// accumulator takes two dependent FMAs per k pair, so a 4-row group (8 chains, 16 FMAs) runs at the
// FMA bound and a 3-row one at the latency bound, 3/4 of it (in L1: 4 rows 87% of one core's peak,
// 3 rows 70%, 2 rows 49%, 1 row 61%; a 1-row tail costs a third of a 3-row group). Each pass
// prefetches a third of the next B chunk into L2 (one line per k pair): the chunk's first group
// otherwise waits on DRAM at every new line. A single row runs over the whole 48 columns (even / odd
// k in separate accumulators, so twelve FMA chains hide the latency).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "src/gemm/bf16_widen_avx2.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {

// A K chunk: a group's widened A rows (kKChunk floats each, 4 KiB) stay in L1 beside the B chunk.
constexpr int64_t kKChunk = 256;

// C[R][8*NV] (+)= A[R][kc] x B (af: the fp32 A rows, row stride las; b, c at the sub-tile's first
// column; a pair row is 2*kNR elements); pf: kc/2 cache lines to prefetch, one per k pair
// (prefetches never fault, so running past the last panel is harmless).
template <int R, int NV>
void tile_bf16(int64_t kc, const float* af, int64_t las, const uint16_t* b, float* c, int64_t ldc, bool load_c, const char* pf) {
  const __m256i hi = hi_mask();
  __m256 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) acc[r][j] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * j) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;  // pair k/2 starts at (k/2) * 96 elements
    _mm_prefetch(pf + k * 32, _MM_HINT_T1);
    __m256 be[NV], bo[NV];
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) {
      __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(bk + 16 * j));
      be[j] = lo_f32(v), bo[j] = hi_f32(v, hi);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 ae = _mm256_broadcast_ss(af + r * las + k), ao = _mm256_broadcast_ss(af + r * las + k + 1);
#pragma GCC unroll 6
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_fmadd_ps(ao, bo[j], _mm256_fmadd_ps(ae, be[j], acc[r][j]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(c + r * ldc + 8 * j, acc[r][j]);
}

// 5-6 rows x 16 columns (12 accumulators): the k-even half, then the k-odd half with B loaded again
// from L1, so 12 accumulators + 2 widened B + one A broadcast + the mask fit 16 ymm (tile_bf16's
// layout would need 18). Each broadcast still feeds two FMAs and each accumulator takes two
// dependent FMAs per pair (12 chains: the FMA bound, where 4 + 2 rows ran a latency-bound 2-row
// group over the panel a second time). Same arguments as tile_bf16. Not inlined: inlined into
// group_bf16, GCC kept the accumulators on the stack.
template <int R>
__attribute__((noinline)) void tile6_bf16(int64_t kc, const float* af, int64_t las, const uint16_t* b, float* c, int64_t ldc, bool load_c, const char* pf) {
  const __m256i hi = hi_mask();
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2; ++j) acc[r][j] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * j) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k += 2) {
    const __m256i* bk = reinterpret_cast<const __m256i*>(b + k * kNR);
    _mm_prefetch(pf + k * 32, _MM_HINT_T1);
#pragma GCC unroll 2
    for (int odd = 0; odd < 2; ++odd) {
      const __m256i v0 = _mm256_load_si256(bk), v1 = _mm256_load_si256(bk + 1);
      const __m256 w0 = odd ? hi_f32(v0, hi) : lo_f32(v0), w1 = odd ? hi_f32(v1, hi) : lo_f32(v1);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 a = _mm256_broadcast_ss(af + r * las + k + odd);
        acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
        // Keeps each broadcast next to its FMAs and the odd half's B loads after the even half's:
        // GCC otherwise hoists all six broadcasts (or keeps v0, v1 live) and spills accumulators.
        __asm__ volatile("" : "+x"(acc[r][0]), "+x"(acc[r][1])::"memory");
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2; ++j) _mm256_storeu_ps(c + r * ldc + 8 * j, acc[r][j]);
}

// One row (bf16 or fp32) over the whole panel: even and odd k accumulate apart (12 independent chains).
template <class TA>
void row_bf16(int64_t kc, const TA* a, const uint16_t* b, float* c, bool load_c) {
  const __m256i hi = hi_mask();
  __m256 ev[6], od[6];
#pragma GCC unroll 6
  for (int j = 0; j < 6; ++j) ev[j] = load_c ? _mm256_loadu_ps(c + 8 * j) : _mm256_setzero_ps(), od[j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;
    __m256 ae, ao;
    if constexpr (std::is_same_v<TA, float>) {
      ae = _mm256_broadcast_ss(a + k), ao = _mm256_broadcast_ss(a + k + 1);
    } else {
      int32_t pair;
      std::memcpy(&pair, a + k, 4);
      const __m256i p = _mm256_set1_epi32(pair);
      ae = lo_f32(p), ao = hi_f32(p, hi);
    }
#pragma GCC unroll 6
    for (int j = 0; j < 6; ++j) {
      __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(bk + 16 * j));
      ev[j] = _mm256_fmadd_ps(ae, lo_f32(v), ev[j]);
      od[j] = _mm256_fmadd_ps(ao, hi_f32(v, hi), od[j]);
    }
  }
#pragma GCC unroll 6
  for (int j = 0; j < 6; ++j) _mm256_storeu_ps(c + 8 * j, _mm256_add_ps(ev[j], od[j]));
}

// A (TA: bf16, or fp32 as kernel_avx2_bf16_f32a gets it) row stride lda elements.
template <int R, class TA>
void group_bf16(int64_t kc, const TA* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c) {
  constexpr bool f32a = std::is_same_v<TA, float>;
  if constexpr (R == 1) {
    row_bf16(kc, a, b, c, load_c);
  } else {
    alignas(32) float wide[f32a ? 1 : R * kKChunk];
    // The tile's fp32 accumulators go through C between chunks: the same sums in the same order.
    int64_t k0 = 0;
    do {  // at least once: kc = 0 still writes (or keeps) the tile
      const int64_t n = kc - k0 < kKChunk ? kc - k0 : kKChunk;
      const float* af;
      int64_t las;
      if constexpr (f32a) {
        af = a + k0, las = lda;
      } else {
        widen_rows(R, (n + 1) & ~int64_t(1), a + k0, lda, wide, kKChunk);  // whole pairs, as the pair loop reads them
        af = wide, las = kKChunk;
      }
      // The next chunk (of this panel, or the next panel's first: a unit's panels are adjacent) is
      // n pairs x 192 bytes = 3n/2 lines, n/2 per pass.
      const char* next = reinterpret_cast<const char*>(b + (k0 + n) * kNR);
#pragma GCC unroll 3
      for (int h = 0; h < 3; ++h) {
        if constexpr (R <= 4) tile_bf16<R, 2>(n, af, las, b + k0 * kNR + 32 * h, c + 16 * h, ldc, load_c || k0 > 0, next + h * n * 32);
        else tile6_bf16<R>(n, af, las, b + k0 * kNR + 32 * h, c + 16 * h, ldc, load_c || k0 > 0, next + h * n * 32);
      }
      k0 += kKChunk;
    } while (k0 < kc);
  }
}

template <class TA>
void kernel(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  auto A = static_cast<const TA*>(a);
  auto B = static_cast<const uint16_t*>(b);
  if (mr <= 6) {  // one group
    with_mr(mr, [&](auto R) {
      if constexpr (decltype(R)::value <= 6) group_bf16<decltype(R)::value>(kc, A, lda, B, c, ldc, load_c);
    });
    return;
  }
  // 7-8 rows: a group of 4 and one of 3-4 (5 + 2 or 6 + 2 would add a latency-bound 2-row group),
  // chunk by chunk, so the second group reads each B chunk from L1 where it ran over the whole
  // panel again (a decode tile's panel is 0.4-1.4 MB: from L3, as a second stream).
  for (int64_t k0 = 0; k0 < kc || k0 == 0; k0 += kKChunk) {
    const int64_t n = kc - k0 < kKChunk ? kc - k0 : kKChunk;
    group_bf16<4>(n, A + k0, lda, B + k0 * kNR, c, ldc, load_c || k0 > 0);
    if (mr == 7) group_bf16<3>(n, A + 4 * lda + k0, lda, B + k0 * kNR, c + 4 * ldc, ldc, load_c || k0 > 0);
    else group_bf16<4>(n, A + 4 * lda + k0, lda, B + k0 * kNR, c + 4 * ldc, ldc, load_c || k0 > 0);
  }
}

}  // namespace

void kernel_avx2_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  kernel<uint16_t>(mr, kc, a, lda, b, c, ldc, load_c);
}

void kernel_avx2_bf16_f32a(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  kernel<float>(mr, kc, a, lda, b, c, ldc, load_c);
}

}  // namespace ot::gemm::detail
