// Internals of the quantised grouped GEMM (ot/gemm_quant.h): the panel layout and the kernel table.
//
// An expert's weights are panels of kQNR = 32 columns (halves interleaved g0, u0, g1, u1, ... when N
// is even, as in the main engine, so a SwiGLU unit finds gate and up panels side by side). A panel
// is its K groups in order (one group of K rows when per channel), each:
//   float s[32], m[32]          scale and additive term: w = s * u + m
//   codes[ceil(len / 2)][pair_bytes]   rows k and k + 1 of the group together (a zero code row pads
//                                      an odd len), laid out so that each 16-bit lane of a 32-byte
//                                      block holds the pair (k, k + 1) of one column: vpmaddwd then
//                                      multiplies a pair of int16 activations into one int32 lane.
//     int4 (32 bytes a pair, u = q + 8 in [0, 15], m = (offset - 8) * s): 16-bit lane L = 2c + kk
//       (c < 8, kk = k offset 0/1) holds in its nibble t (bits 4t..4t+3) column 8t + c;
//     int8 (64 bytes a pair, u = q, m = offset * s): block h < 2, 16-bit lane L = 2c + kk holds
//       column 16h + c in its low byte and column 16h + 8 + c in its high byte.
// Columns past the edge have s = m = 0 and code 0. The single-row kernels compute, per group j,
// s * sum_k a[k] * u[k] + m * asum[j] with asum the group's sum of a: the offset never touches the
// inner loop and the codes only need a widening. More rows take the row-block path below.
#pragma once
#include <cstddef>
#include <cstdint>

#include <algorithm>

#include "ot/cpu.h"
#include "ot/gemm_quant.h"
#include "ot/quant_weights.h"
#include "src/gemm/internal.h"

namespace ot::gemm::qdetail {
inline constexpr int kQNR = 32;
}  // namespace ot::gemm::qdetail

namespace ot::gemm {

// The packed experts: G experts of npanels panels, each `groups` K groups of `len` rows.
struct PackedQuantB::Impl {
  int64_t G = 0, K = 0, N = 0, groups = 1, len = 0, npanels = 0;
  WeightFormat format = WeightFormat::int8;
  int64_t group_size = 0;
  bool offset = false, split = false;
  ActivationQuant aq = ActivationQuant::none;
  size_t panel_bytes = 0;
  detail::WeightMem mem;
  const char* panel(int64_t g, int64_t p) const { return mem.get() + (size_t(g) * size_t(npanels) + size_t(p)) * panel_bytes; }
  // First column of panel p and how many of its 32 columns are real (halves interleaved when split).
  void cols(int64_t p, int64_t* col0, int* width) const {
    const int64_t span = split ? N / 2 : N, i = split ? p >> 1 : p, base = split ? (p & 1) * span : 0;
    *col0 = base + i * qdetail::kQNR;
    *width = int(std::min<int64_t>(qdetail::kQNR, span - i * qdetail::kQNR));
  }
};

}  // namespace ot::gemm

namespace ot::gemm::qdetail {

inline constexpr size_t kQHeader = 2 * kQNR * sizeof(float);
// Bytes of one code pair row (k, k + 1) and of one group (header + pair rows).
inline size_t pair_bytes(WeightFormat f) { return f == WeightFormat::int4 ? kQNR : 2 * kQNR; }
inline size_t group_bytes(WeightFormat f, int64_t len) { return kQHeader + size_t((len + 1) / 2) * pair_bytes(f); }

// Where the code of (k offset kk, column n) lives in a pair row: byte index and bit shift.
inline void code_position(bool int4, int kk, int n, size_t* byte, int* shift) {
  if (int4) {
    const int lane = 2 * (n % 8) + kk, t = n / 8;
    *byte = size_t(2 * lane + t / 2), *shift = 4 * (t % 2);
  } else {
    const int h = n / 16, c = n % 16, lane = 2 * (c % 8) + kk;
    *byte = size_t(32 * h + 2 * lane + c / 8), *shift = 0;
  }
}
// u of (kk, n): int4 in [0, 15], int8 the signed code.
inline int code_at(const unsigned char* pair_row, bool int4, int kk, int n) {
  size_t b;
  int sh;
  code_position(int4, kk, n, &b, &sh);
  return int4 ? int((pair_row[b] >> sh) & 0xF) : int(static_cast<signed char>(pair_row[b]));
}

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

// The int16-activation path (bf16 / fp16 inputs; one row on AVX2, row tiles on AVX-512 VNNI): a16 holds each group's len values
// rounded to int16 against a per-32-block scale (ascale[j * blocks + b], blocks = ceil(len / 32)),
// zero-padded to whole blocks; asum the groups' sums of those rounded values. Only the rounding of
// the activations differs from the fp32 form (relative error <= 2^-16 of the block's largest
// |a|, far below the rounding of the bf16 / fp16 input itself).
inline constexpr int64_t kQABlock = 32;
inline int64_t act_blocks(int64_t len) { return (len + kQABlock - 1) / kQABlock; }
// One call: rows r < rows (rows <= the kernel's i16_mr) of a16 (row r at a16 + r * lda, its block
// scales at ascale + r * ldsc, its group sums at asum + r * ldas) times `panels` panels (panel q at
// panel + q * panel_step) into c (panel q, row r at c + q * ldcp + r * 32); pf: the software
// prefetch distance in bytes (0: none).
struct QI16Args {
  int rows, panels;
  const int16_t* a16;
  int64_t lda;
  const float* ascale;
  int64_t ldsc;
  const float* asum;
  int64_t ldas;
  const char* panel;
  size_t panel_step;
  int64_t groups, len;
  float* c;
  int64_t ldcp;
  int64_t pf;
};
using QKernelI16Fn = void (*)(const QI16Args&);
// a[0, len) as int16 blocks of kQABlock into q (zero-padded to whole blocks) with scale[b] =
// max |a| / 32767 and codes round-to-nearest-even(a * 32767 / max |a|); returns the sum of the
// rounded values (times their scales). A block with a NaN or Inf gets a NaN scale and zero codes,
// so the row's outputs are NaN as on the fp32 path. Every ISA's form gives the same bits.
using QActI16Fn = float (*)(const float* a, int64_t len, int16_t* q, float* scale);

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
  QKernelI16Fn fn_i16;  // the int16 path for bf16 / fp16 activations (nullptr: fn on fp32)
  QActI16Fn act_i16;    // the activations' rounding for fn_i16
  int i16_mr;           // rows per call of fn_i16 (1: only one-row groups take it)
  int stream_rows;      // groups of up to this many rows read two panels side by side (fn_i16, panels = 2)
  bool vnni;            // needs AVX512_VNNI besides the ISA level
  const char* name;
};
const QKernel& select_qkernel(WeightFormat f);

