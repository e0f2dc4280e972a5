// The TN backward form of the engine (see ot/gemm.h): weight gradients C = A^T x B on row views,
// reusing the engine's micro-kernels (never AMX: thin shapes) and panel layouts. K is a group's
// rows (often 1..64). A^T and B are packed once per job (pairs padded to 2, not 32), then units =
// (job, 128 rows of M, 4 panels) run the kernel over the whole K into an L1 tile that is streamed
// to C (gradients are write-once: no read-for-ownership).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gemm/backward_forms.h"

namespace ot::gemm {

using namespace detail;

namespace {

constexpr int64_t kMB = 128;  // rows per unit
constexpr int64_t kPB = 4;    // panels per unit

void check_tn(const TnJob& j) {
  const char* op = "grouped_gemm_tn";
  OT_CHECK(j.K >= 0 && j.M >= 0 && j.N >= 0, op, "K/M/N", ">= 0", j.K, "/", j.M, "/", j.N);
  OT_CHECK(is_float(j.a_dtype) && is_float(j.b_dtype), op, "a/b", "bf16, fp16 or fp32", dtype_name(j.a_dtype));
  if (j.M == 0 || j.N == 0) return;
  OT_CHECK(j.c_dtype == DType::f32 || j.c_dtype == DType::bf16, op, "c_dtype", "f32 or bf16", dtype_name(j.c_dtype));
  OT_CHECK(j.c != nullptr && j.ldc >= j.N, op, "c", "non-null with ldc >= N = " + std::to_string(j.N), j.ldc);
  if (j.K == 0) return;
  OT_CHECK(j.a && j.lda >= j.M, op, "a", "non-null with lda >= M = " + std::to_string(j.M), j.lda);
  OT_CHECK(j.b && j.ldb >= j.N, op, "b", "non-null with ldb >= N = " + std::to_string(j.N), j.ldb);
}

void tn_reference(const TnJob& j) {
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = 0; n < j.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < j.K; ++k) s += double(elem(j.a, j.a_dtype, k * j.lda + m)) * elem(j.b, j.b_dtype, k * j.ldb + n);
      if (j.c_dtype == DType::bf16) {
        uint16_t& c = static_cast<uint16_t*>(j.c)[m * j.ldc + n];
        c = f32_to_bf16(float(s + (j.accumulate ? double(bf16_to_f32(c)) : 0.0)));
      } else {
        float& c = static_cast<float*>(j.c)[m * j.ldc + n];
        c = float(s + (j.accumulate ? double(c) : 0.0));
      }
    }
}

struct TnPlan {
  Layout l = Layout::f32;
  int64_t Kp = 0, np = 0, nmb = 0, nub = 0;
  size_t a_off = 0, b_off = 0;
};

// A^T [M][Kp] row-major in the kernel dtype (column k of row m = A[k][m]).
void pack_at(const TnJob& j, const TnPlan& pl, char* dst) {
  const size_t elt = layout_elt(pl.l);
  if (pl.l == Layout::bf16_vnni && cpu::has(cpu::Isa::avx512)) {  // both operands bf16: bits moved
    pack_cols_vnni_avx512(static_cast<const uint16_t*>(j.a), j.lda, j.K, j.M, reinterpret_cast<uint16_t*>(dst), pl.Kp);
    return;
  }
  for (int64_t m0 = 0; m0 < j.M; m0 += 64) {  // a 64-row block of A^T stays in L1 while k sweeps
    const int64_t m1 = std::min(j.M, m0 + 64);
    for (int64_t k = 0; k < j.K; ++k) {
      if (pl.l == Layout::f32) {
        float* d = reinterpret_cast<float*>(dst) + k;
        for (int64_t m = m0; m < m1; ++m) d[m * pl.Kp] = elem(j.a, j.a_dtype, k * j.lda + m);
      } else {
        const uint16_t* s = static_cast<const uint16_t*>(j.a) + k * j.lda;
        uint16_t* d = reinterpret_cast<uint16_t*>(dst) + k;
        for (int64_t m = m0; m < m1; ++m) d[m * pl.Kp] = s[m];
      }
    }
    for (int64_t k = j.K; k < pl.Kp; ++k)
      for (int64_t m = m0; m < m1; ++m) std::memset(dst + size_t(m * pl.Kp + k) * elt, 0, elt);
  }
}

// B's panels [np][Kp/2][48][2] (or f32 [Kp][48]).
void pack_tn_b(const TnJob& j, const TnPlan& pl, char* dst) {
  if (pl.l == Layout::bf16_vnni && cpu::has(cpu::Isa::avx512)) {
    const size_t pbytes = size_t(pl.Kp) * kNR * 2;
    for (int64_t p = 0; p < pl.np; ++p)
      pack_rows_vnni_avx512(static_cast<const uint16_t*>(j.b) + p * kNR, j.ldb, j.K, int(std::min<int64_t>(kNR, j.N - p * kNR)),
                            reinterpret_cast<uint16_t*>(dst + size_t(p) * pbytes));
    return;
  }
  Panels g;
  g.layout = pl.l;
  g.K = j.K;
  g.Kp = pl.Kp;
  g.N = j.N;
  g.npanels = pl.np;
  pack_b(j.b, j.b_dtype, j.ldb, 1, g, dst, 0, pl.np);
}

