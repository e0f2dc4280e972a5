// TN micro-kernel for weight gradients: C[MR][64] (=|+=) A^T[MR][Kp] x B panel, vdpbf16ps, with the
// accumulators written straight to C from registers (no L1 tile and no second pass over it). The
// gradient's stores then sit in the instruction stream between the dot products of the next
// calls, so the streaming writes drain while the kernel runs instead of after it.
// 64 columns = four fp32 lines or two bf16 lines per row: whole lines for any C dtype.
#include <immintrin.h>

#include <cstring>

#include "src/core/cvt_avx512.h"
#include "src/gemm/tn_form.h"

namespace ot::gemm::detail {

namespace {

// The widest path: whole 64-column row segments, C 64-byte aligned, written once (streaming).
template <int MR, bool BF>
inline void stream_rows(const __m512 (&s)[MR][4], char* c, int64_t ldc_bytes) {
  for (int r = 0; r < MR; ++r) {
    char* d = c + r * ldc_bytes;
    if (BF) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d),
                          _mm512_inserti64x4(_mm512_castsi256_si512(simd::f32_to_bf16x16(s[r][0])), simd::f32_to_bf16x16(s[r][1]), 1));
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64),
                          _mm512_inserti64x4(_mm512_castsi256_si512(simd::f32_to_bf16x16(s[r][2])), simd::f32_to_bf16x16(s[r][3]), 1));
    } else {
      for (int j = 0; j < 4; ++j) _mm512_stream_ps(reinterpret_cast<float*>(d) + 16 * j, s[r][j]);
    }
  }
}

// Everything else: partial panels, accumulation (c + sum, rounded once for bf16), unaligned C.
template <int MR>
inline void store_rows(const __m512 (&s)[MR][4], char* c, bool bf, int64_t ldc_bytes, int width, bool acc) {
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4 && 16 * j < width; ++j) {
      const int n = width - 16 * j;
      const __mmask16 mk = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
      __m512 v = s[r][j];
      if (bf) {
        uint16_t* d = reinterpret_cast<uint16_t*>(c + r * ldc_bytes) + 16 * j;
        if (acc) v = _mm512_add_ps(v, simd::bf16x16_to_f32(_mm256_maskz_loadu_epi16(mk, d)));
        _mm256_mask_storeu_epi16(d, mk, simd::f32_to_bf16x16(v));
      } else {
        float* d = reinterpret_cast<float*>(c + r * ldc_bytes) + 16 * j;
        if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, d));
        _mm512_mask_storeu_ps(d, mk, v);
      }
    }
}

template <int MR>
void tile(int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, char* c, bool bf, int64_t ldc_bytes, int width, bool acc) {
  __m512 s[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < Kp; k += 2) {
    const uint16_t* bk = b + k * kTnNR;  // pair k/2: 64 columns x 2
    const __m512bh b0 = (__m512bh)_mm512_load_si512(bk), b1 = (__m512bh)_mm512_load_si512(bk + 32);
    const __m512bh b2 = (__m512bh)_mm512_load_si512(bk + 64), b3 = (__m512bh)_mm512_load_si512(bk + 96);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + k, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      s[r][0] = _mm512_dpbf16_ps(s[r][0], av, b0);
      s[r][1] = _mm512_dpbf16_ps(s[r][1], av, b1);
      s[r][2] = _mm512_dpbf16_ps(s[r][2], av, b2);
      s[r][3] = _mm512_dpbf16_ps(s[r][3], av, b3);
    }
  }
  const bool whole = !acc && width == kTnNR && (reinterpret_cast<uintptr_t>(c) & 63) == 0 && (ldc_bytes & 63) == 0;
  if (whole && bf) stream_rows<MR, true>(s, c, ldc_bytes);
  else if (whole) stream_rows<MR, false>(s, c, ldc_bytes);
  else store_rows<MR>(s, c, bf, ldc_bytes, width, acc);
}

}  // namespace

void tn_kernel_bf16_avx512bf16(int rows, int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, void* c, DType c_dtype, int64_t ldc,
                               int width, bool accumulate) {
  const bool bf = c_dtype == DType::bf16;
  char* cp = static_cast<char*>(c);
  const int64_t ldb = ldc * (bf ? 2 : 4);
  switch (rows) {
    case 1: tile<1>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
    case 2: tile<2>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
    case 3: tile<3>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
    case 4: tile<4>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
    case 5: tile<5>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
    default: tile<kTnMR>(Kp, a, lda, b, cp, bf, ldb, width, accumulate); break;
  }
}

}  // namespace ot::gemm::detail
