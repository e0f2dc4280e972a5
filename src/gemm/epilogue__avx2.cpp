// AVX2 epilogue: 8 columns at a time, the epilogue_avx512 forms on ymm; unit column stride only.
// Tails of fewer than 8 columns load and store through simd::load_n / store_n (cvt_avx2.h).
#include <immintrin.h>

#include <cstdint>

#include "src/core/cvt_avx2.h"
#include "src/gemm/internal.h"
#include "src/gemm/vec_math_avx2.h"

namespace ot::gemm::detail {

namespace {

// The MoE down GEMM's form: fp32 C, no bias or activation: C[row] (+)= acc * (alpha * a_scale) *
// row_scale, whole ymm columns with no per-vector dtype / activation dispatch.
void epilogue_scale_add_f32(const EpiArgs& e, const EpiBlock& b) {
  const __m256 beta = _mm256_set1_ps(e.beta);
  const bool rmw = e.beta != 0.f;
  const int full = b.width / 8 * 8;
  const __m256i tail = simd::first_lanes(b.width - full);
  for (int r = 0; r < b.rows; ++r) {
    const int64_t m = b.m0 + r;
    const __m256 alpha = _mm256_set1_ps(acc_scale(e, m)), rs = _mm256_set1_ps(e.row_scale ? e.row_scale[m] : 1.f);
    float* cp = static_cast<float*>(e.c) + (e.scatter_rows ? e.scatter_rows[m] : m) * e.ldc + b.col0;
    const float* tp = b.t + r * b.ldt;
    for (int j = 0; j < full; j += 8) {
      __m256 v = _mm256_mul_ps(_mm256_mul_ps(alpha, _mm256_loadu_ps(tp + j)), rs);
      if (rmw) v = _mm256_fmadd_ps(beta, _mm256_loadu_ps(cp + j), v);
      _mm256_storeu_ps(cp + j, v);
    }
    if (full < b.width) {
      __m256 v = _mm256_mul_ps(_mm256_mul_ps(alpha, _mm256_maskload_ps(tp + full, tail)), rs);
      if (rmw) v = _mm256_fmadd_ps(beta, _mm256_maskload_ps(cp + full, tail), v);
      _mm256_maskstore_ps(cp + full, tail, v);
    }
  }
}

}  // namespace

void epilogue_avx2(const EpiArgs& e, const EpiBlock& b) {
  if (!b.u && !e.bias && e.act == Act::none && e.c_dtype == DType::f32) { epilogue_scale_add_f32(e, b); return; }
  const size_t es = e.c_dtype == DType::f32 ? 4 : 2;
  const __m256 beta = _mm256_set1_ps(e.beta);
  for (int r = 0; r < b.rows; ++r) {
    int64_t m = b.m0 + r;
    const __m256 alpha = _mm256_set1_ps(acc_scale(e, m));
    int64_t crow = e.scatter_rows ? e.scatter_rows[m] : m;
    __m256 rs = _mm256_set1_ps(e.row_scale ? e.row_scale[m] : 1.f);
    char* crow_p = static_cast<char*>(e.c) + size_t(crow * e.ldc + b.col0) * es;
    for (int j = 0; j < b.width; j += 8) {
      const int n = b.width - j >= 8 ? 8 : b.width - j;
      __m256 v = _mm256_mul_ps(alpha, simd::load_n(b.t + r * b.ldt, DType::f32, j, n));
      if (e.bias) v = _mm256_add_ps(v, simd::load_n(e.bias + b.bcol, DType::f32, j, n));
      if (b.u) {
        __m256 u = _mm256_mul_ps(alpha, simd::load_n(b.u + r * b.ldt, DType::f32, j, n));
        if (e.bias) u = _mm256_add_ps(u, simd::load_n(e.bias + b.ucol, DType::f32, j, n));
        v = _mm256_mul_ps(vm::silu(v), u);
      } else {
        v = vm::activate(e.act, v);
      }
      v = _mm256_mul_ps(v, rs);
      if (e.beta != 0.f) v = _mm256_fmadd_ps(beta, simd::load_n(crow_p, e.c_dtype, j, n), v);
      simd::store_n(crow_p, e.c_dtype, j, n, v);
    }
  }
}

}  // namespace ot::gemm::detail
