// AVX-512 bf16 micro-kernel that widens the vnni panel to fp32 in registers and multiplies with fp32
// FMAs: for CPUs whose vdpbf16ps is slower per flop than two FMA pipes (Intel Cooper Lake to
// Emerald Rapids issue one vdpbf16ps zmm every 2 cycles: 32 flops a cycle against the FMAs' 64;
// measured by bf16_dot_preferred) and for AVX-512 CPUs without BF16. A zmm of a panel's pair row
// holds 16 columns x (k, k+1) as 32-bit lanes; a bf16 is the high half of its fp32, so k even =
// lane << 16 and k odd = lane & 0xffff0000 (exact). Per k pair of an 8-row tile: 3 B loads, 6
// widening ops and 48 FMAs whose A operand is a broadcast from the fp32 A rows (a load, no ALU op).
// The even half's FMAs run before the odd half is widened: 24 accumulators + 3 loaded + 3 widened
// vectors + the mask fit the 32 zmm registers. In L1, an 8-row tile runs at ~86% of one core's FMA
// peak (~152 of 179 GFLOP/s; vdpbf16ps: 88, its own peak 89). Loading the even half with a masked
// 16-bit load 2 bytes early (no ALU op), or addressing A from two row pointers (no stack reloads),
// measured the same. In a layer (Qwen3 T512: ~32 rows an expert, 4 row tiles per K chunk) the
// first tile of a chunk used to wait on the weight stream, one core's ~16 GB/s, while the other
// three ran from cache: with the driver's spread form (each tile prefetches a share of the next
// chunk into L2) moe_ffn qwen3 T512 is 9-10% faster (b/a 0.903-0.908, 20 pairs; T0 hint 0.92-0.94;
// e64 / mixtral T512 and the M256 GEMM 0.97).
// Only fp32-A entries: every caller packs A as fp32 for a kernel that has them (Kernel::fn_f32a), so
// A is widened once per row block, not by every tile call.
#include <immintrin.h>

#include "src/gemm/internal.h"
#include "src/gemm/tile_io_avx512.h"

namespace ot::gemm::detail {

namespace {

constexpr int64_t kPf = 32;  // k pairs ahead (6 KiB of panel) into L1, as the vdpbf16ps kernel

// C[MR][16*NZ] (+)= A[MR][kc] (fp32, row stride lda) x the NZ zmm columns of B starting at b (a
// pair row is 2*kNR elements); c at the first of those columns.
// pf: when set, prefetch pf_lines lines from pf (into L2), spread over the k loop, instead of the
// panel kPf pairs ahead (and far_prefetch_pairs() ahead into L2 when kc is longer: a single-tile
// row block streams whole panels from DRAM; moe_ffn mixtral T16 b/a 0.95 on the Intel Emerald Rapids VM, 2026-12-02).
template <int MR, int NZ>
void tile_widen(int64_t kc, const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c, const char* pf = nullptr,
                int64_t pf_lines = 0) {
  const int64_t pairs = (kc + 1) / 2, per_pair = pf && pairs > 0 ? (pf_lines + pairs - 1) / pairs : 0;
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  // Far L2 prefetch (elements ahead) only over a stream longer than its distance: whole panels, not
  // the K chunks that several row tiles reuse from L1/L2.
  const int64_t far_pairs = pf ? 0 : far_prefetch_pairs(), far = pairs > far_pairs ? far_pairs * 2 * kNR : 0;
  __m512 acc[MR][NZ];
  load_acc(acc, c, ldc, load_c);
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;
    __m512i v[NZ];
    if (pf) {
      for (int64_t q = 0, l = k / 2 * per_pair; q < per_pair && l < pf_lines; ++q, ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
    } else {
#pragma GCC unroll 3
      for (int j = 0; j < NZ; ++j) _mm_prefetch(reinterpret_cast<const char*>(bk + kPf * 2 * kNR + 32 * j), _MM_HINT_T0);
      if (far) {
#pragma GCC unroll 3
        for (int j = 0; j < NZ; ++j) _mm_prefetch(reinterpret_cast<const char*>(bk + far + 32 * j), _MM_HINT_T1);
      }
    }
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) v[j] = _mm512_load_si512(bk + 32 * j);
    __m512 w[NZ];
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) w[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v[j], 16));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 ae = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 3
      for (int j = 0; j < NZ; ++j) acc[r][j] = _mm512_fmadd_ps(ae, w[j], acc[r][j]);
    }
#pragma GCC unroll 3
    for (int j = 0; j < NZ; ++j) w[j] = _mm512_castsi512_ps(_mm512_and_si512(v[j], hi));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 ao = _mm512_set1_ps(a[r * lda + k + 1]);
#pragma GCC unroll 3
      for (int j = 0; j < NZ; ++j) acc[r][j] = _mm512_fmadd_ps(ao, w[j], acc[r][j]);
    }
  }
  store_acc(acc, c, ldc);
}

template <int NZ>
void tile_any_rows(int mr, int64_t kc, const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, bool load_c,
                   const char* pf = nullptr, int64_t pf_lines = 0) {
  with_mr(mr, [&](auto R) { tile_widen<decltype(R)::value, NZ>(kc, a, lda, b, c, ldc, load_c, pf, pf_lines); });
}

}  // namespace

void kernel_avx512_bf16_widen_f32a(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c) {
  tile_any_rows<3>(mr, kc, static_cast<const float*>(a), lda, static_cast<const uint16_t*>(b), c, ldc, load_c);
}

void kernel_avx512_bf16_widen_f32a_spread(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c,
                                          const char* pf, int64_t pf_lines) {
  tile_any_rows<3>(mr, kc, static_cast<const float*>(a), lda, static_cast<const uint16_t*>(b), c, ldc, load_c, pf, pf_lines);
}

void kernel_avx512_bf16_widen_f32a_cols(int mr, int j0, int nz, int64_t kc, const void* a, int64_t lda, const void* b, float* c,
                                        int64_t ldc, bool load_c) {
  const float* af = static_cast<const float*>(a);
  const uint16_t* bj = static_cast<const uint16_t*>(b) + 32 * j0;  // zmm column j0 of a pair row: 16 columns x 2
  float* cj = c + 16 * j0;
  switch (nz) {
    case 1: tile_any_rows<1>(mr, kc, af, lda, bj, cj, ldc, load_c); break;
    case 2: tile_any_rows<2>(mr, kc, af, lda, bj, cj, ldc, load_c); break;
    default: tile_any_rows<3>(mr, kc, af, lda, bj, cj, ldc, load_c); break;
  }
}

}  // namespace ot::gemm::detail
