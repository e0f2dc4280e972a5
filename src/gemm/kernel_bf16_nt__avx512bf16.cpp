// AVX-512 BF16 micro-kernel of the swapped NT form (see nt_swapped.cpp): a C^T tile
// [MR][16 NZ] fp32 += W [MR rows][kc] x A^T, where the W rows are read in place (row-major
// [N][K] bf16: a k-pair is one dword, broadcast) and A^T is a vnni panel [kc/2][16 NZ][2] packed
// from the activation rows. NZ (1..4 zmm columns) follows the job's row count, MR the register
// budget (MR * NZ <= 24 accumulators).
// Widen (where vdpbf16ps has half the FMAs' flop rate: gemm.bf16_kernel's measured choice): the
// panel's vectors, two zmm columns at a time, and each W row's broadcast pair are widened to fp32
// in registers (k even = word << 16, k odd = word & 0xffff0000, exact) for fp32 FMAs: at NZ 2, 4
// widening ops a pair for the panel and 2 a row. Widening W's lines once into an L1 buffer (fp32
// broadcast loads, no per-row ops) measured slower: GCC spilled the unrolled block's state
// (qwen3 T512 NT b/a 1.14-1.16 against vdpbf16ps; this form 0.84-0.86).
#include <immintrin.h>

#include <cstring>

#include "src/gemm/nt_swapped.h"

namespace ot::gemm::detail {

namespace {

constexpr int64_t kPfB = 24;     // A^T panel: k-pairs ahead (the panel streams from L2)
constexpr int64_t kPfW = 512;    // W rows: bytes ahead (8 lines; each W line is read from memory once)

template <int MR, int NZ, bool Widen>
void tile(int64_t P, const uint16_t* w, int64_t ldw, const uint16_t* b, float* t, int64_t ldt, bool load, const uint16_t* wn, int mrn) {
  __m512 acc[MR][NZ];
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; ++z) acc[r][z] = load ? _mm512_loadu_ps(t + r * ldt + 16 * z) : _mm512_setzero_ps();
  auto step = [&](int64_t q) {
    const uint16_t* bq = b + q * 32 * NZ;
#pragma GCC unroll 4
    for (int z = 0; z < NZ; ++z) _mm_prefetch(reinterpret_cast<const char*>(bq + kPfB * 32 * NZ + 32 * z), _MM_HINT_T0);
    if constexpr (Widen) {
      const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
#pragma GCC unroll 2
      for (int z0 = 0; z0 < NZ; z0 += 2) {  // two zmm columns at a time: 24 accumulators + 4 widened vectors
        constexpr int kG = NZ < 2 ? NZ : 2;
        __m512 e[kG], o[kG];
#pragma GCC unroll 2
        for (int z = 0; z < kG; ++z) {
          const __m512i v = z0 + z < NZ ? _mm512_load_si512(bq + 32 * (z0 + z)) : _mm512_setzero_si512();
          e[z] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
          o[z] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        }
#pragma GCC unroll 24
        for (int r = 0; r < MR; ++r) {
          int32_t pair;
          std::memcpy(&pair, w + r * ldw + 2 * q, 4);
          const __m512i pv = _mm512_set1_epi32(pair);
          const __m512 ae = _mm512_castsi512_ps(_mm512_slli_epi32(pv, 16)), ao = _mm512_castsi512_ps(_mm512_and_si512(pv, hi));
#pragma GCC unroll 2
          for (int z = 0; z < kG; ++z)
            if (z0 + z < NZ) acc[r][z0 + z] = _mm512_fmadd_ps(ao, o[z], _mm512_fmadd_ps(ae, e[z], acc[r][z0 + z]));
        }
      }
    } else {
      __m512bh bv[NZ];
#pragma GCC unroll 4
      for (int z = 0; z < NZ; ++z) bv[z] = (__m512bh)_mm512_load_si512(bq + 32 * z);
#pragma GCC unroll 24
      for (int r = 0; r < MR; ++r) {
        int32_t pair;
        std::memcpy(&pair, w + r * ldw + 2 * q, 4);
        const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int z = 0; z < NZ; ++z) acc[r][z] = _mm512_dpbf16_ps(acc[r][z], av, bv[z]);
      }
    }
  };
  // The next tile's rows (wn, mrn of them) go to L2 while this tile runs, in memory order (row
  // after row: one sequential stream, whole DRAM pages; measured better than a line of each row
  // at a time for dx) at the rate this tile consumes its own rows: a 64-byte line of each row per
  // 16 pairs, so MR lines of the next tile per 16 pairs.
  const int64_t lines = (P + 15) / 16;  // per row
  const char* pf = reinterpret_cast<const char*>(wn);
  int64_t pf_line = 0;
  int pf_left = mrn;
  auto pf_next = [&] {
    if (pf_left > 0) {
      _mm_prefetch(pf + 64 * pf_line, _MM_HINT_T1);
      if (++pf_line == lines) pf_line = 0, pf += 2 * ldw, --pf_left;
    }
  };
  int64_t q = 0;
  // Blocks of 16 pairs (one 64-byte line of each W row): row s's next line is prefetched at step s.
  for (; q + 16 <= P; q += 16) {
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) {
      if (s < MR) {
        _mm_prefetch(reinterpret_cast<const char*>(w + s * ldw + 2 * q) + kPfW, _MM_HINT_T0);
        pf_next();
      }
      step(q + s);
    }
  }
  while (pf_left > 0) pf_next();  // the rows' last lines (P % 16 pairs)
  for (; q < P; ++q) step(q);
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(t + r * ldt + 16 * z, acc[r][z]);
}

template <int NZ, bool Widen, int MR = nt_mr(NZ)>
void dispatch_mr(int mr, int64_t P, const uint16_t* w, int64_t ldw, const uint16_t* b, float* t, int64_t ldt, bool load, const uint16_t* wn, int mrn) {
  if constexpr (MR > 1)
    if (mr < MR) return dispatch_mr<NZ, Widen, MR - 1>(mr, P, w, ldw, b, t, ldt, load, wn, mrn);
  tile<MR, NZ, Widen>(P, w, ldw, b, t, ldt, load, wn, mrn);
}

template <bool Widen>
void dispatch_nz(int mr, int nz, int64_t P, const uint16_t* w, int64_t ldw, const uint16_t* b, float* t, int64_t ldt, bool load,
                 const uint16_t* wn, int mrn) {
  switch (nz) {
    case 1: dispatch_mr<1, Widen>(mr, P, w, ldw, b, t, ldt, load, wn, mrn); break;
    case 2: dispatch_mr<2, Widen>(mr, P, w, ldw, b, t, ldt, load, wn, mrn); break;
    case 3: dispatch_mr<3, Widen>(mr, P, w, ldw, b, t, ldt, load, wn, mrn); break;
    default: dispatch_mr<4, Widen>(mr, P, w, ldw, b, t, ldt, load, wn, mrn); break;
  }
}

}  // namespace

void kernel_nt_bf16_avx512bf16(int mr, int nz, int64_t P, const uint16_t* w, int64_t ldw, const uint16_t* b, float* t, int64_t ldt, bool load,
                               const uint16_t* wn, int mrn, bool widen) {
  if (widen) dispatch_nz<true>(mr, nz, P, w, ldw, b, t, ldt, load, wn, mrn);
  else dispatch_nz<false>(mr, nz, P, w, ldw, b, t, ldt, load, wn, mrn);
}

}  // namespace ot::gemm::detail
