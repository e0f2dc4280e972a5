// The row kernels of the gated RMSNorm (rms_norm_gated.cpp drives them): a range of rows at a time,
// compiled once per ISA from rms_norm_gated_kernels.inc. Rows are N contiguous values, row r at
// p + r * st elements; weight prepared in fp32; every statistic in fp32.
#pragma once
#include <cstdint>

#include "ot/tensor.h"
#include "src/core/elem_at.h"
#include "src/core/knobs.h"

namespace ot::gdn::detail::norm {

using In = StridedRows;
using Out = StridedOutRows;
struct Cfg {
  int64_t N = 0, group = 0;  // group divides N
  float eps = 0.f;
  bool norm_before_gate = true;
  const float* w = nullptr;  // [N]
};
inline int64_t pad8(int64_t n) { return (n + 7) / 8 * 8; }
// Scratch floats per call (zero-initialised by the caller: the pads past N are read, never used).
inline int64_t fwd_scratch(int64_t N) { return 3 * pad8(N); }
inline int64_t bwd_scratch(int64_t N) { return 6 * pad8(N); }

// y = rmsnorm-gate(x, z) of rows r0 .. r1-1; rstd [rows][N / group] (null: not wanted).
void fwd_rows_generic(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* scratch);
void fwd_rows_avx2(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* scratch);
// Groups of whole vectors only (group % 16 == 0): rms_norm_gated_avx512.inc, built for AVX-512 and
// for AVX-512 BF16 (its bf16 stores by vcvtneps2bf16).
void fwd_rows_avx512(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* scratch);
void fwd_rows_avx512bf16(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* scratch);
// dx, dz of rows r0 .. r1-1 and dw[N] += this range's weight gradient (in row order). rstd: the
// forward's (null: recomputed).
struct Bwd {
  In dy, x, z;
  Out dx, dz;
  const float* rstd = nullptr;
};
void bwd_rows_generic(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* scratch);
void bwd_rows_avx2(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* scratch);
// Groups of whole vectors and dy in the dtype of x only: rms_norm_gated_avx512.inc (both builds).
void bwd_rows_avx512(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* scratch);
void bwd_rows_avx512bf16(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* scratch);
// The AVX-512 forward computes the gates 8 vectors in lockstep (0: one at a time).
extern knobs::Knob g_gate_lockstep;

}  // namespace ot::gdn::detail::norm
