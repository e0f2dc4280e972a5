// The backward forms of the engine (see ot/gemm.h): NT = A x W^T on row-major W (activation
// gradients), TN = A^T x B on row views (weight gradients). Both reuse the engine's micro-kernels
// (never AMX: it needs 32-row, 32-deep tiles and these shapes are thin) and its panel layouts;
// what is new is where the packing happens and how C is written:
//   NT: units = (job, block of 4 panels of 48 output columns). Each panel of W^T is packed in K
//       chunks of the kernel's kc (a 16x16 dword transpose: a bf16 k-pair is one dword) into an
//       L1 buffer right before all the unit's row tiles run over it, so a weight that changes
//       every training step is read once (prefetched a chunk ahead), never packed as a whole, and
//       its transposed chunk is consumed from L1. A is used in place when already in the kernel's
//       dtype.
//   TN: K is a group's rows (often 1..64). A^T and B are packed once per job (pairs padded to 2,
//       not 32), then units = (job, 128 rows of M, 4 panels) run the kernel over the whole K into
//       an L1 tile that is streamed to C (fp32 gradients are write-once: no read-for-ownership).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "ot/workspace.h"
#include "src/gemm/backward_forms.h"

namespace ot::gemm {

using namespace detail;

namespace {

constexpr int64_t kMB = 128;  // TN rows per unit
constexpr int64_t kPB = 4;    // panels per unit
constexpr int64_t kNtMB = 256;  // NT/NN rows per block (each W^T chunk is packed once per block)

struct Scratch { Buf panel, a, tile; };
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

float elem(const void* p, DType t, int64_t off) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}
const char* at(const void* p, DType t, int64_t off) { return static_cast<const char*>(p) + off * int64_t(dtype_size(t)); }
int64_t pad_pairs(Layout l, int64_t K) { return l == Layout::f32 ? K : (K + 1) / 2 * 2; }
int64_t panels_of(int64_t N) { return (N + kNR - 1) / kNR; }
Kernel thin_kernel(Layout l) { return select_kernel(l, 1); }  // M = 1: never the AMX tiles

void store_tile(const float* tile, int64_t ldt, int rows, int width, void* c, DType cdt, int64_t ldc, bool acc) {
  if (cpu::has(cpu::Isa::avx512)) { store_tile_avx512(tile, ldt, rows, width, c, cdt, ldc, acc); return; }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < width; ++j) {
      const float v = tile[r * ldt + j];
      if (cdt == DType::bf16) {
        uint16_t& d = static_cast<uint16_t*>(c)[r * ldc + j];
        d = f32_to_bf16((acc ? bf16_to_f32(d) : 0.f) + v);
      } else {
        float& d = static_cast<float*>(c)[r * ldc + j];
        d = (acc ? d : 0.f) + v;
      }
    }
}

// Writes value v (fp32) as element (k, j) of a panel of this layout.
inline void put(Layout l, char* panel, int64_t k, int j, float v, const void* src_bits = nullptr) {
  if (l == Layout::f32) reinterpret_cast<float*>(panel)[k * kNR + j] = v;
  else reinterpret_cast<uint16_t*>(panel)[(k >> 1) * 2 * kNR + 2 * j + (k & 1)] =
           src_bits ? *static_cast<const uint16_t*>(src_bits) : f32_to_bf16(v);
}

// ---- NT and NN ---------------------------------------------------------------------------------

// How W is stored: NT [N][K] (the product uses W^T), NN [K][N].
enum class WForm { nt, nn };

void check_nt(const NtJob& j, WForm f, const char* op) {
  OT_CHECK(j.M >= 0 && j.N >= 0, op, "M/N", ">= 0", j.M, " x ", j.N);
  OT_CHECK(j.w[0].K >= 0 && j.w[1].K >= 0, op, "w[].K", ">= 0", j.w[0].K, ", ", j.w[1].K);
  OT_CHECK(is_float(j.a.dtype) && is_float(j.w_dtype), op, "a/w", "bf16, fp16 or fp32", dtype_name(j.a.dtype));
  if (j.M == 0 || j.N == 0) return;
  const int64_t K = j.w[0].K + j.w[1].K;
  OT_CHECK(j.c != nullptr && j.ldc >= j.N, op, "c", "non-null with ldc >= N = " + std::to_string(j.N), j.ldc);
  OT_CHECK(K == 0 || (j.a.data && j.a.ld >= K), op, "a", "non-null with ld >= K = " + std::to_string(K), j.a.ld);
  for (int s = 0; s < 2; ++s)
    OT_CHECK(j.w[s].K == 0 || (j.w[s].data && j.w[s].ld >= (f == WForm::nt ? j.w[s].K : j.N)), op, "w[].ld",
             f == WForm::nt ? ">= its K" : ">= N", j.w[s].ld);
}

// Element (k, n) of the job's B = W^T (NT) or W (NN); k runs over segment 0 then segment 1.
inline const char* nt_w(const NtJob& j, WForm f, int64_t k, int64_t n) {
  const NtSegment& s = k < j.w[0].K ? j.w[0] : j.w[1];
  int64_t kk = k < j.w[0].K ? k : k - j.w[0].K;
  return at(s.data, j.w_dtype, f == WForm::nt ? n * s.ld + kk : kk * s.ld + n);
}

