// TN micro-kernel for weight gradients: C[MR][64] (=|+=) A^T[MR][Kp] x B panel, vdpbf16ps, with the
// accumulators written straight to C from registers (no L1 tile, no second pass, no spill: the
// store mode is a template parameter, so the epilogue is straight-line code on the 24 registers).
// With K = an expert's rows (~32) a tile gets only ~16 k-steps, so its epilogue is a large part of
// the work: bf16 C is converted with vcvtne2ps2bf16 (one instruction per 32 values, round to
// nearest even; the instruction flushes bf16-denormal results -- |v| < 1.2e-38 -- to zero, which
// is harmless for weight gradients: an optimizer step on such a value is 0 anyway).
// 64 columns = four fp32 lines or two bf16 lines per row: whole lines for any C dtype.
// Where vdpbf16ps has half the FMAs' flop rate (Intel without AMX: gemm.bf16_kernel's measured
// choice), the same tile widens each B vector to fp32 (k even = word << 16, k odd = word &
// 0xffff0000, exact) and multiplies on fp32 FMAs with A^T rows widened once per row block:
// 2 widening ops per 12 FMAs.
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "ot/numeric.h"
#include "src/core/cvt_avx512.h"
#include "src/gemm/tn_form.h"

namespace ot::gemm::detail {

namespace {

enum class Store { f32_stream, bf16_stream, masked };

// The hardware conversion here too (not simd::f32_to_bf16x16), so every tile rounds and flushes alike.
inline __m256i cvt_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// Rows [0, MR) x 64 columns of C from the accumulators s.
//   f32_stream / bf16_stream: whole 64-column segments, C 64-byte aligned, written once (streaming;
//   bf16: two lines per row, each one vcvtne2ps2bf16 of two accumulators).
//   masked: partial panels, accumulation (c + sum, rounded once for bf16), unaligned C.
template <int MR, Store S>
inline void store(const __m512 (&s)[MR][4], char* c, bool bf, int64_t ldc_bytes, int width, bool acc) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    char* d = c + r * ldc_bytes;
    if constexpr (S == Store::bf16_stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d), (__m512i)_mm512_cvtne2ps_pbh(s[r][1], s[r][0]));
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64), (__m512i)_mm512_cvtne2ps_pbh(s[r][3], s[r][2]));
    } else if constexpr (S == Store::f32_stream) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_stream_ps(reinterpret_cast<float*>(d) + 16 * j, s[r][j]);
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int n = width - 16 * j;
        if (n <= 0) break;
        const __mmask16 mk = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
        __m512 v = s[r][j];
        if (bf) {
          uint16_t* p = reinterpret_cast<uint16_t*>(d) + 16 * j;
          if (acc) v = _mm512_add_ps(v, simd::bf16x16_to_f32(_mm256_maskz_loadu_epi16(mk, p)));
          _mm256_mask_storeu_epi16(p, mk, cvt_bf16(v));
        } else {
          float* p = reinterpret_cast<float*>(d) + 16 * j;
          if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, p));
          _mm512_mask_storeu_ps(p, mk, v);
        }
      }
    }
  }
}

