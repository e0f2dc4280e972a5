// The swapped NT form for jobs with few rows (MoE experts at training batch sizes, M ~ 32):
// C = A x W^T is computed as C^T = W x A^T, so the row-major weight W [N][K] is the micro-kernel's
// broadcast operand, read in place (no transposing pack of the big operand), and only the small
// A^T is packed (a dword transpose of M x K, once per job and thread). The C^T tiles are
// transposed on store (each C element carries K multiply-adds, so that is cheap).
// The zmm columns hold 16 A rows each, so a job's last M % 16 rows, when few (the dot tail,
// nt_split), are dot products along K instead (A and W rows read in place, every lane used),
// run over each W tile right after the swapped kernel has streamed it.
#pragma once
#include <cstdint>

#include "src/gemm/internal.h"

namespace ot::gemm::detail {

// Rows of W per micro-tile for a tile of NZ zmm columns (16 NZ rows of A): MR * NZ <= 24
// accumulators, and at least 12 independent chains to cover the dot product's latency.
constexpr int nt_mr(int nz) { return nz == 1 ? 16 : nz == 2 ? 12 : nz == 3 ? 8 : 6; }
constexpr int64_t kNtSwapMaxM = 64;  // 4 zmm columns
constexpr int kNtDotMR = 16;         // W rows per tile when the whole job is a dot tail (M < 16)

// t[r][0 .. 16 nz) (+)= sum over P k-pairs of W row r's pair q (row r at w + r * ldw, bf16) times
// the vnni panel b [P][16 nz][2] (pair q at b + q * 32 nz). mr <= nt_mr(nz); t rows ldt floats apart.
// Meanwhile the next tile's mrn rows (row r at wn + r * ldw, the same P pairs) are prefetched into L2.
// widen: fp32 FMAs on widened operands instead of vdpbf16ps (where bf16_dot_preferred() is false).
void kernel_nt_bf16_avx512bf16(int mr, int nz, int64_t P, const uint16_t* w, int64_t ldw, const uint16_t* b, float* t, int64_t ldt, bool load,
                               const uint16_t* wn, int mrn, bool widen);

// One K segment of the dot tail: W row r at w + r * ldw, A row i at a[i] (both bf16, read in
// place), P k-pairs.
struct NtDotSeg {
  const uint16_t* w = nullptr;
  int64_t ldw = 0, P = 0;
  const uint16_t* const* a = nullptr;
};
// c[i * ldc + r] (=|+=) sum over the segments of dot(W row r, A row i), for r < mr, i < na: the
// job's last rows (the dot tail), written straight into C.
void kernel_nt_dot_bf16_avx512bf16(int mr, int na, const NtDotSeg* seg, int nseg, float* c, int64_t ldc, bool accumulate);
// How a job of M rows is cut: nz full zmm columns of the swapped kernel (16 rows each, mr W rows
// per tile) and `tail` rows in the dot kernel. A tail of up to kNtDotMaxTail rows costs less as
// dot products (every lane used) than as one more zmm column (16 lanes for `tail` rows).
// (Qwen3 T512, experts of 20-46 rows: limits 0 / 8 / 10 / 11 / 12 measured, 8 best for g and dx.)
constexpr int kNtDotMaxTail = 8;
struct NtSplit { int nz, tail, mr; };
NtSplit nt_split(int64_t M);

// Whether job j runs on the swapped form here (bf16 A and W, AVX512-BF16, 1 <= M <= 64, every
// K segment even and K > 0).
bool nt_swapped_fits(const NtJob& j);
// A new id per grouped call (the per-thread A^T panel is reused across the units of one job).
uint64_t nt_swapped_call();
// Output columns [192 u, 192 u + 192) of job j.
void nt_swapped_unit(const NtJob& j, uint64_t call, int64_t u);
constexpr int64_t kNtSwapNB = 192;  // W rows per unit (a multiple of every nt_mr and of 16)

}  // namespace ot::gemm::detail
