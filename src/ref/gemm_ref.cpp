// Plain reference GEMM: triple loop with fp64 accumulation, epilogue applied element by element.
#include <cmath>
#include <vector>

#include "ot/gemm.h"
#include "ot/numeric.h"
#include "src/ref/act_math.h"

namespace ot::gemm::ref {

static double load(const void* p, DType t, int64_t off) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[off];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case DType::i8: return static_cast<const int8_t*>(p)[off];
    default: return 0;
  }
}
static void store(void* p, DType t, int64_t off, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[off] = x; break;
    case DType::bf16: static_cast<uint16_t*>(p)[off] = f32_to_bf16(x); break;
    case DType::f16: static_cast<uint16_t*>(p)[off] = f32_to_f16(x); break;
    default: break;
  }
}

void gemm(int64_t M, const AOperand& a, const TensorView& b, BLayout layout, const COperand& c, const Epilogue& ep) {
  int64_t K = layout == BLayout::KN ? b.size(0) : b.size(1);
  int64_t N = layout == BLayout::KN ? b.size(1) : b.size(0);
  int64_t n_out = ep.act == Act::swiglu ? N / 2 : N;
  std::vector<double> acc(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    int64_t arow = a.rows ? a.rows[m] : m;
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        int64_t boff = layout == BLayout::KN ? k * b.stride(0) + n * b.stride(1) : n * b.stride(0) + k * b.stride(1);
        s += load(a.data, a.dtype, arow * a.ld + k) * load(b.data, b.dtype, boff);
      }
      if (a.scale) s *= a.scale[arow];  // quantised A: row arow is q * scale
      acc[size_t(n)] = s + (ep.bias ? ep.bias[n] : 0.0);
    }
    int64_t crow = ep.scatter_rows ? ep.scatter_rows[m] : m;
    for (int64_t n = 0; n < n_out; ++n) {
      double v = ep.act == Act::swiglu ? refmath::silu(acc[size_t(n)]) * acc[size_t(n + n_out)] : refmath::activate(ep.act, acc[size_t(n)]);
      if (ep.row_scale) v *= ep.row_scale[m];
      int64_t off = crow * c.ld + n;
      if (ep.accumulate) v += load(c.data, c.dtype, off);
      store(c.data, c.dtype, off, float(v));
    }
  }
}

void matmul(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.cols; ++j) {
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += load(a.data, a.dtype, i * a.rs + k * a.cs) * load(b.data, b.dtype, k * b.rs + j * b.cs);
      int64_t off = i * c.rs + j * c.cs;
      double v = alpha * s + (beta != 0.f ? beta * load(c.data, c.dtype, off) : 0.0);
      store(c.data, c.dtype, off, float(v));
    }
  }
}

}  // namespace ot::gemm::ref
