// AVX2 epilogue: 8 columns at a time, the epilogue_avx512 forms on ymm; unit column stride only.
// AVX2 has masked loads/stores for 32-bit lanes only: fp32 tails use them, bf16/fp16 C tails go
// through an 8-element buffer.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "src/core/cvt_avx2.h"
#include "src/gemm/internal.h"
#include "src/gemm/vec_math_avx2.h"

namespace ot::gemm::detail {

namespace {

// n = 8: plain loads and stores; n < 8: only the first n elements are touched.
inline __m256 load_f32(const float* p, int n, __m256i m) { return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m); }

inline __m256 load_c(DType t, const void* p, int n, __m256i m) {
  if (t == DType::f32) return load_f32(static_cast<const float*>(p), n, m);
  uint16_t h[8] = {};
  const uint16_t* s = static_cast<const uint16_t*>(p);
  if (n < 8) std::memcpy(h, p, size_t(n) * 2), s = h;
  return simd::half8_to_f32(s, t == DType::bf16);
}

inline void store_c(DType t, void* p, int n, __m256i m, __m256 v) {
  if (t == DType::f32) {
    if (n == 8) _mm256_storeu_ps(static_cast<float*>(p), v);
    else _mm256_maskstore_ps(static_cast<float*>(p), m, v);
    return;
  }
  const __m128i h = t == DType::bf16 ? simd::f32_to_bf16x8(v) : simd::f32_to_f16x8(v);
  if (n == 8) {
    _mm_storeu_si128(static_cast<__m128i*>(p), h);
  } else {
    uint16_t buf[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buf), h);
    std::memcpy(p, buf, size_t(n) * 2);
  }
}

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
      const __m256i mk = simd::first_lanes(n);
      __m256 v = _mm256_mul_ps(alpha, load_f32(b.t + r * b.ldt + j, n, mk));
      if (e.bias) v = _mm256_add_ps(v, load_f32(e.bias + b.bcol + j, n, mk));
      if (b.u) {
        __m256 u = _mm256_mul_ps(alpha, load_f32(b.u + r * b.ldt + j, n, mk));
        if (e.bias) u = _mm256_add_ps(u, load_f32(e.bias + b.ucol + j, n, mk));
        v = _mm256_mul_ps(vm::silu(v), u);
      } else {
        v = vm::activate(e.act, v);
      }
      v = _mm256_mul_ps(v, rs);
      void* cp = crow_p + size_t(j) * es;
      if (e.beta != 0.f) v = _mm256_fmadd_ps(beta, load_c(e.c_dtype, cp, n, mk), v);
      store_c(e.c_dtype, cp, n, mk, v);
    }
  }
}

}  // namespace ot::gemm::detail
