// Scalar epilogue (any C column stride): the reference order of operations for every fast path.
#include <cstdint>

#include "ot/numeric.h"
#include "src/gemm/epilogue_math.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

static float load_c(const EpiArgs& e, int64_t off) {
  switch (e.c_dtype) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(e.c)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(e.c)[off]);
    default: return static_cast<const float*>(e.c)[off];
  }
}
static void store_c(const EpiArgs& e, int64_t off, float x) {
  switch (e.c_dtype) {
    case DType::bf16: static_cast<uint16_t*>(e.c)[off] = f32_to_bf16(x); break;
    case DType::f16: static_cast<uint16_t*>(e.c)[off] = f32_to_f16(x); break;
    default: static_cast<float*>(e.c)[off] = x; break;
  }
}

void prefetch_c(const EpiArgs& e, int64_t m0, int rows, int64_t col0, int width) {
  const size_t es = dtype_size(e.c_dtype);
  for (int r = 0; r < rows; ++r) {
    int64_t crow = e.scatter_rows ? e.scatter_rows[m0 + r] : m0 + r;
    const char* p = static_cast<const char*>(e.c) + size_t(crow * e.ldc + col0) * es;
    uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63), end = reinterpret_cast<uintptr_t>(p + size_t(width) * es);
    for (; a < end; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
  }
}

void epilogue_scalar(const EpiArgs& e, const EpiBlock& b) {
  for (int r = 0; r < b.rows; ++r) {
    int64_t m = b.m0 + r;
    int64_t crow = e.scatter_rows ? e.scatter_rows[m] : m;
    float rs = e.row_scale ? e.row_scale[m] : 1.f, alpha = acc_scale(e, m);
    for (int j = 0; j < b.width; ++j) {
      float v = alpha * b.t[r * b.ldt + j] + (e.bias ? e.bias[b.bcol + j] : 0.f);
      if (b.u) v = silu(v) * (alpha * b.u[r * b.ldt + j] + (e.bias ? e.bias[b.ucol + j] : 0.f));
      else v = activate(e.act, v);
      v *= rs;
      int64_t off = crow * e.ldc + (b.col0 + j) * e.csc;
      if (e.beta != 0.f) v += e.beta * load_c(e, off);
      store_c(e, off, v);
    }
  }
}

}  // namespace ot::gemm::detail