// Rows [m0, m0 + 128) x panels [p0, p0 + 4): each block of the kernel's rows is computed for the
// unit's 4 panels into one tile, then stored as whole rows of up to 192 columns (whole cache lines
// for the streaming stores, also in bf16).
void tn_unit(const TnJob& j, const TnPlan& pl, const char* base, int64_t u) {
  const Kernel kern = thin_kernel(pl.l);
  const size_t elt = layout_elt(pl.l), celt = dtype_size(j.c_dtype);
  const int64_t mb = u / pl.nub, ub = u % pl.nub;
  const int64_t m0 = mb * kMB, mc = std::min(kMB, j.M - m0);
  const int64_t p0 = ub * kPB, p1 = std::min(pl.np, p0 + kPB), n0 = p0 * kNR;
  const int width = int(std::min<int64_t>(j.N - n0, (p1 - p0) * kNR));
  const size_t pbytes = size_t(pl.Kp) * kNR * elt;
  const int64_t lda = pl.Kp, ldt = kPB * kNR;
  thread_local Buf tile_buf;
  float* tile = reinterpret_cast<float*>(tile_buf.get(size_t(kern.mr) * size_t(ldt) * 4));
  for (int64_t ir = 0; ir < mc; ir += kern.mr) {
    const int rows = int(std::min<int64_t>(kern.mr, mc - ir));
    const char* a = base + pl.a_off + size_t((m0 + ir) * lda) * elt;
    for (int64_t p = p0; p < p1; ++p) kern.fn(rows, pl.Kp, a, lda, base + pl.b_off + size_t(p) * pbytes, tile + (p - p0) * kNR, ldt, false);
    store_tile(tile, ldt, rows, width, static_cast<char*>(j.c) + size_t((m0 + ir) * j.ldc + n0) * celt, j.c_dtype, j.ldc, j.accumulate);
  }
}

}  // namespace

void grouped_gemm_tn(const TnJob* jobs, int64_t count) {
  OT_CHECK(count >= 0 && (count == 0 || jobs), "grouped_gemm_tn", "jobs", "an array of count jobs", count);
  double flops = 0;
  for (int64_t i = 0; i < count; ++i) {
    check_tn(jobs[i]);
    flops += 2.0 * double(jobs[i].M) * double(jobs[i].N) * double(jobs[i].K);
  }
  trace::OpScope scope("gemm_tn");
  scope.flops(flops).kernel(cpu::force_ref() ? "ref" : count ? thin_kernel(layout_for(jobs[0].a_dtype, jobs[0].b_dtype)).name : "none");
  if (scope.active()) scope.args("jobs=" + std::to_string(count));
  if (cpu::force_ref()) {
    for (int64_t i = 0; i < count; ++i)
      if (jobs[i].M > 0 && jobs[i].N > 0) tn_reference(jobs[i]);
    return;
  }
  thread_local std::vector<TnPlan> plans_tl;
  thread_local std::vector<int64_t> first_tl;
  thread_local Buf packed_tl;
  std::vector<TnPlan>& plans = plans_tl;
  std::vector<int64_t>& first = first_tl;
  plans.assign(size_t(count), {});
  first.assign(size_t(count) + 1, 0);
  size_t bytes = 64;
  for (int64_t i = 0; i < count; ++i) {
    const TnJob& j = jobs[i];
    TnPlan& pl = plans[size_t(i)];
    pl.l = layout_for(j.a_dtype, j.b_dtype);
    pl.Kp = pad_pairs(pl.l, j.K);
    pl.np = panels_of(j.N);
    const bool live = j.M > 0 && j.N > 0;
    pl.nmb = live ? (j.M + kMB - 1) / kMB : 0;
    pl.nub = (pl.np + kPB - 1) / kPB;
    const size_t elt = layout_elt(pl.l), kp = size_t(pl.Kp);
    pl.a_off = bytes;
    if (live) bytes += (size_t(j.M) * kp * elt + 63) / 64 * 64;
    pl.b_off = bytes;
    if (live) bytes += size_t(pl.np) * kp * kNR * elt;
    first[size_t(i) + 1] = first[size_t(i)] + pl.nmb * pl.nub;
  }
  char* base = packed_tl.get(bytes);
  parallel_for_dynamic(count, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TnJob& j = jobs[i];
      const TnPlan& pl = plans[size_t(i)];
      if (pl.nmb == 0) continue;
      pack_at(j, pl, base + pl.a_off);
      pack_tn_b(j, pl, base + pl.b_off);
    }
  });
  parallel_for_dynamic(first.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t i = int64_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1;
      tn_unit(jobs[i], plans[size_t(i)], base, u - first[size_t(i)]);
    }
    if (cpu::has(cpu::Isa::avx512)) store_fence_avx512();
  });
}

}  // namespace ot::gemm
