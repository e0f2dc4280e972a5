// The NT and NN backward forms of the engine (see ot/gemm.h): A x W^T / A x W on row-major W that
// changes every training step (activation gradients, the training forward). They reuse the
// engine's micro-kernels (never AMX: it needs 32-row, 32-deep tiles and these shapes are thin)
// and its panel layouts; what is new is where the packing happens:
//   units = (job, block of 4 panels of 48 output columns). Each panel of W^T is packed in K
//   chunks of the kernel's kc (a 16x16 dword transpose, 8x8 on AVX2: a bf16 k-pair is one dword) into an
//   L1 buffer right before all the unit's row tiles run over it, so a weight that changes
//   every training step is read once (prefetched a chunk ahead), never packed as a whole, and
//   its transposed chunk is consumed from L1. A is used in place when already in the kernel's
//   dtype.
// The TN form (weight gradients) is in tn_form*.cpp.
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
#include "src/core/elem_at.h"
#include "src/gemm/backward_forms.h"
#include "src/gemm/nt_swapped.h"

namespace ot::gemm {

using namespace detail;

namespace {

constexpr int64_t kPB = 4;    // panels per unit
constexpr int64_t kNtMB = 256;  // NT/NN rows per block (each W^T chunk is packed once per block)
static_assert(kNtSwapNB == kPB * kNR, "the swapped NT form cuts jobs into the same units");

struct Scratch { Buf panel, a, tile; };
Scratch& scratch() {
  thread_local Scratch s;
  return s;
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
  return elem_at(s.data, j.w_dtype, f == WForm::nt ? n * s.ld + kk : kk * s.ld + n);
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
  const bool avx = cpu::has(cpu::Isa::avx512), avx2 = !avx && cpu::has(cpu::Isa::avx2);
  const int64_t per = l == Layout::f32 ? 1 : 2;  // k per dword of the panel
  const size_t row = size_t(kNR) * 4;            // bytes per dword row of the panel
  if (f == WForm::nt) {
    const bool dword_src = l == Layout::f32 ? j.w_dtype == DType::f32 : (j.w_dtype == DType::bf16 && K0 % 2 == 0);
    if (dword_src && (avx || avx2)) {
      const auto transpose = avx ? transpose_dwords_avx512 : transpose_dwords_avx2;
      int64_t pos = 0;  // dword rows written so far
      for (int s = 0, base = 0; s < 2; base += int(j.w[s].K), ++s) {
        const NtSegment& sg = j.w[s];
        const int64_t a = std::max<int64_t>(k0, base), b = std::min<int64_t>(k1, base + sg.K);
        const int64_t P = b > a ? (b - a) / per : 0;  // whole dwords of this segment in the chunk
        if (P > 0)
          transpose(elem_at(sg.data, j.w_dtype, n0 * sg.ld + (a - base)), sg.ld * int64_t(es), w, P,
                    reinterpret_cast<uint32_t*>(dst) + pos * kNR, pf ? kn * int64_t(es) : 0);
        pos += P;
      }
      std::memset(dst + size_t(pos) * row, 0, size_t(kn / per - pos) * row);
      if (l != Layout::f32 && K % 2 == 1 && K - 1 >= k0 && K - 1 < k0 + kn)  // the odd last element pairs with padding
        for (int c = 0; c < w; ++c) put(l, dst, K - 1 - k0, c, 0.f, nt_w(j, f, K - 1, n0 + c));
      return;
    }
  } else if (l != Layout::f32 && j.w_dtype == DType::bf16 && K0 % 2 == 0 && (avx || avx2)) {
    // two rows interleaved per k-pair; an odd last segment pairs its tail with zeros
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int s = 0, base = 0; s < 2; base += int(j.w[s].K), ++s) {
      const NtSegment& sg = j.w[s];
      const int64_t a = std::max<int64_t>(k0, base), b = std::min<int64_t>(k1, base + sg.K);
      if (b <= a) continue;
      const uint16_t* src = static_cast<const uint16_t*>(sg.data) + (a - base) * sg.ld + n0;
      if (avx) pack_rows_vnni_avx512(src, sg.ld, b - a, w, d + (a - k0) * kNR);
      else pack_rows_vnni_avx2(src, sg.ld, b - a, w, d + (a - k0) * kNR);
    }
    const int64_t done = (k1 - k0 + 1) / 2;
    std::memset(dst + size_t(done) * row, 0, size_t(kn / 2 - done) * row);
    return;
  }
  // Portable: element by element, with byte strides per segment (no dtype_size call per element).
  std::memset(dst, 0, size_t(kn) * kNR * layout_elt(l));
  for (int s = 0, base = 0; s < 2; base += int(j.w[s].K), ++s) {
    const NtSegment& sg = j.w[s];
    const int64_t a = std::max<int64_t>(k0, base), b = std::min<int64_t>(k1, base + sg.K);
    if (b <= a) continue;
    const int64_t sk = int64_t(es) * (f == WForm::nt ? 1 : sg.ld), sn = int64_t(es) * (f == WForm::nt ? sg.ld : 1);
    const char* s0 = static_cast<const char*>(sg.data) + (a - base) * sk + n0 * sn;
    for (int c = 0; c < w; ++c)
      for (int64_t k = a; k < b; ++k) {
        const char* src = s0 + c * sn + (k - a) * sk;
        put(l, dst, k - k0, c, elem(src, j.w_dtype, 0), l != Layout::f32 ? src : nullptr);
      }
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
  // Kernels with an fp32-A entry (the widening and AVX2 bf16 kernels) get A packed as fp32 once per
  // row block, not widened again by every tile call.
  const bool f32a = kern.fn_f32a != nullptr;
  const KernelFn fn = f32a ? kern.fn_f32a : kern.fn;
  const size_t aelt = f32a ? 4 : elt;
  const bool in_place = !f32a && !j.a.rows && j.a.dtype == kdt && Kp == K;
  const int64_t kc = std::max<int64_t>(2, std::min(kern.kc, Kp));  // even, so chunks start at pairs
  Scratch& s = scratch();
  char* panel = s.panel.get(size_t(kc) * kNR * elt);
  const int64_t p0 = ub * kPB, p1 = std::min(panels_of(j.N), p0 + kPB);
  for (int64_t m0 = 0; m0 < j.M; m0 += kNtMB) {
    const int64_t mc = std::min(kNtMB, j.M - m0);
    const char* a;
    int64_t lda;
    if (in_place) {
      a = elem_at(j.a.data, j.a.dtype, m0 * j.a.ld);
      lda = j.a.ld;
    } else {  // converted / gathered rows, once per row block
      lda = std::max<int64_t>(Kp, 2);
      char* buf = s.a.get(size_t(mc * lda) * aelt + 64);
      pack_a({j.a.data, j.a.dtype, j.a.ld, 1, j.a.rows}, m0, mc, mc, K, f32a ? Layout::f32 : l, buf, lda);
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
          const char* ap = a + size_t(ir * lda + pc) * aelt;
          if (tile) fn(rows, kcur, ap, lda, panel, tile + ir * kNR, kNR, pc > 0);
          else fn(rows, kcur, ap, lda, panel, j.c + (m0 + ir) * j.ldc + n0, j.ldc, pc > 0 || j.accumulate);
        }
      }
      if (tile) store_tile(tile, kNR, int(mc), w, j.c + m0 * j.ldc + n0, DType::f32, j.ldc, j.accumulate);
    }
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
  thread_local std::vector<char> swapped_tl;
  std::vector<int64_t>& first = first_tl;  // first unit of each job (workers read the caller's)
  std::vector<char>& swapped = swapped_tl;  // job runs on the swapped NT form (nt_swapped.h)
  first.assign(size_t(count) + 1, 0);
  swapped.assign(size_t(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    // both forms cut a job into the same units: 192 output columns (4 panels of 48)
    first[size_t(i) + 1] = first[size_t(i)] + (jobs[i].M > 0 ? (panels_of(jobs[i].N) + kPB - 1) / kPB : 0);
    swapped[size_t(i)] = f == WForm::nt && nt_swapped_fits(jobs[i]);
  }
  const uint64_t call = nt_swapped_call();
  auto run = [&](int64_t i, int64_t u) {
    if (swapped[size_t(i)]) nt_swapped_unit(jobs[i], call, u);
    else nt_unit(jobs[i], f, u);
  };
  // Many NT jobs (MoE experts): whole jobs per thread, so a job's A^T is packed once and each
  // tile's prefetch of the next one (nt_swapped.cpp) feeds the same thread, across units too.
  if (f == WForm::nt && count >= 8 * int64_t(num_threads())) {
    parallel_for_dynamic(count, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        for (int64_t u = 0; u < first[size_t(i) + 1] - first[size_t(i)]; ++u) run(i, u);
    });
    return;
  }
  parallel_for_dynamic(first.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t i = int64_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1;
      run(i, u - first[size_t(i)]);
    }
  });
}

}  // namespace

void detail::store_tile(const float* tile, int64_t ldt, int rows, int width, void* c, DType cdt, int64_t ldc, bool acc) {
  if (cpu::has(cpu::Isa::avx512)) { store_tile_avx512(tile, ldt, rows, width, c, cdt, ldc, acc); return; }
  if (cpu::has(cpu::Isa::avx2)) { store_tile_avx2(tile, ldt, rows, width, c, cdt, ldc, acc); return; }
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

void grouped_gemm_nt(const NtJob* jobs, int64_t count) { run_nt_form(jobs, count, WForm::nt); }
void grouped_gemm_nn(const NtJob* jobs, int64_t count) { run_nt_form(jobs, count, WForm::nn); }

}  // namespace ot::gemm
