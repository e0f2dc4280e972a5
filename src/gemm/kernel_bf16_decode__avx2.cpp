// Decode micro-kernel on AVX2 (M = 1..3 rows over whole bf16_vnni panels; the AVX-512 form is
// kernel_bf16_decode__avx512bf16.cpp): the weights are read once per call, so the kernel is a DRAM
// stream. A unit's panels run two side by side (panel i beside panel i + n/2), each its own
// sequential stream through its half of the unit (two streams per thread: -15% time at M 1 against
// one, four: +5-20%). 16 ymm registers hold 12 accumulators, so a tile of MR rows x 48 columns x 2
// panels is computed in column passes of NV ymm (8 columns) each, k in chunks whose later passes
// read the two panels from L1 (24 KiB of a 32 KiB L1). Widening as in kernel_avx2_bf16: k even =
// lane << 16, k odd = the lane's high half; fp32 FMAs. A pairs precomputed per chunk instead of
// widened per pass gave no gain (AMD EPYC AVX2-only VM, 2026-12-02). 3 rows run chunk-major
// 16-column passes instead (passes_tile, docs/gemm.md "AVX2 kernels").
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "src/gemm/bf16_widen_avx2.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {

constexpr int64_t kChunkPairs = 64;  // 64 pair rows = 12 KiB of a panel

// k odd by two shifts, no mask register: panels_tile's 12 accumulators, A pairs and widened B take all 16.
inline __m256 hi_f32_shifts(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16)); }

// tiles c[s] (row stride ldc) = A[MR][2 * pairs] x panel b[s], s < S; passes of NV ymm columns.
template <int MR, int NV, int S>
void panels_tile(int64_t pairs, const uint16_t* a, int64_t lda, const uint16_t* const* b, float* const* c, int64_t ldc) {
  for (int64_t p0 = 0; p0 < pairs || p0 == 0; p0 += kChunkPairs) {
    const int64_t p1 = std::min(pairs, p0 + kChunkPairs);
    for (int g = 0; g < 6 / NV; ++g) {
      const int col = 8 * NV * g;
      __m256 acc[S][MR][NV];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s)
        for (int r = 0; r < MR; ++r)
          for (int j = 0; j < NV; ++j) acc[s][r][j] = p0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c[s] + r * ldc + col + 8 * j);
      for (int64_t p = p0; p < p1; ++p) {
        // The first pass asks for the next pair row's three lines: a pass reads one or two of them,
        // and the lines the later passes need would otherwise miss on their own (M 2 -21%, M 3
        // -15% time on one thread).
        if (g == 0)
#pragma GCC unroll 2
          for (int s = 0; s < S; ++s)
            for (int l = 0; l < 3; ++l) _mm_prefetch(reinterpret_cast<const char*>(b[s] + (p + 1) * 2 * kNR) + 64 * l, _MM_HINT_T0);
        __m256 ae[MR], ao[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          int32_t pair;
          std::memcpy(&pair, a + r * lda + 2 * p, 4);
          const __m256i v = _mm256_set1_epi32(pair);
          ae[r] = lo_f32(v), ao[r] = hi_f32_shifts(v);
        }
#pragma GCC unroll 16
        for (int s = 0; s < S; ++s)
          for (int j = 0; j < NV; ++j) {
            const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(b[s] + p * 2 * kNR + 2 * col + 16 * j));
            const __m256 be = lo_f32(v), bo = hi_f32_shifts(v);
            for (int r = 0; r < MR; ++r) acc[s][r][j] = _mm256_fmadd_ps(ao[r], bo, _mm256_fmadd_ps(ae[r], be, acc[s][r][j]));
          }
      }
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s)
        for (int r = 0; r < MR; ++r)
          for (int j = 0; j < NV; ++j) _mm256_storeu_ps(c[s] + r * ldc + col + 8 * j, acc[s][r][j]);
    }
  }
}

// 1-2 rows (3: passes_tile below). The column pass width for mr rows and S streams: at most 12
// accumulators (S * MR * NV) beside the 2 * MR A registers and two widened B vectors.
template <int S>
void rows_tile(int mr, int64_t pairs, const uint16_t* a, int64_t lda, const uint16_t* const* b, float* const* c, int64_t ldc) {
  if (mr == 1) panels_tile<1, 6, S>(pairs, a, lda, b, c, ldc);
  else panels_tile<2, S == 2 ? 2 : 3, S>(pairs, a, lda, b, c, ldc);
}

