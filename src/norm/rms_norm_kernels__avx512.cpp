// AVX-512 RMSNorm rows (rms_norm_kernels.h), one dtype per instantiation for every row of a call
// (a branch on the dtype per vector was a fifth of such loops). A row is read from memory once:
// the sum of squares in four accumulators (the FMA latency is four vectors deep), then the scaled
// row from L1; tails through masked loads and stores. add_rms_norm first writes x_sum and then
// normalises that row exactly as rms_norm would (the same bits as the two calls).
#include <immintrin.h>

#include <cmath>

#include "src/core/cvt_avx512.h"
#include "src/norm/rms_norm_kernels.h"

namespace ot::norm_detail {
namespace {

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
// n <= 16 values of dtype T at element i (the others 0).
template <DType T> __m512 load16(const void* p, int64_t i, int64_t n = 16) {
  const __mmask16 m = tail_mask(n);
  if constexpr (T == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  if constexpr (T == DType::bf16) return simd::bf16x16_to_f32(h);
  else return simd::f16x16_to_f32(h);
}
template <DType T> void store16(void* p, int64_t i, __m512 v, int64_t n = 16) {
  const __mmask16 m = tail_mask(n);
  if constexpr (T == DType::f32) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  } else {
    const __m256i h = T == DType::bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, h);
  }
}

template <DType T> float rstd_row(const void* xr, int64_t N, float eps) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= N; i += 64) {
    const __m512 v0 = load16<T>(xr, i), v1 = load16<T>(xr, i + 16), v2 = load16<T>(xr, i + 32), v3 = load16<T>(xr, i + 48);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
    a2 = _mm512_fmadd_ps(v2, v2, a2);
    a3 = _mm512_fmadd_ps(v3, v3, a3);
  }
  for (; i < N; i += 16) {
    const __m512 v = load16<T>(xr, i, N - i);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return 1.f / std::sqrt(ss / float(N) + eps);
}

template <DType T> void fwd(const Fwd& f, int64_t r0, int64_t r1) {
  const int64_t N = f.N;
  for (int64_t r = r0; r < r1; ++r) {
    const void* src = elem_at(f.x.p, T, r * f.x.st);
    if (f.x2.p) {
      const void* x2 = elem_at(f.x2.p, T, r * f.x2.st);
      void* s = elem_at(f.x_sum.p, T, r * f.x_sum.st);
      for (int64_t i = 0; i < N; i += 16) store16<T>(s, i, _mm512_add_ps(load16<T>(src, i, N - i), load16<T>(x2, i, N - i)), N - i);
      src = s;
    }
    const float rs = rstd_row<T>(src, N, f.eps);
    f.rstd[r] = rs;
    const __m512 s = _mm512_set1_ps(rs);
    void* yr = elem_at(f.y.p, T, r * f.y.st);
    for (int64_t i = 0; i < N; i += 16) {
      const __m512 wv = _mm512_maskz_loadu_ps(tail_mask(N - i), f.w + i);
      store16<T>(yr, i, _mm512_mul_ps(_mm512_mul_ps(load16<T>(src, i, N - i), s), wv), N - i);
    }
  }
}

// Two passes over the row after its rstd: xh = x rs, g = dy w, dw += dy xh and the sum of g xh;
// then dx = rs (g - xh mean) (+ extra), x and dy reloaded from L1 rather than kept in scratch.
template <DType T> void bwd(const Bwd& b, int64_t r0, int64_t r1, float* dw) {
  const int64_t N = b.N;
  for (int64_t r = r0; r < r1; ++r) {
    const void* xr = elem_at(b.x.p, T, r * b.x.st);
    const void* dyr = elem_at(b.dy.p, T, r * b.dy.st);
    const float rs = b.rstd ? b.rstd[r] : rstd_row<T>(xr, N, b.eps);
    const __m512 vrs = _mm512_set1_ps(rs);
    __m512 m0 = _mm512_setzero_ps(), m1 = m0;
    for (int64_t i = 0; i < N; i += 16) {
      const __mmask16 m = tail_mask(N - i);
      const __m512 xh = _mm512_mul_ps(load16<T>(xr, i, N - i), vrs), dy = load16<T>(dyr, i, N - i);
      _mm512_mask_storeu_ps(dw + i, m, _mm512_fmadd_ps(dy, xh, _mm512_maskz_loadu_ps(m, dw + i)));
      const __m512 g = _mm512_mul_ps(dy, _mm512_maskz_loadu_ps(m, b.w + i));
      if (i & 16) m1 = _mm512_fmadd_ps(g, xh, m1); else m0 = _mm512_fmadd_ps(g, xh, m0);
    }
    const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(m0, m1)) / float(N));
    void* dxr = elem_at(b.dx.p, T, r * b.dx.st);
    const void* er = b.extra.p ? elem_at(b.extra.p, T, r * b.extra.st) : nullptr;
    for (int64_t i = 0; i < N; i += 16) {
      const __m512 xh = _mm512_mul_ps(load16<T>(xr, i, N - i), vrs);
      const __m512 g = _mm512_mul_ps(load16<T>(dyr, i, N - i), _mm512_maskz_loadu_ps(tail_mask(N - i), b.w + i));
      __m512 d = _mm512_mul_ps(vrs, _mm512_fnmadd_ps(xh, mean, g));
      if (er) d = _mm512_add_ps(d, load16<T>(er, i, N - i));
      store16<T>(dxr, i, d, N - i);
    }
  }
}

}  // namespace

void fwd_rows_avx512(const Fwd& f, int64_t r0, int64_t r1) {
  switch (f.x.dt) {
    case DType::bf16: return fwd<DType::bf16>(f, r0, r1);
    case DType::f16: return fwd<DType::f16>(f, r0, r1);
    default: return fwd<DType::f32>(f, r0, r1);
  }
}

void bwd_rows_avx512(const Bwd& b, int64_t r0, int64_t r1, float* dw) {
  switch (b.x.dt) {
    case DType::bf16: return bwd<DType::bf16>(b, r0, r1, dw);
    case DType::f16: return bwd<DType::f16>(b, r0, r1, dw);
    default: return bwd<DType::f32>(b, r0, r1, dw);
  }
}

}  // namespace ot::norm_detail
