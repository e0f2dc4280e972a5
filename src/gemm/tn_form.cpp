// The TN backward form of the engine (see ot/gemm.h): weight gradients C = A^T x B on row views.
// K is a group's rows (often 1..64). A^T and B are packed once per job (pairs padded to 2, not 32).
// With bf16 operands on AVX512_BF16 (the MoE backward), units = (job, 96 rows of M, whole rows of
// C) run a 6 x 64 vdpbf16ps kernel that streams its accumulators straight to C
// (tn_kernel__avx512bf16.cpp; on fp32 FMAs where those are faster). Otherwise units = (job, 128 rows, 4 panels) run the engine's
// micro-kernel over the whole K into an L1 tile that is then streamed to C (the AVX2 bf16 kernel
// on A^T packed once as fp32: tn_form__avx2.cpp). Gradients are write-once: streaming stores, no
// read-for-ownership.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/gemm/tn_form.h"

namespace ot::gemm {

using namespace detail;

namespace {

constexpr int64_t kMB = 128;  // rows per unit (tile path)
constexpr int64_t kPB = 4;    // panels per unit (tile path)
constexpr int64_t kDirectMB = 16 * kTnMR;      // rows per unit (direct path)
// B bytes per unit (direct path): the unit's panels stay in L2. Units span whole rows of C where
// they fit: each thread's streaming stores then run along 6 rows at a time (measured: 2.4 GB of
// fp32 gradients written while computing in 70-73 ms with whole rows, 82 ms with 256-column
// units; bf16 61 vs 70-76 ms; the kernel alone 51 ms).
constexpr size_t kDirectUnitB = 512 * 1024;

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

// direct: bf16 operands on AVX512_BF16, 64-column panels, accumulators stored straight to C
// (tn_kernel__avx512bf16.cpp); otherwise the engine's kernel into an L1 tile, then store_tile.
struct TnPlan {
  Layout l = Layout::f32;
  bool direct = false;
  bool widen = false;         // direct on fp32 FMAs (bf16 widened), where vdpbf16ps is the slower
  int64_t nr = kNR;           // panel width
  int64_t mb = kMB, pb = kPB;  // rows and panels per unit
  int64_t Kp = 0, np = 0, nmb = 0, nub = 0;
  size_t a_off = 0, b_off = 0;
  bool a_shared = false;  // A^T is the previous job's (same A): not packed again
  bool f32a = false;      // tile path on a kernel with an fp32-A entry (AVX2 bf16): A^T packed as fp32
  size_t panel_bytes() const { return size_t(Kp) * size_t(nr) * layout_elt(l); }
  size_t a_elt() const { return f32a ? 4 : layout_elt(l); }
};

// Job j reads the same A as the previous job p (e.g. x^T for both dW_gate and dW_up) in the same
// packed layout, so it can use p's packed A^T.
bool same_a(const TnJob& p, const TnPlan& pp, const TnJob& j, const TnPlan& pl) {
  return pp.nmb > 0 && p.a == j.a && p.lda == j.lda && p.K == j.K && p.M == j.M && p.a_dtype == j.a_dtype && pp.l == pl.l && pp.Kp == pl.Kp && pp.f32a == pl.f32a;
}

// A^T [M][Kp] row-major in the kernel's A dtype (column k of row m = A[k][m]).
void pack_at(const TnJob& j, const TnPlan& pl, char* dst) {
  const size_t elt = pl.a_elt();
  if (pl.f32a && j.a_dtype == DType::bf16) {  // f32a: only the AVX2 kernel has it
    pack_cols_f32_avx2(static_cast<const uint16_t*>(j.a), j.lda, j.K, j.M, reinterpret_cast<float*>(dst), pl.Kp, pl.Kp);
    return;
  }
  if (!pl.f32a && pl.l == Layout::bf16_vnni && cpu::has(cpu::Isa::avx512)) {  // both operands bf16: bits moved
    pack_cols_vnni_avx512(static_cast<const uint16_t*>(j.a), j.lda, j.K, j.M, reinterpret_cast<uint16_t*>(dst), pl.Kp);
    return;
  }
  for (int64_t m0 = 0; m0 < j.M; m0 += 64) {  // a 64-row block of A^T stays in L1 while k sweeps
    const int64_t m1 = std::min(j.M, m0 + 64);
    for (int64_t k = 0; k < j.K; ++k) {
      if (elt == 4) {
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

// B's panels [np][Kp/2][nr][2] (or f32 [Kp][48]).
void pack_tn_b(const TnJob& j, const TnPlan& pl, char* dst) {
  if (pl.direct) {
    for (int64_t p = 0; p < pl.np; ++p)
      pack_rows_vnni_avx512(static_cast<const uint16_t*>(j.b) + p * kTnNR, j.ldb, j.K, int(std::min<int64_t>(kTnNR, j.N - p * kTnNR)),
                            reinterpret_cast<uint16_t*>(dst + size_t(p) * pl.panel_bytes()), kTnNR);
    return;
  }
  if (pl.l == Layout::bf16_vnni && cpu::has(cpu::Isa::avx512)) {
    const size_t pbytes = pl.panel_bytes();
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
  const KernelFn fn = pl.f32a ? kern.fn_f32a : kern.fn;
  const size_t elt = pl.a_elt(), celt = dtype_size(j.c_dtype);
  const int64_t mb = u / pl.nub, ub = u % pl.nub;
  const int64_t m0 = mb * kMB, mc = std::min(kMB, j.M - m0);
  const int64_t p0 = ub * kPB, p1 = std::min(pl.np, p0 + kPB), n0 = p0 * kNR;
  const int width = int(std::min<int64_t>(j.N - n0, (p1 - p0) * kNR));
  const size_t pbytes = pl.panel_bytes();
  const int64_t lda = pl.Kp, ldt = kPB * kNR;
  thread_local Buf tile_buf;
  float* tile = reinterpret_cast<float*>(tile_buf.get(size_t(kern.mr) * size_t(ldt) * 4));
  for (int64_t ir = 0; ir < mc; ir += kern.mr) {
    const int rows = int(std::min<int64_t>(kern.mr, mc - ir));
    const char* a = base + pl.a_off + size_t((m0 + ir) * lda) * elt;
    for (int64_t p = p0; p < p1; ++p) fn(rows, pl.Kp, a, lda, base + pl.b_off + size_t(p) * pbytes, tile + (p - p0) * kNR, ldt, false);
    store_tile(tile, ldt, rows, width, static_cast<char*>(j.c) + size_t((m0 + ir) * j.ldc + n0) * celt, j.c_dtype, j.ldc, j.accumulate);
  }
}

// Direct path: rows [m0, m0 + mb) x panels [p0, p0 + pb) (whole rows of C where B fits in L2);
// per block of kTnMR rows the kernel runs along the panels and writes C itself, so each of the 6
// rows' streaming stores runs along the row while the next panels' dot products run.
void tn_unit_direct(const TnJob& j, const TnPlan& pl, const char* base, int64_t u) {
  const size_t celt = dtype_size(j.c_dtype);
  const int64_t mb = u / pl.nub, ub = u % pl.nub;
  const int64_t m0 = mb * pl.mb, mc = std::min(pl.mb, j.M - m0);
  const int64_t p0 = ub * pl.pb, p1 = std::min(pl.np, p0 + pl.pb);
  const uint16_t* b = reinterpret_cast<const uint16_t*>(base + pl.b_off);
  const size_t pel = pl.panel_bytes() / 2;
  for (int64_t ir = 0; ir < mc; ir += kTnMR) {
    const uint16_t* a = reinterpret_cast<const uint16_t*>(base + pl.a_off) + (m0 + ir) * pl.Kp;
    char* c = static_cast<char*>(j.c) + size_t((m0 + ir) * j.ldc + p0 * kTnNR) * celt;
    tn_rows_bf16_avx512bf16(int(std::min<int64_t>(kTnMR, mc - ir)), pl.Kp, a, pl.Kp, b + size_t(p0) * pel, pel, p1 - p0, c, j.c_dtype, j.ldc,
                            j.N - p0 * kTnNR, j.accumulate, pl.widen);
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
    pl.direct = pl.l == Layout::bf16_vnni && j.a_dtype == DType::bf16 && j.b_dtype == DType::bf16 && cpu::has(cpu::Isa::avx512_bf16);
    pl.widen = pl.direct && !bf16_dot_preferred();
    pl.f32a = !pl.direct && thin_kernel(pl.l).fn_f32a;
    if (pl.direct) {
      pl.nr = kTnNR;
      pl.mb = kDirectMB;
      pl.pb = std::max<int64_t>(1, int64_t(kDirectUnitB / std::max<size_t>(pl.panel_bytes(), 1)));
    }
    pl.np = (j.N + pl.nr - 1) / pl.nr;
    const bool live = j.M > 0 && j.N > 0;
    pl.nmb = live ? (j.M + pl.mb - 1) / pl.mb : 0;
    pl.nub = (pl.np + pl.pb - 1) / pl.pb;
    const size_t elt = pl.a_elt(), kp = size_t(pl.Kp);
    pl.a_shared = live && i > 0 && same_a(jobs[i - 1], plans[size_t(i) - 1], j, pl);
    pl.a_off = pl.a_shared ? plans[size_t(i) - 1].a_off : bytes;
    if (live && !pl.a_shared) bytes += (size_t(j.M) * kp * elt + 63) / 64 * 64;
    pl.b_off = bytes;
    if (live) bytes += size_t(pl.np) * pl.panel_bytes();
    first[size_t(i) + 1] = first[size_t(i)] + pl.nmb * pl.nub;
  }
  char* base = packed_tl.get(bytes);
  parallel_for_dynamic(count, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TnJob& j = jobs[i];
      const TnPlan& pl = plans[size_t(i)];
      if (pl.nmb == 0) continue;
      if (!pl.a_shared) pack_at(j, pl, base + pl.a_off);
      pack_tn_b(j, pl, base + pl.b_off);
    }
  });
  parallel_for_dynamic(first.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t i = int64_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1;
      const TnPlan& pl = plans[size_t(i)];
      if (pl.direct) tn_unit_direct(jobs[i], pl, base, u - first[size_t(i)]);
      else tn_unit(jobs[i], pl, base, u - first[size_t(i)]);
    }
    if (cpu::has(cpu::Isa::avx512)) store_fence_avx512();
  });
}

}  // namespace ot::gemm
