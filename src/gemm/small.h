// The unpacked fixed-size paths for small products (GDN's per-chunk products: 64 x 64 x 128 and
// the like, one thread each), where packing B into 48-column panels on every call costs about as
// much as the product itself.
//   small_f32: matmul's path for small fp32 products: reads B's rows in place (a transposed B is
//     transposed once into per-thread scratch), broadcasts A through its strides (so A^T costs
//     nothing) and applies alpha / beta in the store.
//   small_bf16: matmul_bf16_operands' path: both operands rounded to bf16 pairs as they are
//     packed, vdpbf16ps tiles.
// The choice depends only on the shapes, dtypes, strides and the CPU (never on timing), so the
// same call gives the same bits every run.
#pragma once
#include <cstdint>

#include "ot/gemm.h"

namespace ot::gemm::detail {

// C[M][N] = alpha * A x B (+ beta * C when beta != 0); element sums run over k in order.
struct SmallF32 {
  int64_t M = 0, N = 0, K = 0;
  const float* a = nullptr;
  int64_t ars = 0, acs = 0;  // A(i, k) at a + i * ars + k * acs
  const float* b = nullptr;
  int64_t ldb = 0;           // B(k, n) at b + k * ldb + n
  float* c = nullptr;
  int64_t ldc = 0;           // C(i, n) at c + i * ldc + n
  float alpha = 1.f, beta = 0.f;
};

// True when matmul(a, b, c) takes this path on this machine.
bool small_f32_takes(const MatView& a, const MatView& b, const MutMatView& c);
// Runs it (small_f32_takes must hold).
void small_f32(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta);

// Per-ISA product (small_f32__avx512.cpp) and the transpose of a B given as X^T (X [N][K] rows).
void small_f32_avx512(const SmallF32& p);
void transpose_f32_avx512(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* dst, int64_t ldd);

// matmul_bf16_operands on AVX512-BF16 (small_bf16__avx512bf16.cpp): A and B rounded to bf16 pairs
// along K as they are packed (A words: a + i * ars + p * acs for pair p of row i; B: [ceil(K/2)][N]
// words), then vdpbf16ps R x 32 tiles. Scratch from the caller's thread.
void small_bf16_avx512bf16(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta);

}  // namespace ot::gemm::detail
