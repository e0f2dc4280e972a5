// Internals of the quantised grouped GEMM (ot/gemm_quant.h): the panel layout and the kernel table.
//
// An expert's weights are panels of kQNR = 32 columns (halves interleaved g0, u0, g1, u1, ... when N
// is even, as in the main engine, so a SwiGLU unit finds gate and up panels side by side). A panel
// is its K groups in order (one group of K rows when per channel), each:
//   float s[32], m[32]          scale and additive term: w = s * u + m
//   codes[len][row_bytes]       int8: 32 signed bytes (u = q, m = offset * s);
//                               int4: 16 bytes, byte b = column b (low nibble) | column b + 16
//                               (high nibble), u = q + 8 in [0, 15] (m = (offset - 8) * s)
// Columns past the edge have s = m = 0 and code 0. The single-row kernel computes, per group j,
// s * sum_k a[k] * u[k] + m * asum[j] with asum the group's sum of a: the offset never touches the
// inner loop and the codes only need a widening and an int -> float conversion. More rows take
// the row-block path below.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ot/cpu.h"
#include "ot/quant_weights.h"

namespace ot::gemm::qdetail {

inline constexpr int kQNR = 32;
inline constexpr size_t kQHeader = 2 * kQNR * sizeof(float);
inline size_t row_bytes(WeightFormat f) { return f == WeightFormat::int4 ? kQNR / 2 : kQNR; }

// c[r * 32 + j] = sum over K of a[r * lda + k] * w(k, j) for r < rows (rows <= the kernel's mr);
// asum[r * ldas + j]: the sum of row r of a over group j; panel: as above, `groups` groups of `len`.
using QKernelFn = void (*)(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups,
                           int64_t len, float* c);

// The row-block path (more than one row): a chunk of kc <= kQKC rows of one K group is turned
// into fp32 weights w = s * u + m once into an L1 block [kc][32] (per thread, reused by every row
// tile of the expert), then fp32 FMA tiles run over it.
inline constexpr int64_t kQKC = 64;
// w[k][j] for rows [k0, k0 + kc) of the group whose header starts at `group`.
using QDequantFn = void (*)(const char* group, int64_t k0, int64_t kc, float* w);
// c[r * 32 + j] += sum_k a[r * lda + k] * w[k * 32 + j] for r < rows (rows <= the tile's mr).
using QTileFn = void (*)(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c);

// One row of the kernel table: the entry point takes the first row whose ISA is active and whose
// format matches.
struct QKernel {
  cpu::Isa isa;
  WeightFormat format;
  QKernelFn fn;    // a single row (and any row count)
  int mr;          // rows per call of fn
  QDequantFn dequant;  // the row-block path
  QTileFn tile;
  int tile_mr;     // rows per call of tile
  const char* name;
};
const QKernel& select_qkernel(WeightFormat f);

void qkernel_scalar_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c);
void qkernel_scalar_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c);
void qkernel_avx2_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c);
void qkernel_avx2_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c);
void qdequant_scalar_int8(const char* group, int64_t k0, int64_t kc, float* w);
void qdequant_scalar_int4(const char* group, int64_t k0, int64_t kc, float* w);
void qtile_scalar(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c);
void qdequant_avx2_int8(const char* group, int64_t k0, int64_t kc, float* w);
void qdequant_avx2_int4(const char* group, int64_t k0, int64_t kc, float* w);
void qtile_avx2(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c);

}  // namespace ot::gemm::qdetail
