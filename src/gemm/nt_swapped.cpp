// Driver of the swapped NT form (see nt_swapped.h). Per unit (job, 192 rows of W = 192 output
// columns): the job's A^T panel (packed once per job and thread, kept in L2) meets MR-row tiles
// of W read straight from memory over the whole K (each W byte is read once per call; the
// kernel prefetches each row's stream, the driver the next tile's first lines), into an fp32
// C^T buffer that is transposed into C at the end of the unit. The dot tail's rows (nt_split) are
// computed from the same W tile while it is still in cache and written straight into C.
#include "src/gemm/nt_swapped.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include <xmmintrin.h>

#include "src/core/elem_at.h"
#include "src/gemm/backward_forms.h"

namespace ot::gemm::detail {

namespace {

struct Scratch {
  Buf panel, tile;
  std::vector<const char*> rows;
  const uint16_t* tail[2][16];  // the dot tail's A rows at each K segment's start
  uint64_t call = 0;
  const NtJob* job = nullptr;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
std::atomic<uint64_t> g_call{1};

int64_t job_k(const NtJob& j) { return j.w[0].K + j.w[1].K; }

// W rows [n0, n0 + rows) of every segment into L2.
void prefetch_rows_l2(const NtJob& j, int64_t n0, int rows) {
  for (int s = 0; s < 2; ++s)
    for (int64_t n = n0; n < std::min(j.N, n0 + rows); ++n) {
      const char* w = row_at(j.w[s].data, DType::bf16, j.w[s].ld, n);
      for (int64_t b = 0; b < 2 * j.w[s].K; b += 64) _mm_prefetch(w + b, _MM_HINT_T1);
    }
}

}  // namespace

bool nt_swapped_fits(const NtJob& j) {
  return j.a.dtype == DType::bf16 && j.w_dtype == DType::bf16 && cpu::has(cpu::Isa::avx512_bf16) && j.M >= 1 && j.M <= kNtSwapMaxM &&
         j.w[0].K % 2 == 0 && j.w[1].K % 2 == 0 && job_k(j) > 0;
}

uint64_t nt_swapped_call() { return g_call.fetch_add(1, std::memory_order_relaxed); }

NtSplit nt_split(int64_t M) {
  int nz = int(M / 16), tail = int(M % 16);
  if (tail > kNtDotMaxTail) ++nz, tail = 0;
  return {nz, tail, nz ? nt_mr(nz) : kNtDotMR};
}

void nt_swapped_unit(const NtJob& j, uint64_t call, int64_t u) {
  const NtSplit sp = nt_split(j.M);
  const int nz = sp.nz, mr = sp.mr;
  const int width = 16 * nz;  // A^T panel and C^T tile row width
  const int64_t P = job_k(j) / 2;
  Scratch& s = scratch();
  auto* panel = reinterpret_cast<uint32_t*>(s.panel.p.get());
  if (s.call != call || s.job != &j) {  // A^T: dword (pair) p of row m at panel[p * width + m]
    s.rows.resize(size_t(j.M));
    for (int64_t m = 0; m < j.M; ++m)
      s.rows[size_t(m)] = row_at(j.a.data, DType::bf16, j.a.ld, j.a.rows ? j.a.rows[m] : m);
    for (int s2 = 0, p0 = 0; s2 < 2; p0 += int(j.w[s2].K / 2), ++s2)  // the dot tail reads its rows in place
      for (int i = 0; i < sp.tail; ++i) s.tail[s2][i] = reinterpret_cast<const uint16_t*>(s.rows[size_t(width + i)]) + 2 * p0;
    prefetch_rows_l2(j, u * kNtSwapNB, mr);  // the unit's first tile arrives while A^T is packed
    if (nz) {
      panel = reinterpret_cast<uint32_t*>(s.panel.get(size_t(P) * size_t(width) * 4));
      transpose_dword_rows_avx512(s.rows.data(), int(std::min<int64_t>(j.M, width)), P, panel, width);
    }
    s.call = call, s.job = &j;
  }
  const int64_t n0 = u * kNtSwapNB;
  const int nb = int(std::min(kNtSwapNB, j.N - n0));
  float* t = nz ? reinterpret_cast<float*>(s.tile.get(size_t(kNtSwapNB) * size_t(width) * 4)) : nullptr;
  const bool widen = !bf16_dot_preferred();
  for (int i = 0; i < nb; i += mr) {
    const int rows = std::min(mr, nb - i);
    // the next tile (the next unit's first one at the end of this unit) is fetched while this one runs
    const int64_t nx = n0 + i + rows;
    const int nrows = int(std::clamp<int64_t>(j.N - nx, 0, mr));
    bool load = false;
    NtDotSeg dot[2];
    int ndot = 0;
    for (int s2 = 0, p0 = 0; s2 < 2; p0 += int(j.w[s2].K / 2), ++s2) {
      const NtSegment& sg = j.w[s2];
      if (sg.K == 0) continue;
      const auto* w = static_cast<const uint16_t*>(sg.data);
      if (nz)
        kernel_nt_bf16_avx512bf16(rows, nz, sg.K / 2, w + (n0 + i) * sg.ld, sg.ld, reinterpret_cast<const uint16_t*>(panel + size_t(p0) * size_t(width)),
                                  t + size_t(i) * size_t(width), width, load, nrows ? w + nx * sg.ld : nullptr, nrows, widen);
      if (sp.tail) dot[ndot++] = {w + (n0 + i) * sg.ld, sg.ld, sg.K / 2, s.tail[s2]};
      load = true;
    }
    if (sp.tail)  // the tile's W rows are in L1/L2 now
      kernel_nt_dot_bf16_avx512bf16(rows, sp.tail, dot, ndot, j.c + width * j.ldc + n0 + i, j.ldc, j.accumulate);
  }
  if (nz) store_transposed_avx512(t, width, nb, int(j.M) - sp.tail, j.c + n0, j.ldc, j.accumulate);
}

}  // namespace ot::gemm::detail
