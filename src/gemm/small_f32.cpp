#include "src/gemm/small_f32.h"

#include "ot/cpu.h"
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
  if (!cpu::has(cpu::Isa::avx512)) return false;
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
  p.alpha = alpha, p.beta = beta;
  if (b.cs == 1) {
    p.b = static_cast<const float*>(b.data), p.ldb = b.rs;
  } else {  // B = X^T with X's rows contiguous: one transpose into this thread's scratch
    thread_local Buf scratch;
    float* t = reinterpret_cast<float*>(scratch.get(sizeof(float) * size_t(p.K * p.N)));
    transpose_f32_avx512(static_cast<const float*>(b.data), b.cs, p.N, p.K, t, p.N);
    p.b = t, p.ldb = p.N;
  }
  small_f32_avx512(p);
}

}  // namespace ot::gemm::detail
