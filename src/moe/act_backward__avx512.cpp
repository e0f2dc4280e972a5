// AVX-512 SwiGLU passes of the MoE training path (16 lanes, fp32 math, bf16/fp32 storage): the
// forward's a = silu(g) u with the stored pre-activation, and the backward's one pass from the
// down projection's input gradient to dz, the routed weight's gradient and the scaled a.
#include "src/core/cvt_avx512.h"
#include "src/core/elem_at.h"
#include "src/gemm/vec_math_avx512.h"
#include "src/moe/bwd_common.h"

namespace ot::moe::bwd {

namespace {

inline __mmask16 tail(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

inline __m512 load(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::bf16)
    return simd::bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

// v rounded through dtype t (what storing and reloading it gives).
inline __m512 round_to(__m512 v, DType t) {
  if (t != DType::bf16) return v;
  return simd::bf16x16_to_f32(simd::f32_to_bf16x16(v));
}
inline void store(void* p, DType t, int64_t i, __mmask16 m, __m512 v) {
  if (t == DType::bf16) _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, simd::f32_to_bf16x16(v));
  else _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
}
inline __m512 sigmoid(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, gemm::vm::exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

}  // namespace

void swiglu_forward_rows_avx512(const SwigluFwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  const DType zr = p.zo ? p.zot : p.zt;  // a is computed from z as stored
  for (int64_t m = m0; m < m1; ++m) {
    const char* z = row_at(p.z, p.zt, p.ldz, m);
    char* zo = p.zo ? row_at(p.zo, p.zot, p.ldzo, m) : nullptr;
    char* a = row_at(p.a, p.at, p.lda, m);
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 k = tail(N - j);
      __m512 g = round_to(load(z, p.zt, j, k), zr), u = round_to(load(z, p.zt, j + N, k), zr);
      if (zo) {
        store(zo, p.zot, j, k, g);
        store(zo, p.zot, j + N, k, u);
      }
      store(a, p.at, j, k, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid(g)), u));
    }
  }
}

void swiglu_backward_rows_avx512(const SwigluBwd& p, int64_t m0, int64_t m1) {
  const int64_t N = p.N;
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t m = m0; m < m1; ++m) {
    const char* z = row_at(p.z, p.zt, p.ldz, m);
    const char* dy = row_at(p.dy, p.dyt, p.lddy, m);
    char* dz = row_at(p.dz, p.dzt, p.lddz, m);
    char* aw = p.aw ? row_at(p.aw, p.zt, p.ldaw, m) : nullptr;
    const __m512 s = _mm512_set1_ps(p.scale ? p.scale[m] : 1.f);
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 k = tail(N - j);
      const __m512 g = load(z, p.zt, j, k), u = load(z, p.zt, j + N, k), d = load(dy, p.dyt, j, k);
      const __m512 sg = sigmoid(g), silu = _mm512_mul_ps(g, sg);
      const __m512 a = round_to(_mm512_mul_ps(silu, u), p.zt);  // as the forward stored it
      if (p.dot) dot = _mm512_fmadd_ps(d, a, dot);
      if (aw) store(aw, p.zt, j, k, _mm512_mul_ps(a, s));
      const __m512 ds = _mm512_mul_ps(d, s);
      // d gate = ds u s' (1 + g (1 - s')),  d up = ds silu(g)
      const __m512 dsil = _mm512_mul_ps(sg, _mm512_fmadd_ps(g, _mm512_sub_ps(one, sg), one));
      store(dz, p.dzt, j, k, _mm512_mul_ps(_mm512_mul_ps(ds, u), dsil));
      store(dz, p.dzt, j + N, k, _mm512_mul_ps(ds, silu));
    }
    if (p.dot) p.dot[m] = _mm512_reduce_add_ps(dot);
  }
}

}  // namespace ot::moe::bwd