// 3 rows (rows_tile's 3-row tile above is six 8-column passes a chunk, each widening the three A
// pairs again: 8-10 GB/s on one thread where 1-2 rows reach 15-26). Chunk-major 16-column passes
// instead, as kernel_avx2_bf16's tile (3 x 16 columns: 6 accumulators, 4 widened B vectors, A
// broadcast from the chunk's rows widened to fp32 once): for each chunk of kPassPairs pair rows, the
// three passes of panel 0, then of panel 1 (two streams a thread still). Each pass asks for its third
// of the next chunk's lines, contiguous (a line a pair row; the later passes read the chunk from L1).
constexpr int64_t kPassPairs = 32;  // 2 panels x 32 pair rows = 12 KiB, and the next chunk as much

// c[R][16] (+)= af[R][2 * pairs] (row stride 2 * kPassPairs) x b's 16 columns; pf: the first of the
// pairs lines to prefetch.
template <int R>
void pass16(int64_t pairs, const float* af, const uint16_t* b, float* c, int64_t ldc, bool load_c, const char* pf) {
  const __m256i hi = hi_mask();  // k odd: one AND (6 accumulators leave a register for the mask)
  __m256 acc[R][2];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2; ++j) acc[r][j] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * j) : _mm256_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    _mm_prefetch(pf + 64 * p, _MM_HINT_T0);
    const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + p * 2 * kNR));
    const __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + p * 2 * kNR + 16));
    const __m256 be0 = lo_f32(v0), bo0 = hi_f32(v0, hi);
    const __m256 be1 = lo_f32(v1), bo1 = hi_f32(v1, hi);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 ae = _mm256_broadcast_ss(af + r * 2 * kPassPairs + 2 * p), ao = _mm256_broadcast_ss(af + r * 2 * kPassPairs + 2 * p + 1);
      acc[r][0] = _mm256_fmadd_ps(ao, bo0, _mm256_fmadd_ps(ae, be0, acc[r][0]));
      acc[r][1] = _mm256_fmadd_ps(ao, bo1, _mm256_fmadd_ps(ae, be1, acc[r][1]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2; ++j) _mm256_storeu_ps(c + r * ldc + 8 * j, acc[r][j]);
}

// tiles c[s] (row stride ldc) = A[R][2 * pairs] x panel b[s], s < S.
template <int R, int S>
void passes_tile(int64_t pairs, const uint16_t* a, int64_t lda, const uint16_t* const* b, float* const* c, int64_t ldc) {
  alignas(32) float af[R * 2 * kPassPairs];
  for (int64_t p0 = 0; p0 < pairs || p0 == 0; p0 += kPassPairs) {
    const int64_t n = std::min(kPassPairs, pairs - p0);
    widen_rows(R, 2 * n, a + 2 * p0, lda, af, 2 * kPassPairs);
    for (int s = 0; s < S; ++s) {
      // The stream's next chunk: in this panel, or at its end the next panel's first (the stream's next).
      const char* next = reinterpret_cast<const char*>(b[s] + (p0 + n) * 2 * kNR);
#pragma GCC unroll 3
      for (int h = 0; h < 3; ++h) pass16<R>(n, af, b[s] + p0 * 2 * kNR + 32 * h, c[s] + 16 * h, ldc, p0 > 0, next + 64 * n * h);
    }
  }
}

}  // namespace

// A unit's n whole panels (memory order) for mr rows (tiles overwritten): panel i beside i + n/2,
// an odd last panel alone.
void kernel_decode_panels_avx2_bf16(int mr, int64_t kc, const void* a, int64_t lda, const char* const* panels, float* const* tiles, int n,
                                    int64_t ldc) {
  if (mr > kDecodeRows) {  // not a decode row block: the 8-row kernel, panel by panel
    for (int i = 0; i < n; ++i) kernel_avx2_bf16(mr, kc, a, lda, panels[i], tiles[i], ldc, false);
    return;
  }
  const auto* A = static_cast<const uint16_t*>(a);
  const int h = n / 2;
  for (int i = 0; i < h; ++i) {
    const uint16_t* b[2] = {reinterpret_cast<const uint16_t*>(panels[i]), reinterpret_cast<const uint16_t*>(panels[i + h])};
    float* c[2] = {tiles[i], tiles[i + h]};
    if (mr == 3) passes_tile<3, 2>(kc / 2, A, lda, b, c, ldc);
    else rows_tile<2>(mr, kc / 2, A, lda, b, c, ldc);
  }
  if (n % 2) {
    const uint16_t* b[1] = {reinterpret_cast<const uint16_t*>(panels[n - 1])};
    if (mr == 3) passes_tile<3, 1>(kc / 2, A, lda, b, &tiles[n - 1], ldc);
    else rows_tile<1>(mr, kc / 2, A, lda, b, &tiles[n - 1], ldc);
  }
}

}  // namespace ot::gemm::detail
