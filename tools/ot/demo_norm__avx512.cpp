// AVX-512 form of the demo's RMSNorm rows (demo_norm.h): the AVX2 rows' two passes on 16 lanes
// (half the conversions and multiplies a value; the AVX2 rows were compute-bound at ~16 GB/s a
// thread on Zen 5), tails through masked loads and stores.
#include <immintrin.h>

#include <cmath>

#include "demo_norm.h"
#include "src/core/cvt_avx512.h"

namespace ot::demo::norm {

namespace {
const char* row_at(const TensorView& v, int64_t t) { return static_cast<const char*>(v.data) + size_t(t * v.stride(0)) * dtype_size(v.dtype); }

// n <= 16 values of dtype T at element i (the others 0).
template <DType T> __m512 load16(const void* p, int64_t i, int64_t n = 16) {
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  if constexpr (T == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  if constexpr (T == DType::bf16) return simd::bf16x16_to_f32(h);
  else return simd::f16x16_to_f32(h);
}
template <DType T> void store16(void* p, int64_t i, __m512 v, int64_t n = 16) {
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  if constexpr (T == DType::f32) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  } else {
    const __m256i h = T == DType::bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, h);
  }
}

// Four accumulators (the FMA latency is four vectors deep), then the scaled row in out's dtype.
template <DType T, DType O> void rows(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  const int64_t H = x.size(1);
  for (int64_t t = t0; t < t1; ++t) {
    const void* xr = row_at(x, t);
    void* yr = const_cast<char*>(row_at(out, t));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= H; i += 64) {
      const __m512 v0 = load16<T>(xr, i), v1 = load16<T>(xr, i + 16), v2 = load16<T>(xr, i + 32), v3 = load16<T>(xr, i + 48);
      a0 = _mm512_fmadd_ps(v0, v0, a0);
      a1 = _mm512_fmadd_ps(v1, v1, a1);
      a2 = _mm512_fmadd_ps(v2, v2, a2);
      a3 = _mm512_fmadd_ps(v3, v3, a3);
    }
    for (; i < H; i += 16) {
      const __m512 v = load16<T>(xr, i, H - i);
      a0 = _mm512_fmadd_ps(v, v, a0);
    }
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    const __m512 s = _mm512_set1_ps(1.f / std::sqrt(ss / float(H) + eps));
    for (i = 0; i < H; i += 16) {
      const int64_t n = H - i;
      const __m512 wv = _mm512_maskz_loadu_ps(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), w + i);
      store16<O>(yr, i, _mm512_mul_ps(_mm512_mul_ps(load16<T>(xr, i, n), s), wv), n);
    }
  }
}

template <DType T> void rows_out(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  switch (out.dtype) {
    case DType::bf16: return rows<T, DType::bf16>(x, w, eps, out, t0, t1);
    case DType::f16: return rows<T, DType::f16>(x, w, eps, out, t0, t1);
    default: return rows<T, DType::f32>(x, w, eps, out, t0, t1);
  }
}
}  // namespace

void rms_rows_avx512(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  switch (x.dtype) {
    case DType::bf16: return rows_out<DType::bf16>(x, w, eps, out, t0, t1);
    case DType::f16: return rows_out<DType::f16>(x, w, eps, out, t0, t1);
    default: return rows_out<DType::f32>(x, w, eps, out, t0, t1);
  }
}

}  // namespace ot::demo::norm
