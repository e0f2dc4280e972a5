// AVX-512 epilogue: 16 columns at a time with a mask for the tail; unit column stride only.
#include <immintrin.h>

#include "src/core/cvt_avx512.h"
#include "src/gemm/internal.h"
#include "src/gemm/vec_math_avx512.h"

namespace ot::gemm::detail {

static inline __m512 load_c(DType t, const void* p, __mmask16 m) {
  switch (t) {
    case DType::bf16: return simd::bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, p));
    case DType::f16: return simd::f16x16_to_f32(_mm256_maskz_loadu_epi16(m, p));
    default: return _mm512_maskz_loadu_ps(m, p);
  }
}
static inline void store_c(DType t, void* p, __mmask16 m, __m512 v) {
  switch (t) {
    case DType::bf16: _mm256_mask_storeu_epi16(p, m, simd::f32_to_bf16x16(v)); break;
    case DType::f16: _mm256_mask_storeu_epi16(p, m, simd::f32_to_f16x16(v)); break;
    default: _mm512_mask_storeu_ps(p, m, v); break;
  }
}

// The MoE down GEMM's form: fp32 C, no bias or activation: C[row] (+)= acc * (alpha * a_scale) *
// row_scale, full zmm columns without masks and no per-vector dtype / activation dispatch.
static void epilogue_scale_add_f32(const EpiArgs& e, const EpiBlock& b) {
  const __m512 beta = _mm512_set1_ps(e.beta);
  const bool rmw = e.beta != 0.f;
  const int full = b.width / 16 * 16;
  const __mmask16 tail = __mmask16((1u << (b.width - full)) - 1);
  for (int r = 0; r < b.rows; ++r) {
    const int64_t m = b.m0 + r;
    const __m512 alpha = _mm512_set1_ps(acc_scale(e, m)), rs = _mm512_set1_ps(e.row_scale ? e.row_scale[m] : 1.f);
    float* cp = static_cast<float*>(e.c) + (e.scatter_rows ? e.scatter_rows[m] : m) * e.ldc + b.col0;
    const float* tp = b.t + r * b.ldt;
    for (int j = 0; j < full; j += 16) {
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(alpha, _mm512_loadu_ps(tp + j)), rs);
      if (rmw) v = _mm512_fmadd_ps(beta, _mm512_loadu_ps(cp + j), v);
      _mm512_storeu_ps(cp + j, v);
    }
    if (tail) {
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(tail, tp + full)), rs);
      if (rmw) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(tail, cp + full), v);
      _mm512_mask_storeu_ps(cp + full, tail, v);
    }
  }
}

void epilogue_avx512(const EpiArgs& e, const EpiBlock& b) {
  if (!b.u && !e.bias && e.act == Act::none && e.c_dtype == DType::f32) { epilogue_scale_add_f32(e, b); return; }
  const size_t es = e.c_dtype == DType::f32 ? 4 : 2;
  const __m512 beta = _mm512_set1_ps(e.beta);
  for (int r = 0; r < b.rows; ++r) {
    int64_t m = b.m0 + r;
    const __m512 alpha = _mm512_set1_ps(acc_scale(e, m));
    int64_t crow = e.scatter_rows ? e.scatter_rows[m] : m;
    __m512 rs = _mm512_set1_ps(e.row_scale ? e.row_scale[m] : 1.f);
    char* crow_p = static_cast<char*>(e.c) + size_t(crow * e.ldc + b.col0) * es;
    for (int j = 0; j < b.width; j += 16) {
      __mmask16 mk = b.width - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (b.width - j)) - 1);
      __m512 v = _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(mk, b.t + r * b.ldt + j));
      if (e.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, e.bias + b.bcol + j));
      if (b.u) {
        __m512 u = _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(mk, b.u + r * b.ldt + j));
        if (e.bias) u = _mm512_add_ps(u, _mm512_maskz_loadu_ps(mk, e.bias + b.ucol + j));
        v = _mm512_mul_ps(vm::silu(v), u);
      } else {
        v = vm::activate(e.act, v);
      }
      v = _mm512_mul_ps(v, rs);
      void* cp = crow_p + size_t(j) * es;
      if (e.beta != 0.f) v = _mm512_fmadd_ps(beta, load_c(e.c_dtype, cp, mk), v);
      store_c(e.c_dtype, cp, mk, v);
    }
  }
}

}  // namespace ot::gemm::detail
