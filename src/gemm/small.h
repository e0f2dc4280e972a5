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

// The tiles' epilogue and shape flags: C[i][j] = alpha * rs[i] * sum_k A[i][k] B[k][j] (+ beta *
// C[i][j] when beta != 0; rs null: 1). tri_k: A is lower triangular, so the rows of a tile
// starting at row i0 stop their sum at column i0 + 8. tri_n: only the column tiles starting at
// j0 <= i0 + 7 are needed (causal outputs; the others are left unwritten).
struct TileEpi {
  float alpha = 1.f, beta = 0.f;
  const float* rs = nullptr;
  bool tri_k = false, tri_n = false;
};

// C[M][N] = epilogue(A x B); element sums run over k in order.
struct SmallF32 {
  int64_t M = 0, N = 0, K = 0;
  const float* a = nullptr;
  int64_t ars = 0, acs = 0;  // A(i, k) at a + i * ars + k * acs
  const float* b = nullptr;
  int64_t ldb = 0;           // B(k, n) at b + k * ldb + n
  float* c = nullptr;
  int64_t ldc = 0;           // C(i, n) at c + i * ldc + n
  TileEpi e;
};

// True when matmul(a, b, c) takes this path on this machine.
bool small_f32_takes(const MatView& a, const MatView& b, const MutMatView& c);
// Runs it (small_f32_takes must hold).
void small_f32(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta);

// Per-ISA products (small_f32__avx512.cpp, small_f32__avx2.cpp), and the AVX-512 transpose of
// 32-bit elements (floats or bf16-pair words; dst[c][r] = x[r][c]) that turns a B given as X^T into rows.
void small_f32_avx512(const SmallF32& p);
void small_f32_avx2(const SmallF32& p);
void transpose32_avx512(const void* x, int64_t ldx, int64_t rows, int64_t cols, void* dst, int64_t ldd);

// Fixed-size tiles for operands a caller keeps in the micro-kernels' layouts across several products
// (the fused bf16 GDN forward's chunk products; its file is built for AVX512-BF16): m % 8 == 0,
// n % 32 == 0, k even. B words: [k/2][n], word (p, j) = bf16 pair (B[2p][j], B[2p + 1][j]).
//   tiles_f32:   fp32 A rows (lda) x fp32 B rows (ldb) on FMAs (small_f32's tiles);
//   tiles_bf16:  bf16 A rows (lda elements, even) x B words on vdpbf16ps, or, with a32 (m x k floats
//                of scratch), A widened into it and the product on tiles_widen (CPUs whose
//                vdpbf16ps is the slower, bf16_dot_preferred() false);
//   tiles_widen: fp32 A rows x B words widened to fp32 in registers (exact), FMAs.
void tiles_f32(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m,
               const TileEpi& e);
void tiles_bf16(const uint16_t* A, int64_t lda, const uint32_t* B, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m, const TileEpi& e,
                float* a32);
void tiles_widen(const float* A, int64_t lda, const uint32_t* B, int64_t n, int64_t k, float* C, int64_t ldc, int64_t m, const TileEpi& e);

// matmul_bf16_operands on AVX512-BF16 (small_bf16__avx512bf16.cpp): A and B rounded to bf16 pairs
// along K as they are packed (A words: a + i * ars + p * acs for pair p of row i; B: [ceil(K/2)][N]
// words), then vdpbf16ps R x 32 tiles. Scratch from the caller's thread.
void small_bf16_avx512bf16(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta);

}  // namespace ot::gemm::detail
