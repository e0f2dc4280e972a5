// AVX2 SwiGLU passes of the MoE training path (8 lanes, fp32 math, bf16/fp32 storage): the
// formulas and operation order of act_backward__avx512.cpp (same results up to the lane count of
// the dot product's partial sums). Row tails (< 8 columns) by simd::load_n / store_n.
#include "src/core/cvt_avx2.h"
#include "src/core/elem_at.h"
#include "src/gemm/vec_math_avx2.h"
#include "src/moe/bwd_common.h"

namespace ot::moe::bwd {

namespace {

// v rounded through dtype t (what storing and reloading it gives).
inline __m256 round_to(__m256 v, DType t) {
  if (t != DType::bf16) return v;
  return simd::bf16x8_to_f32(simd::f32_to_bf16x8(v));
}

inline __m256 sigmoid(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  return _mm256_div_ps(one, _mm256_add_ps(one, gemm::vm::exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

}  // namespace

void swiglu_forward_rows_avx2(const SwigluFwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  const DType zr = p.zo ? p.zot : p.zt;  // a is computed from z as stored
  for (int64_t m = m0; m < m1; ++m) {
    const char* z = row_at(p.z, p.zt, p.ldz, m);
    char* zo = p.zo ? row_at(p.zo, p.zot, p.ldzo, m) : nullptr;
    char* a = row_at(p.a, p.at, p.lda, m);
    for (int64_t j = 0; j < N; j += 8) {
      const int n = N - j < 8 ? int(N - j) : 8;
      __m256 g = round_to(simd::load_n(z, p.zt, j, n), zr), u = round_to(simd::load_n(z, p.zt, j + N, n), zr);
      if (zo) {
        simd::store_n(zo, p.zot, j, n, g);
        simd::store_n(zo, p.zot, j + N, n, u);
      }
      simd::store_n(a, p.at, j, n, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid(g)), u));
    }
  }
}

void swiglu_backward_rows_avx2(const SwigluBwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t m = m0; m < m1; ++m) {
    const char* z = row_at(p.z, p.zt, p.ldz, m);
    const char* dy = row_at(p.dy, p.dyt, p.lddy, m);
    char* dz = row_at(p.dz, p.dzt, p.lddz, m);
    char* aw = p.aw ? row_at(p.aw, p.zt, p.ldaw, m) : nullptr;
    const __m256 s = _mm256_set1_ps(p.scale ? p.scale[m] : 1.f);
    __m256 dot = _mm256_setzero_ps();
    for (int64_t j = 0; j < N; j += 8) {
      const int n = N - j < 8 ? int(N - j) : 8;
      const __m256 g = simd::load_n(z, p.zt, j, n), u = simd::load_n(z, p.zt, j + N, n), d = simd::load_n(dy, p.dyt, j, n);
      const __m256 sg = sigmoid(g), silu = _mm256_mul_ps(g, sg);
      const __m256 a = round_to(_mm256_mul_ps(silu, u), p.zt);  // as the forward stored it
      if (p.dot) dot = _mm256_fmadd_ps(d, a, dot);               // lanes past n: d = 0
      if (aw) simd::store_n(aw, p.zt, j, n, _mm256_mul_ps(a, s));
      const __m256 ds = _mm256_mul_ps(d, s);
      // d gate = ds u s' (1 + g (1 - s')),  d up = ds silu(g)
      const __m256 dsil = _mm256_mul_ps(sg, _mm256_fmadd_ps(g, _mm256_sub_ps(one, sg), one));
      simd::store_n(dz, p.dzt, j, n, _mm256_mul_ps(_mm256_mul_ps(ds, u), dsil));
      simd::store_n(dz, p.dzt, j + N, n, _mm256_mul_ps(ds, silu));
    }
    if (p.dot) p.dot[m] = hsum(dot);
  }
}

}  // namespace ot::moe::bwd