void nt_reference(const NtJob& j, WForm f) {
  const int64_t K = j.w[0].K + j.w[1].K;
  for (int64_t m = 0; m < j.M; ++m) {
    int64_t r = j.a.rows ? j.a.rows[m] : m;
    for (int64_t n = 0; n < j.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(elem(j.a.data, j.a.dtype, r * j.a.ld + k)) * elem(nt_w(j, f, k, n), j.w_dtype, 0);
      float& c = j.c[m * j.ldc + n];
      c = float(s + (j.accumulate ? double(c) : 0.0));
    }
  }
}

// Rows [k0, k0 + kn) of panel p of B = W^T (NT) or W (NN): [kn][48] f32 or [kn/2][48][2] bf16,
// zero-padded (k0 even; kn may run past K into the pair/K padding). pf: prefetch the next chunk.
void pack_nt_chunk(const NtJob& j, WForm f, Layout l, int64_t p, int64_t k0, int64_t kn, char* dst, bool pf) {
  const int64_t n0 = p * kNR, K0 = j.w[0].K, K = K0 + j.w[1].K, k1 = std::min(K, k0 + kn);
  const int w = int(std::min<int64_t>(kNR, j.N - n0));
  const size_t es = dtype_size(j.w_dtype);
  const bool avx = cpu::has(cpu::Isa::avx512);
  const int64_t per = l == Layout::f32 ? 1 : 2;  // k per dword of the panel
  const size_t row = size_t(kNR) * 4;            // bytes per dword row of the panel
  if (f == WForm::nt) {
    const bool dword_src = l == Layout::f32 ? j.w_dtype == DType::f32 : (j.w_dtype == DType::bf16 && K0 % 2 == 0);
    if (dword_src && avx) {
      int64_t pos = 0;  // dword rows written so far
      for (int s = 0, base = 0; s < 2; base += int(j.w[s].K), ++s) {
        const NtSegment& sg = j.w[s];
        const int64_t a = std::max<int64_t>(k0, base), b = std::min<int64_t>(k1, base + sg.K);
        const int64_t P = b > a ? (b - a) / per : 0;  // whole dwords of this segment in the chunk
        if (P > 0)
          transpose_dwords_avx512(at(sg.data, j.w_dtype, n0 * sg.ld + (a - base)), sg.ld * int64_t(es), w, P,
                                  reinterpret_cast<uint32_t*>(dst) + pos * kNR, pf ? kn * int64_t(es) : 0);
        pos += P;
      }
      std::memset(dst + size_t(pos) * row, 0, size_t(kn / per - pos) * row);
      if (l != Layout::f32 && K % 2 == 1 && K - 1 >= k0 && K - 1 < k0 + kn)  // the odd last element pairs with padding
        for (int c = 0; c < w; ++c) put(l, dst, K - 1 - k0, c, 0.f, nt_w(j, f, K - 1, n0 + c));
      return;
    }
  } else if (l != Layout::f32 && j.w_dtype == DType::bf16 && K0 % 2 == 0 && avx) {
    // two rows interleaved per k-pair; an odd last segment pairs its tail with zeros
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int s = 0, base = 0; s < 2; base += int(j.w[s].K), ++s) {
      const NtSegment& sg = j.w[s];
      const int64_t a = std::max<int64_t>(k0, base), b = std::min<int64_t>(k1, base + sg.K);
      if (b > a) pack_rows_vnni_avx512(static_cast<const uint16_t*>(sg.data) + (a - base) * sg.ld + n0, sg.ld, b - a, w, d + (a - k0) * kNR);
    }
    const int64_t done = (k1 - k0 + 1) / 2;
    std::memset(dst + size_t(done) * row, 0, size_t(kn / 2 - done) * row);
    return;
  }
  std::memset(dst, 0, size_t(kn) * kNR * layout_elt(l));
  for (int c = 0; c < w; ++c)
    for (int64_t k = k0; k < k1; ++k) {
      const char* src = nt_w(j, f, k, n0 + c);
      put(l, dst, k - k0, c, elem(src, j.w_dtype, 0), l != Layout::f32 ? src : nullptr);
    }
}

