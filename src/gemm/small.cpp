#include "src/gemm/small.h"

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {
// Past these the packed path's K blocking wins, and so do its threads where it has more than one
// (outside a parallel region).
constexpr int64_t kMaxDim = 512;
constexpr double kMaxSerialFlops = 1 << 22;
}  // namespace

bool small_f32_takes(const MatView& a, const MatView& b, const MutMatView& c) {
  if (!cpu::has(cpu::Isa::avx2)) return false;
  if (a.dtype != DType::f32 || b.dtype != DType::f32 || c.dtype != DType::f32 || c.cs != 1) return false;
  if (b.cs != 1 && b.rs != 1) return false;
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (M > kMaxDim || N > kMaxDim || K > kMaxDim) return false;
  return in_parallel_region() || num_threads() == 1 || 2.0 * double(M) * double(N) * double(K) <= kMaxSerialFlops;
}

void small_f32(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  SmallF32 p;
  p.M = a.rows, p.N = b.cols, p.K = a.cols;
  p.a = static_cast<const float*>(a.data), p.ars = a.rs, p.acs = a.cs;
  p.c = static_cast<float*>(c.data), p.ldc = c.rs;
  p.e.alpha = alpha, p.e.beta = beta;
  const bool avx512 = cpu::has(cpu::Isa::avx512);
  if (b.cs == 1) {
    p.b = static_cast<const float*>(b.data), p.ldb = b.rs;
  } else {  // B = X^T with X's rows contiguous: one transpose into this thread's scratch
    thread_local Buf scratch;
    float* t = reinterpret_cast<float*>(scratch.get(sizeof(float) * size_t(p.K * p.N)));
    const float* x = static_cast<const float*>(b.data);
    if (avx512) {
      transpose32_avx512(x, b.cs, p.N, p.K, t, p.N);
    } else {
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t k = 0; k < p.K; ++k) t[k * p.N + n] = x[n * b.cs + k];
    }
    p.b = t, p.ldb = p.N;
  }
  if (avx512) small_f32_avx512(p);
  else small_f32_avx2(p);
}

}  // namespace ot::gemm::detail

namespace ot::gemm {

void matmul_bf16_operands(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  const char* op = "matmul_bf16_operands";
  OT_CHECK(a.dtype == DType::f32 && b.dtype == DType::f32 && c.dtype == DType::f32, op, "dtype", "fp32 a, b and c",
           dtype_name(a.dtype == DType::f32 ? (b.dtype == DType::f32 ? c.dtype : b.dtype) : a.dtype));
  OT_CHECK(a.cols == b.rows, op, "b", "rows == a.cols = " + std::to_string(a.cols), b.rows);
  OT_CHECK(c.rows == a.rows && c.cols == b.cols && c.cs == 1, op, "c",
           "[" + std::to_string(a.rows) + ", " + std::to_string(b.cols) + "] with unit column stride",
           "[" + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "]");
  OT_CHECK((a.cs == 1 || a.rs == 1) && (b.cs == 1 || b.rs == 1), op, "a, b", "rows or columns contiguous", "other strides");
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  OT_CHECK(M >= 0 && N >= 0 && K >= 0 && M <= 512 && N <= 512 && K <= 512, op, "shape", "0..512 a side",
           std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K));
  if (M == 0 || N == 0) return;
  if (!cpu::force_ref() && cpu::has(cpu::Isa::avx512_bf16) && detail::bf16_dot_preferred()) {
    detail::small_bf16_avx512bf16(a, b, c, alpha, beta);
    return;
  }
  // Elsewhere: the rounded operands as fp32 copies, then the fp32 product.
  thread_local detail::Buf abuf, bbuf;
  float* ar = reinterpret_cast<float*>(abuf.get(sizeof(float) * size_t(M * K + 1)));
  float* br = reinterpret_cast<float*>(bbuf.get(sizeof(float) * size_t(K * N + 1)));
  const float *ad = static_cast<const float*>(a.data), *bd = static_cast<const float*>(b.data);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) ar[i * K + k] = bf16_to_f32(f32_to_bf16(ad[i * a.rs + k * a.cs]));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) br[k * N + j] = bf16_to_f32(f32_to_bf16(bd[k * b.rs + j * b.cs]));
  matmul(MatView{ar, DType::f32, M, K, K, 1}, MatView{br, DType::f32, K, N, N, 1}, c, alpha, beta);
}

}  // namespace ot::gemm
