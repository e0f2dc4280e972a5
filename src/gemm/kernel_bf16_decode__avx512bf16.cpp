// Decode micro-kernel (M = 1..2 rows, one whole B panel per call): the weights are read once per
// call, so the kernel is a DRAM stream, not a dot-product loop. A single sequential stream per
// thread reaches only ~49 GB/s on two threads here, two concurrent streams per thread ~61 GB/s
// (plain read loops over the same 76 MB of Qwen3 T1 expert weights, AMD Zen 5 VM, 2026-11-30):
// the hardware prefetcher keeps a bounded number of lines in flight per stream. So the panel's
// k-pairs are cut into S contiguous ranges read side by side, each with its own accumulators
// (3 * MR * S zmm), summed at the end. Software prefetch on Intel only (gemm.decode_pf, gemm.far_pf).
// The driver hands a decode unit's panels over at once (kernel_decode_panels_bf16): two whole
// panels side by side give longer streams than two halves of one panel (AMD Zen 5 VM, 2026-12-01).
#include <immintrin.h>

#include <cstring>

#include "ot/cpu.h"
#include "src/core/knobs.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// Software prefetch distance of the pair tile's two streams, in k pairs (0: none). Intel's L2
// streamer does not run across 4 KiB page boundaries, so each stream restarts its ramp every 4 KiB:
// 32 pairs (6 KiB) ahead, 3 lines a step on each stream, made moe_ffn decode 11-15% faster on an
// Emerald Rapids VM (2026-12-02; 16 and 64 pairs, T1/T2 hints the same). On the AMD Zen 5 VM it
// was 5-10% slower (2026-12-01): its prefetchers already run these streams.
static knobs::Knob g_decode_pf("gemm.decode_pf", cpu::features().intel ? 32 : 0, 0, 256,
                               "decode pair tile: software prefetch this many k pairs ahead (0 = none; default 32 on Intel, 0 elsewhere)");

// Prefetches of the pair row bk: its 3 lines `near` elements ahead into L1 and `far` ahead into L2 (0: none).
__attribute__((always_inline)) static inline void prefetch_pair_row(const uint16_t* bk, int64_t near, int64_t far) {
  const char* p = reinterpret_cast<const char*>(bk);
  if (near) {
#pragma GCC unroll 3
    for (int q = 0; q < 3; ++q) _mm_prefetch(p + 2 * near + 64 * q, _MM_HINT_T0);
  }
  if (far) {
#pragma GCC unroll 3
    for (int q = 0; q < 3; ++q) _mm_prefetch(p + 2 * far + 64 * q, _MM_HINT_T1);
  }
}

// acc[r][0..2] += row r's k-pair p of A times the panel's three zmm columns at that k-pair (bk).
template <int MR>
__attribute__((always_inline)) static inline void pair_step(__m512 (&acc)[MR][3], const uint16_t* a, int64_t lda, int64_t p, const uint16_t* bk) {
  const __m512bh b0 = (__m512bh)_mm512_load_si512(bk), b1 = (__m512bh)_mm512_load_si512(bk + 32), b2 = (__m512bh)_mm512_load_si512(bk + 64);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    int32_t pair;
    std::memcpy(&pair, a + r * lda + 2 * p, 4);
    const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
  }
}

template <int MR, int S>
static void decode_tile(int64_t kc, const uint16_t* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c) {
  const int64_t pairs = kc / 2, len = pairs / S;  // pairs of stream s: [s * len, (s + 1) * len); the tail goes to stream 0
  __m512 acc[S][MR][3];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 3; ++j) acc[s][r][j] = load_c && s == 0 ? _mm512_loadu_ps(c + r * ldc + 16 * j) : _mm512_setzero_ps();
  auto step = [&](int s, int64_t p) { pair_step<MR>(acc[s], a, lda, p, b + p * 2 * kNR); };
  for (int64_t i = 0; i < len; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) step(s, s * len + i);
  }
  for (int64_t p = S * len; p < pairs; ++p) step(0, p);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 3; ++j) {
      __m512 v = acc[0][r][j];
#pragma GCC unroll 4
      for (int s = 1; s < S; ++s) v = _mm512_add_ps(v, acc[s][r][j]);
      _mm512_storeu_ps(c + r * ldc + 16 * j, v);
    }
}