// Unit ub = panels [4 ub, 4 ub + 4) for all rows. Per panel, K runs in chunks of the kernel's kc:
// each chunk of W^T is packed into an L1 buffer right before every row tile of the block runs
// over it (the transposed weights are produced and consumed in L1; W streams from memory once,
// prefetched a chunk ahead). C accumulates in place over the chunks (a tile for an edge panel).
void nt_unit(const NtJob& j, WForm f, int64_t ub) {
  const Layout l = layout_for(j.a.dtype, j.w_dtype);
  const Kernel kern = thin_kernel(l);
  const int64_t K = j.w[0].K + j.w[1].K, Kp = pad_pairs(l, K);
  const size_t elt = layout_elt(l);
  const DType kdt = l == Layout::f32 ? DType::f32 : DType::bf16;
  const bool in_place = !j.a.rows && j.a.dtype == kdt && Kp == K;
  const int64_t kc = std::max<int64_t>(2, std::min(kern.kc, Kp));  // even, so chunks start at pairs
  Scratch& s = scratch();
  char* panel = s.panel.get(size_t(kc) * kNR * elt);
  const int64_t p0 = ub * kPB, p1 = std::min(panels_of(j.N), p0 + kPB);
  for (int64_t m0 = 0; m0 < j.M; m0 += kNtMB) {
    const int64_t mc = std::min(kNtMB, j.M - m0);
    const char* a;
    int64_t lda;
    if (in_place) {
      a = at(j.a.data, j.a.dtype, m0 * j.a.ld);
      lda = j.a.ld;
    } else {  // converted / gathered rows, once per row block
      lda = std::max<int64_t>(Kp, 2);
      char* buf = s.a.get(size_t(mc * lda) * elt + 64);
      pack_a({j.a.data, j.a.dtype, j.a.ld, 1, j.a.rows}, m0, mc, mc, K, l, buf, lda);
      a = buf;
    }
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kNR;
      const int w = int(std::min<int64_t>(kNR, j.N - n0));
      float* tile = w == kNR ? nullptr : reinterpret_cast<float*>(s.tile.get(size_t(mc) * kNR * 4));
      for (int64_t pc = 0; pc < Kp || pc == 0; pc += kc) {
        const int64_t kcur = std::min(kc, Kp - pc);
        pack_nt_chunk(j, f, l, p, pc, kcur, panel, pc + kcur < Kp);
        for (int64_t ir = 0; ir < mc; ir += kern.mr) {
          const int rows = int(std::min<int64_t>(kern.mr, mc - ir));
          const char* ap = a + size_t(ir * lda + pc) * elt;
          if (tile) kern.fn(rows, kcur, ap, lda, panel, tile + ir * kNR, kNR, pc > 0);
          else kern.fn(rows, kcur, ap, lda, panel, j.c + (m0 + ir) * j.ldc + n0, j.ldc, pc > 0 || j.accumulate);
        }
      }
      if (tile) store_tile(tile, kNR, int(mc), w, j.c + m0 * j.ldc + n0, DType::f32, j.ldc, j.accumulate);
    }
  }
}

// ---- TN ----------------------------------------------------------------------------------------

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
  float* tile = reinterpret_cast<float*>(scratch().tile.get(size_t(kern.mr) * size_t(ldt) * 4));
  for (int64_t ir = 0; ir < mc; ir += kern.mr) {
    const int rows = int(std::min<int64_t>(kern.mr, mc - ir));
    const char* a = base + pl.a_off + size_t((m0 + ir) * lda) * elt;
    for (int64_t p = p0; p < p1; ++p) kern.fn(rows, pl.Kp, a, lda, base + pl.b_off + size_t(p) * pbytes, tile + (p - p0) * kNR, ldt, false);
    store_tile(tile, ldt, rows, width, static_cast<char*>(j.c) + size_t((m0 + ir) * j.ldc + n0) * celt, j.c_dtype, j.ldc, j.accumulate);
  }
}

void run_nt_form(const NtJob* jobs, int64_t count, WForm f) {
  const char* op = f == WForm::nt ? "grouped_gemm_nt" : "grouped_gemm_nn";
  OT_CHECK(count >= 0 && (count == 0 || jobs), op, "jobs", "an array of count jobs", count);
  double flops = 0;
  for (int64_t i = 0; i < count; ++i) {
    check_nt(jobs[i], f, op);
    flops += 2.0 * double(jobs[i].M) * double(jobs[i].N) * double(jobs[i].w[0].K + jobs[i].w[1].K);
  }
  trace::OpScope scope(f == WForm::nt ? "gemm_nt" : "gemm_nn");
  scope.flops(flops).kernel(cpu::force_ref() ? "ref" : count ? thin_kernel(layout_for(jobs[0].a.dtype, jobs[0].w_dtype)).name : "none");
  if (scope.active()) scope.args("jobs=" + std::to_string(count));
  if (cpu::force_ref()) {
    for (int64_t i = 0; i < count; ++i)
      if (jobs[i].M > 0 && jobs[i].N > 0) nt_reference(jobs[i], f);
    return;
  }
  thread_local std::vector<int64_t> first_tl;
  std::vector<int64_t>& first = first_tl;  // first unit of each job (workers read the caller's)
  first.assign(size_t(count) + 1, 0);
  for (int64_t i = 0; i < count; ++i)
    first[size_t(i) + 1] = first[size_t(i)] + (jobs[i].M > 0 ? (panels_of(jobs[i].N) + kPB - 1) / kPB : 0);
  parallel_for_dynamic(first.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t i = int64_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1;
      nt_unit(jobs[i], f, u - first[size_t(i)]);
    }
  });
}

}  // namespace

void grouped_gemm_nt(const NtJob* jobs, int64_t count) { run_nt_form(jobs, count, WForm::nt); }
void grouped_gemm_nn(const NtJob* jobs, int64_t count) { run_nt_form(jobs, count, WForm::nn); }

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