// --- W8A8 (ActivationQuant::int8_per_token): int8 weights for int8 activations -------------------
// A panel group is the same header (float s[32], m[32], m = offset * s) followed by quad rows of
// 128 bytes: rows k .. k + 3 of the group (len padded to a multiple of 4), block h < 2 of 64 bytes,
// 32-bit lane c holding column 16h + c's codes for k, k + 1, k + 2, k + 3 in byte order, each
// stored unsigned as u = q + 128 (pads and columns past the edge: 128, i.e. q = 0). vpdpbusd
// multiplies the 4 unsigned weight bytes of a lane by 4 signed activation codes broadcast to every
// lane (the activations are the operand that takes the memory broadcast), so per group
//   sum_k a[k] * q[k] = acc - 128 * sum_k a[k]
// with the activation sum known per row and group: no weight column sums are stored.
inline constexpr int kA8Quad = 4;
inline constexpr size_t kA8QuadBytes = size_t(kA8Quad) * kQNR;
inline int64_t a8_len(int64_t len) { return (len + kA8Quad - 1) / kA8Quad * kA8Quad; }
inline size_t a8_group_bytes(int64_t len) { return kQHeader + size_t(a8_len(len) / kA8Quad) * kA8QuadBytes; }
// Byte of (k offset kk < 4 in its quad row, column n < 32) in a quad row.
inline size_t a8_code_byte(int kk, int n) { return size_t(64 * (n / 16) + 4 * (n % 16) + kk); }

// One call: c[r * 32 + j] = ascale[r] * sum over groups g of (s[j] * sum_k a[r][k] q[k][j] +
// m[j] * asum[r][g]) for r < rows (rows <= the kernel's mr). a: rows of int8 codes, row r at
// a + r * lda bytes, group g at g * a8_len(len) (zero codes pad each group); asum[r * ldas + g]: the
// int32 sum of row r's codes over group g; ascale[r]: row r's scale.
// panels 2 (rows <= the kernel's stream_rows): also the panel at panel + panel_step into
// c + ldcp, read side by side with the first (two memory streams per thread for decode).
struct QA8Args {
  int rows, panels = 1;
  const int8_t* a;
  int64_t lda;
  const int32_t* asum;
  int64_t ldas;
  const float* ascale;
  const char* panel;
  size_t panel_step = 0;
  int64_t groups, len;
  float* c;
  int64_t ldcp = 0;
};
using QKernelA8Fn = void (*)(const QA8Args&);
struct QKernelA8 {
  cpu::Isa isa;
  bool vnni;  // needs AVX512_VNNI besides the ISA level
  QKernelA8Fn fn;
  int mr;           // rows per call
  int stream_rows;  // groups of up to this many rows take two panels a call (0: never)
  const char* name;
};
const QKernelA8& select_qkernel_a8();
// The W8A8 form of grouped_gemm_quant (quant_gemm_a8.cpp), after its argument checks.
void grouped_gemm_a8(const PackedQuantB::Impl& im, const QuantGroup* groups, int64_t count, const int64_t* row0);
// The epilogue of unit u of group g (a gate/up panel pair when the halves interleave) from its
// tiles t0 (panel 0) and t1 (panel 1), `rows` rows of 32 floats each.
void finish_unit(const PackedQuantB::Impl& im, const QuantGroup& g, int64_t unit, int64_t rows, const float* t0, const float* t1);
void qkernel_scalar_a8(const QA8Args& g);
void qkernel_avx512vnni_a8(const QA8Args& g);

void qkernel_scalar_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c);
void qkernel_scalar_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c);
void qkernel_avx2_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c);
void qkernel_avx2_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                       float* c);
float qact_i16_scalar(const float* a, int64_t len, int16_t* q, float* scale);
float qact_i16_avx2(const float* a, int64_t len, int16_t* q, float* scale);
float qact_i16_avx512(const float* a, int64_t len, int16_t* q, float* scale);
void qkernel_avx2_int8_i16(const QI16Args& g);
void qkernel_avx2_int4_i16(const QI16Args& g);
void qkernel_avx512vnni_int8_i16(const QI16Args& g);
void qkernel_avx512vnni_int4_i16(const QI16Args& g);
void qdequant_scalar_int8(const char* group, int64_t k0, int64_t kc, float* w);
void qdequant_scalar_int4(const char* group, int64_t k0, int64_t kc, float* w);
void qtile_scalar(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c);
void qdequant_avx2_int8(const char* group, int64_t k0, int64_t kc, float* w);
void qdequant_avx2_int4(const char* group, int64_t k0, int64_t kc, float* w);
void qtile_avx2(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c);

}  // namespace ot::gemm::qdetail