// Two whole panels side by side, one stream each (c0/c1 overwritten). Each stream then runs on
// through the next panels of its half of the unit (panels are adjacent in memory), so both are
// long sequential runs: the half-panel split above restarts its two streams at every panel.
template <int MR>
static void pair_tile(int64_t kc, const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1, float* c0, float* c1, int64_t ldc) {
  __m512 acc[2][MR][3];
#pragma GCC unroll 16
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 3; ++j) acc[s][r][j] = _mm512_setzero_ps();
  const int64_t near = g_decode_pf.get() * 2 * kNR, far = far_prefetch_pairs() * 2 * kNR;  // elements ahead
  for (int64_t p = 0; p < kc / 2; ++p) {
    if (near | far) {
      prefetch_pair_row(b0 + p * 2 * kNR, near, far);
      prefetch_pair_row(b1 + p * 2 * kNR, near, far);
    }
    pair_step<MR>(acc[0], a, lda, p, b0 + p * 2 * kNR);
    pair_step<MR>(acc[1], a, lda, p, b1 + p * 2 * kNR);
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 3; ++j) {
      _mm512_storeu_ps(c0 + r * ldc + 16 * j, acc[0][r][j]);
      _mm512_storeu_ps(c1 + r * ldc + 16 * j, acc[1][r][j]);
    }
}

// Two streams: at M = 1 +12-19% over kernel_avx512_bf16 (one stream, software prefetch), at M = 2
// +6-12% (three or four streams: no better); at M = 3-4 no gain was measured (+3% at M = 3, none at
// M = 4; also not as two passes of <= 2 rows), so those stay on the 8x48 kernel.
void kernel_decode_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  const auto* A = static_cast<const uint16_t*>(a);
  const auto* B = static_cast<const uint16_t*>(b);
  if (mr == 1) decode_tile<1, 2>(kc, A, lda, B, c, ldc, load_c);
  else if (mr == 2) decode_tile<2, 2>(kc, A, lda, B, c, ldc, load_c);
  else kernel_avx512_bf16(mr, kc, a, lda, b, c, ldc, load_c);
}

// A unit's n whole panels (memory order) for mr <= kDecodeRows rows: panel i runs beside panel
// i + n/2, two long streams per thread (qwen3 T1 bytes, kernel alone: 56.7 GB/s at M = 1 vs 45.7
// for the half-panel split and 46.4 for the 8x48 kernel in the same hold; M = 2 50.2 vs 41.5 /
// 44.2; M = 3 46.0 vs 43.1 (8x48); M = 4 41.4 vs 43.6: four rows stay on the 8x48 kernel).
// An odd last panel takes the half-panel split.
void kernel_decode_panels_bf16(int mr, int64_t kc, const void* a, int64_t lda, const char* const* panels, float* const* tiles, int n, int64_t ldc) {
  const auto* A = static_cast<const uint16_t*>(a);
  const int h = n / 2;
  for (int i = 0; i < h; ++i) {
    const auto *b0 = reinterpret_cast<const uint16_t*>(panels[i]), *b1 = reinterpret_cast<const uint16_t*>(panels[i + h]);
    if (mr == 1) pair_tile<1>(kc, A, lda, b0, b1, tiles[i], tiles[i + h], ldc);
    else if (mr == 2) pair_tile<2>(kc, A, lda, b0, b1, tiles[i], tiles[i + h], ldc);
    else if (mr == 3) pair_tile<3>(kc, A, lda, b0, b1, tiles[i], tiles[i + h], ldc);
    else {
      kernel_avx512_bf16(mr, kc, a, lda, b0, tiles[i], ldc, false);
      kernel_avx512_bf16(mr, kc, a, lda, b1, tiles[i + h], ldc, false);
    }
  }
  if (n % 2) kernel_decode_bf16(mr, kc, a, lda, panels[n - 1], tiles[n - 1], ldc, false);
}

}  // namespace ot::gemm::detail
