// AVX-512 BF16 dot kernel of the swapped NT form's row tail (see nt_swapped.h): the last
// M % 16 rows of a job (when few) as dot products along K, A rows and W rows both read in place
// (a zmm is 16 k-pairs of one row), so no lane is wasted on rows the job does not have. The
// partial sums of a (A rows x W rows) block stay in registers over the whole K (both segments)
// and are reduced once, straight into C (no transposed store for these rows).
#include <immintrin.h>

#include <algorithm>

#include "src/gemm/nt_swapped.h"

namespace ot::gemm::detail {

namespace {

// W rows per block for NA A rows: NA * NB <= 24 accumulators, NA + NB loads per NA * NB dot products.
constexpr int dot_nb(int na) { return na == 1 ? 16 : na == 2 ? 12 : na == 3 ? 8 : 6; }

template <int NA, int NB>
void block(const NtDotSeg* seg, int nseg, int r0, int i0, float* c, int64_t ldc, bool acc_c) {
  __m512 acc[NA][NB];
#pragma GCC unroll 4
  for (int i = 0; i < NA; ++i)
#pragma GCC unroll 16
    for (int r = 0; r < NB; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int sg = 0; sg < nseg; ++sg) {  // the K segments sum into the same accumulators
    const uint16_t* w = seg[sg].w + r0 * seg[sg].ldw;
    const int64_t ldw = seg[sg].ldw, K = 2 * seg[sg].P;
    const uint16_t* a[NA];
#pragma GCC unroll 4
    for (int i = 0; i < NA; ++i) a[i] = seg[sg].a[i0 + i];
    auto step = [&](int64_t k, __mmask32 m) {
      __m512bh av[NA];
#pragma GCC unroll 4
      for (int i = 0; i < NA; ++i) av[i] = (__m512bh)_mm512_maskz_loadu_epi16(m, a[i] + k);
#pragma GCC unroll 16
      for (int r = 0; r < NB; ++r) {
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * ldw + k);
#pragma GCC unroll 4
        for (int i = 0; i < NA; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], av[i], wv);
      }
    };
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) step(k, ~__mmask32(0));
    if (k < K) step(k, __mmask32((1u << (K - k)) - 1));  // K - k < 32 (even): zeros past the row
  }
#pragma GCC unroll 4
  for (int i = 0; i < NA; ++i)
#pragma GCC unroll 16
    for (int r = 0; r < NB; ++r) {
      float& d = c[(i0 + i) * ldc + r0 + r];
      const float v = _mm512_reduce_add_ps(acc[i][r]);
      d = acc_c ? d + v : v;
    }
}

// A block of NA A rows against nb (<= dot_nb(NA)) W rows.
template <int NA, int NB = dot_nb(NA)>
void dispatch_nb(int nb, const NtDotSeg* seg, int nseg, int r0, int i0, float* c, int64_t ldc, bool acc_c) {
  if constexpr (NB > 1)
    if (nb < NB) return dispatch_nb<NA, NB - 1>(nb, seg, nseg, r0, i0, c, ldc, acc_c);
  block<NA, NB>(seg, nseg, r0, i0, c, ldc, acc_c);
}

template <int NA>
void rows_of(int mr, const NtDotSeg* seg, int nseg, int i0, float* c, int64_t ldc, bool acc_c) {
  constexpr int NB = dot_nb(NA);
  for (int r = 0; r < mr; r += NB) dispatch_nb<NA>(std::min(NB, mr - r), seg, nseg, r, i0, c, ldc, acc_c);
}

}  // namespace

void kernel_nt_dot_bf16_avx512bf16(int mr, int na, const NtDotSeg* seg, int nseg, float* c, int64_t ldc, bool accumulate) {
  // groups of <= 4 A rows, as even as possible (7 = 4 + 3, 6 = 3 + 3): W is read once per group
  const int groups = (na + 3) / 4;
  for (int g = 0, i = 0; g < groups; ++g) {
    const int n = (na - i + (groups - g) - 1) / (groups - g);
    switch (n) {
      case 1: rows_of<1>(mr, seg, nseg, i, c, ldc, accumulate); break;
      case 2: rows_of<2>(mr, seg, nseg, i, c, ldc, accumulate); break;
      case 3: rows_of<3>(mr, seg, nseg, i, c, ldc, accumulate); break;
      default: rows_of<4>(mr, seg, nseg, i, c, ldc, accumulate); break;
    }
    i += n;
  }
}

}  // namespace ot::gemm::detail