// Widen: a holds the A^T rows as fp32 (row stride lda floats) and the products run on fp32 FMAs,
// each B vector widened in registers; else a is bf16 (pairs adjacent) for vdpbf16ps.
template <int MR, Store S, bool Widen>
inline void tile(int64_t Kp, const void* a, int64_t lda, const uint16_t* b, char* c, bool bf, int64_t ldc_bytes, int width, bool acc) {
  __m512 s[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < Kp; k += 2) {
    const uint16_t* bk = b + k * kTnNR;  // pair k/2: 64 columns x 2
    if constexpr (Widen) {
      const float* af = static_cast<const float*>(a);
      const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // one B vector at a time: 24 accumulators + 3 live vectors fit the registers
        const __m512i v = _mm512_load_si512(bk + 32 * j);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), odd = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) s[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(af[r * lda + k]), even, s[r][j]);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) s[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(af[r * lda + k + 1]), odd, s[r][j]);
      }
    } else {
      const uint16_t* ab = static_cast<const uint16_t*>(a);
      const __m512bh b0 = (__m512bh)_mm512_load_si512(bk), b1 = (__m512bh)_mm512_load_si512(bk + 32);
      const __m512bh b2 = (__m512bh)_mm512_load_si512(bk + 64), b3 = (__m512bh)_mm512_load_si512(bk + 96);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        int32_t pair;
        std::memcpy(&pair, ab + r * lda + k, 4);
        const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
        s[r][0] = _mm512_dpbf16_ps(s[r][0], av, b0);
        s[r][1] = _mm512_dpbf16_ps(s[r][1], av, b1);
        s[r][2] = _mm512_dpbf16_ps(s[r][2], av, b2);
        s[r][3] = _mm512_dpbf16_ps(s[r][3], av, b3);
      }
    }
  }
  store<MR, S>(s, c, bf, ldc_bytes, width, acc);
}

// A^T rows [0, MR) (bf16, Kp each, stride lda) widened to fp32 rows of stride Kp in a per-thread
// buffer, once per row block (the tiles of all its panels read them).
template <int MR>
const float* widen_rows(const uint16_t* a, int64_t lda, int64_t Kp) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(MR * Kp)) buf.resize(size_t(MR * Kp));
  for (int r = 0; r < MR; ++r) convert_to_f32(a + r * lda, DType::bf16, buf.data() + r * Kp, Kp);
  return buf.data();
}

// One block of MR rows along panels [0, np) of B (panel p at b + p * pel, C columns p * 64..).
template <int MR>
void rows(int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, size_t pel, int64_t np, char* c, bool bf, int64_t ldc_bytes, int64_t N,
          bool acc, bool widen) {
  const size_t celt = bf ? 2 : 4;
  // Whole lines: C and its row stride 64-byte aligned (then every full panel's segment is too).
  const bool aligned = !acc && (reinterpret_cast<uintptr_t>(c) & 63) == 0 && (ldc_bytes & 63) == 0;
  const float* af = widen ? widen_rows<MR>(a, lda, Kp) : nullptr;
  for (int64_t p = 0; p < np; ++p) {
    const int width = int(N - p * kTnNR < kTnNR ? N - p * kTnNR : kTnNR);
    const uint16_t* bp = b + size_t(p) * pel;
    char* cp = c + size_t(p * kTnNR) * celt;
    auto run = [&](auto store_mode) {
      constexpr Store S = decltype(store_mode)::value;
      if (af) tile<MR, S, true>(Kp, af, Kp, bp, cp, bf, ldc_bytes, width, acc);
      else tile<MR, S, false>(Kp, a, lda, bp, cp, bf, ldc_bytes, width, acc);
    };
    if (aligned && width == kTnNR) {
      if (bf) run(std::integral_constant<Store, Store::bf16_stream>());
      else run(std::integral_constant<Store, Store::f32_stream>());
    } else {
      run(std::integral_constant<Store, Store::masked>());
    }
  }
}

}  // namespace

void tn_rows_bf16_avx512bf16(int nrows, int64_t Kp, const uint16_t* a, int64_t lda, const uint16_t* b, size_t panel_elems, int64_t np, void* c,
                             DType c_dtype, int64_t ldc, int64_t N, bool accumulate, bool widen) {
  const bool bf = c_dtype == DType::bf16;
  char* cp = static_cast<char*>(c);
  const int64_t ldb = ldc * (bf ? 2 : 4);
  switch (nrows) {
    case 1: rows<1>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
    case 2: rows<2>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
    case 3: rows<3>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
    case 4: rows<4>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
    case 5: rows<5>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
    default: rows<kTnMR>(Kp, a, lda, b, panel_elems, np, cp, bf, ldb, N, accumulate, widen); break;
  }
}

}  // namespace ot::gemm::detail
