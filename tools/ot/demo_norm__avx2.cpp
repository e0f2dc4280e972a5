// AVX2 form of the demo's RMSNorm rows (demo_norm.h): one pass to sum squares in 4 x 8 lanes, one
// to scale, both straight from the row's dtype (bf16/fp16/fp32) through the shared conversions.
#include <cmath>

#include "demo_norm.h"
#include "src/core/cvt_avx2.h"

namespace ot::demo::norm {

namespace {
const char* row_at(const TensorView& v, int64_t t) { return static_cast<const char*>(v.data) + size_t(t * v.stride(0)) * dtype_size(v.dtype); }

// 8 values of dtype T at element i (T fixed per instantiation: no per-vector dtype test).
template <DType T> __m256 load8(const void* p, int64_t i) {
  if constexpr (T == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  else return simd::half8_to_f32(static_cast<const uint16_t*>(p) + i, T == DType::bf16);
}

// Four accumulators (the FMA latency is four vectors deep), whole vectors first, the tail through
// the masked load; then the scaled row, stored in out's dtype.
template <DType T> void rows(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  const int64_t H = x.size(1), Hv = H / 8 * 8;
  for (int64_t t = t0; t < t1; ++t) {
    const void* xr = row_at(x, t);
    void* yr = const_cast<char*>(row_at(out, t));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= H; i += 32) {
      const __m256 v0 = load8<T>(xr, i), v1 = load8<T>(xr, i + 8), v2 = load8<T>(xr, i + 16), v3 = load8<T>(xr, i + 24);
      a0 = _mm256_fmadd_ps(v0, v0, a0);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
      a2 = _mm256_fmadd_ps(v2, v2, a2);
      a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; i < H; i += 8) {
      const __m256 v = simd::load_n(xr, T, i, H - i);
      a0 = _mm256_fmadd_ps(v, v, a0);
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    const float ss = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    const __m256 s = _mm256_set1_ps(1.f / std::sqrt(ss / float(H) + eps));
    const DType od = out.dtype;
    for (i = 0; i < Hv; i += 8) {
      const __m256 y = _mm256_mul_ps(_mm256_mul_ps(load8<T>(xr, i), s), _mm256_loadu_ps(w + i));
      if (od == DType::bf16) _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(yr) + i), simd::f32_to_bf16x8(y));
      else simd::store_n(yr, od, i, 8, y);
    }
    if (i < H) {
      const int64_t n = H - i;
      const __m256 wv = _mm256_maskload_ps(w + i, simd::first_lanes(n));
      simd::store_n(yr, od, i, n, _mm256_mul_ps(_mm256_mul_ps(simd::load_n(xr, T, i, n), s), wv));
    }
  }
}
}  // namespace

void rms_rows_avx2(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  switch (x.dtype) {
    case DType::bf16: return rows<DType::bf16>(x, w, eps, out, t0, t1);
    case DType::f16: return rows<DType::f16>(x, w, eps, out, t0, t1);
    default: return rows<DType::f32>(x, w, eps, out, t0, t1);
  }
}

}  // namespace ot::demo::norm
