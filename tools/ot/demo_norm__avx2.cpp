// AVX2 form of the demo's RMSNorm rows (demo_norm.h): one pass to sum squares in 8 lanes, one to
// scale, both straight from the row's dtype (bf16/fp16/fp32) through the shared conversions.
#include <cmath>

#include "demo_norm.h"
#include "src/core/cvt_avx2.h"

namespace ot::demo::norm {

namespace {
const char* row_at(const TensorView& v, int64_t t) { return static_cast<const char*>(v.data) + size_t(t * v.stride(0)) * dtype_size(v.dtype); }
}  // namespace

void rms_rows_avx2(const TensorView& x, const float* w, float eps, const TensorView& out, int64_t t0, int64_t t1) {
  const int64_t H = x.size(1);
  for (int64_t t = t0; t < t1; ++t) {
    const void* xr = row_at(x, t);
    void* yr = const_cast<char*>(row_at(out, t));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < H; i += 8) {
      const __m256 v = simd::load_n(xr, x.dtype, i, H - i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    const float ss = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    const __m256 s = _mm256_set1_ps(1.f / std::sqrt(ss / float(H) + eps));
    for (int64_t i = 0; i < H; i += 8) {
      const int64_t n = H - i;
      const __m256 wv = n >= 8 ? _mm256_loadu_ps(w + i) : _mm256_maskload_ps(w + i, simd::first_lanes(n));
      simd::store_n(yr, out.dtype, i, n, _mm256_mul_ps(_mm256_mul_ps(simd::load_n(xr, x.dtype, i, n), s), wv));
    }
  }
}

}  // namespace ot::demo::norm
