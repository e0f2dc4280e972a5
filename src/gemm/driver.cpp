// The blocked GEMM driver shared by gemm, grouped_gemm and matmul.
//
// Work is cut into units = (job, block of MC rows, block of output column blocks). A unit packs its
// A rows once (full K, kernel dtype), then for each K block of KC (a B panel chunk stays in L1 while
// the MR-row micro-tiles sweep over it) accumulates an fp32 tile buffer, and finally runs the fused
// epilogue per output block. Units are handed out dynamically; with scatter-accumulate they are
// assigned by output columns so no two threads ever write the same C element.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/parallel.h"
#include "ot/workspace.h"
#include "src/core/knobs.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {

knobs::Knob g_bf16_kernel("gemm.bf16_kernel", 0, 0, 2,
                          "bf16 panels on AVX-512 BF16: 0 = by the CPU (vendor, or OT_BF16_KERNEL), 1 = vdpbf16ps, 2 = widen to fp32 FMAs");
knobs::Knob g_spread_pf("gemm.spread_pf", 1, 0, 1, "row tiles of a K chunk prefetch shares of the next chunk (1) or the kernel's own distance (0)");
// L1 prefetches are bounded by the core's few fill buffers, so a near prefetch alone keeps about 16
// lines in flight, short of one core's share of DRAM bandwidth: an L2 prefetch further ahead
// raises that (Intel Emerald Rapids VM, 2026-12-02: moe_ffn T1 b/a 0.86-0.90 with the near one
// kept, 1.10-1.14 without it; 64 and 256 pairs no better). Not measured on AMD: off there.
knobs::Knob g_far_pf("gemm.far_pf", cpu::features().intel ? 128 : 0, 0, 1024,
                     "streaming kernels (decode pair tile, single-tile widening blocks): L2 prefetch this many k pairs ahead (0 = none)");
// The AMX kernel's path on the software model of the tile unit (amx_emulator.h), for the tests on
// machines without AMX (none of this project's has exposed it): the driver, packing and kernel of
// AMX machines, checked here. ~1000x slower than the tiles.
knobs::Knob g_amx_emulate("gemm.amx_emulate", 0, 0, 1, "1: row blocks the AMX kernel would take run it on the software model of the tile unit (tests)");
knobs::Knob g_decode_rows("gemm.decode_rows", kDecodeRows, 0, kDecodeRows,
                          "row blocks of up to this many rows stream on the decode kernel (larger ones: the 8x48 kernel)");

// Rows per unit: at most kMC, in equal blocks (a multiple of the kernel's row step): 139 rows run
// as one block, 300 as 152 + 148, not 128 + 128 + 44. A tail block of a few rows re-streams
// the whole weight for little work at a fraction of the 8-row tile's rate (MoE experts near 128
// rows, e.g. Mixtral at T 512 with 128 +- 11 rows per expert: 2-4% of the layer).
constexpr int64_t kMC = 160;

struct Scratch {
  Buf a, c;
  const void* packed_job = nullptr;  // which (call, job, row block) the A buffer holds
  uint64_t packed_call = 0;
  int64_t packed_mb = -1;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
std::atomic<uint64_t> g_call{1};

int64_t lda_for(Layout l, int64_t Kp) {
  size_t bytes = size_t(Kp) * layout_elt(l);
  return bytes % 1024 == 0 ? Kp + 64 / int64_t(layout_elt(l)) : Kp;  // avoid cache-set aliasing between rows
}

struct JobPlan {
  Kernel k;
  int64_t mc = 0, nmb = 0, nob = 0, nub = 0, units = 0;
  int ppb = 1;  // panels per output block (2 for SwiGLU)
  int decode_rows = kDecodeRows;  // decode_rows() of the call
};

bool rmw_c(const Job& job) { return job.epi.beta != 0.f && job.epi.csc == 1; }

constexpr int kZ = kNR / 16;  // zmm columns per panel

// Real (non-padding) zmm columns of output block ob.
int real_zmm(const Panels& B, const JobPlan& pl, int64_t ob) {
  int64_t col0;
  int width;
  B.cols(ob * pl.ppb, &col0, &width);
  return width <= 0 ? 0 : (width + 15) / 16;
}

// Rows block mb of the job, output blocks [ob0, ob1), of which only the zmm columns with global
// index (kZ * ob + j) in [z0, z1) (a thread's share of a column split; default: all of them).
void run_unit(const Job& job, const JobPlan& pl, int64_t mb, int64_t ob0, int64_t ob1, uint64_t call, int64_t z0 = 0,
              int64_t z1 = INT64_MAX) {
  const Kernel& K = pl.k;
  const Panels& B = job.b;
  const size_t elt = layout_elt(B.layout);
  int64_t m0 = mb * pl.mc, mc = std::min(pl.mc, job.M - m0);
  int64_t mc_pad = K.pad_rows ? (mc + K.mr - 1) / K.mr * K.mr : mc;
  const bool dec = mc_pad <= pl.decode_rows && K.decode;
  const bool f32a = K.fn_f32a && !dec;
  const Layout al = f32a ? Layout::f32 : B.layout;  // A's packing
  const size_t aelt = layout_elt(al);
  int64_t lda = lda_for(al, B.Kp);
  Scratch& s = scratch();
  char* abuf = s.a.get(size_t(mc_pad * lda) * aelt + 64);
  if (s.packed_call != call || s.packed_job != &job || s.packed_mb != mb) {
    pack_a(job.a, m0, mc, mc_pad, B.K, al, abuf, lda);
    s.packed_call = call, s.packed_job = &job, s.packed_mb = mb;
  }
  const int64_t ldt = pl.ppb * kNR;  // one output block's tile (gate + up panels for SwiGLU)
  // Decode (a row block of a few rows, in any call): the unit's panels stream first, up to 16 at a
  // time (two side by side, kernel_decode_panels), one tile per output block, then the epilogues run.
  const int64_t tsz = mc_pad * ldt;
  float* cbuf = reinterpret_cast<float*>(s.c.get(size_t(tsz * (dec ? ob1 - ob0 : 1)) * 4));
  if (dec) {
    constexpr int kMaxPanels = 16;
    const char* pp[kMaxPanels];
    float* tp[kMaxPanels];
    int n = 0;
    for (int64_t ob = ob0; ob < ob1; ++ob) {
      int64_t col0;
      int width;
      B.cols(ob * pl.ppb, &col0, &width);
      if (width <= 0) continue;
      if (n + pl.ppb > kMaxPanels) K.decode(int(mc_pad), std::max<int64_t>(B.Kp, 1), abuf, lda, pp, tp, n, ldt), n = 0;
      if (rmw_c(job)) prefetch_c(job.epi, m0, int(mc), col0, width);
      for (int64_t q = 0; q < pl.ppb; ++q, ++n) pp[n] = B.panel(ob * pl.ppb + q), tp[n] = cbuf + (ob - ob0) * tsz + q * kNR;
    }
    K.decode(int(mc_pad), std::max<int64_t>(B.Kp, 1), abuf, lda, pp, tp, n, ldt);
  }
  // One micro-tile row block: no reuse of a B chunk across tiles, so stream whole panels.
  const int64_t kc = mc_pad <= K.mr ? std::max<int64_t>(B.Kp, 1) : K.kc;
  const KernelFn fn = f32a ? K.fn_f32a : K.fn;
  // Row tiles of balanced height (25 rows -> 7+6+6+6, not 8+8+8+1): a 1-3 row tile has too few
  // independent accumulator chains to hide the dot product's latency and runs at a fraction of
  // the 8-row tile's rate (MoE experts get ~32 +- 6 rows at Qwen3 T512: +8-13% on M = 25).
  // (Not the AVX2 bf16 kernel: full_tiles, its groups of 4 rows are what run fast.)
  const int64_t ntile = (mc_pad + K.mr - 1) / K.mr;
  const bool bal = !K.pad_rows && !K.full_tiles;
  const bool spread = f32a && K.fn_f32a_spread && ntile >= 2 && g_spread_pf.get();
  // The vector epilogues need unit column stride.
  void (*const epilogue)(const EpiArgs&, const EpiBlock&) = job.epi.csc != 1 ? epilogue_scalar
                                                          : cpu::has(cpu::Isa::avx512) ? epilogue_avx512
                                                          : cpu::has(cpu::Isa::avx2) ? epilogue_avx2
                                                                                     : epilogue_scalar;
  // The epilogue reads C (accumulate: the down GEMM's weighted scatter-add into token rows, which
  // are scattered and not in cache): fetch the block's C lines into L2 before its panels run, so
  // the read-modify-write does not wait on memory (it was ~80% of the epilogue's time).
  const bool rmw = rmw_c(job);
  // Panel-major: the unit's B panels are adjacent in memory and each is read front to back, so
  // the weights stream from DRAM as one sequential run the hardware prefetcher follows (a K-block-
  // major order jumps by a whole panel between chunks and restarts a stream each time: 30-40%
  // slower at M = 32 rows per expert, where each weight byte serves only 32 rows). Each output
  // block's epilogue runs as soon as its panels are done, on a tile that is still in L1/L2.
  for (int64_t ob = ob0; ob < ob1; ++ob) {
    int64_t col0;
    int width;
    B.cols(ob * pl.ppb, &col0, &width);
    if (width <= 0) continue;  // padding block of an odd split
    // This unit's zmm columns [j0, j1) of the block; a partial panel computes only its real ones
    // (the decode kernel computes whole panels: only the epilogue is restricted).
    const int j0 = int(std::clamp<int64_t>(z0 - kZ * ob, 0, kZ)), j1 = int(std::clamp<int64_t>(z1 - kZ * ob, 0, (width + 15) / 16));
    if (j1 <= j0) continue;
    const bool sub = (j0 > 0 || j1 < kZ) && K.cols;
    const int ec0 = 16 * j0, ew = std::min(width, 16 * j1) - ec0;  // the epilogue's columns within the block
    if (rmw && !dec) prefetch_c(job.epi, m0, int(mc), col0 + ec0, ew);
    for (int64_t q = 0; q < pl.ppb && !dec; ++q) {
      const char* panel = B.panel(ob * pl.ppb + q);
      for (int64_t pc = 0; pc < B.Kp || pc == 0; pc += kc) {
        int64_t kcur = std::min(kc, B.Kp - pc);
        const char* bp = panel + size_t(pc) * kNR * elt;
        // The next K chunk: this panel's, or the first of the next panel (a unit's panels are adjacent).
        const char* next = bp + size_t(kcur) * kNR * elt;
        const int64_t next_lines = int64_t((pc + kcur < B.Kp ? std::min(kc, B.Kp - pc - kcur) : std::min(kc, B.Kp)) * kNR * elt / 64);
        for (int64_t it = 0, ir = 0; it < ntile; ++it) {
          int rows = bal ? int(mc_pad / ntile + (it < mc_pad % ntile)) : int(std::min<int64_t>(K.mr, mc_pad - ir));
          const char* ap = abuf + size_t(ir * lda + pc) * aelt;
          float* ct = cbuf + ir * ldt + q * kNR;
          if (sub) {
            K.cols(rows, j0, j1 - j0, kcur, ap, lda, bp, ct, ldt, pc > 0);
          } else if (spread) {
            const int64_t l0 = next_lines * it / ntile, l1 = next_lines * (it + 1) / ntile;
            K.fn_f32a_spread(rows, kcur, ap, lda, bp, ct, ldt, pc > 0, next + 64 * l0, l1 - l0);
          } else {
            fn(rows, kcur, ap, lda, bp, ct, ldt, pc > 0);
          }
          ir += rows;
        }
      }
    }
    EpiBlock eb;
    eb.m0 = m0;
    eb.rows = int(mc);
    eb.ldt = ldt;
    eb.t = cbuf + (dec ? (ob - ob0) * tsz : 0) + ec0;
    eb.col0 = eb.bcol = col0 + ec0;
    eb.width = ew;
    if (job.swiglu) {
      int64_t ucol;
      int uw;
      B.cols(ob * 2 + 1, &ucol, &uw);
      eb.u = eb.t + kNR;
      eb.ucol = ucol + ec0;
    }
    epilogue(job.epi, eb);
  }
}

}  // namespace

int decode_rows() { return int(g_decode_rows.get()); }
int64_t far_prefetch_pairs() { return g_far_pf.get(); }

// The bf16 multiplier on AVX-512 BF16 CPUs is decided by the CPU's vendor, never timed inside a
// call: it sets the rounding of every bf16 product, so one program on one machine must pick the same
// kernel run after run. Intel's cores (AMX not exposed) run vdpbf16ps at half the fp32 FMA flop rate
// (Emerald Rapids VM: 177 vs 356 GFLOP/s, `ot peak`, 2 threads): widen to fp32 FMAs there. AMD's
// Zen 4 / Zen 5 run it at least at the FMA rate (Zen 5 VM: 890-983 GFLOP/s, the faster kernel):
// vdpbf16ps. OT_BF16_KERNEL=dot|widen overrides; `ot peak` times both and says when they disagree.
bool bf16_dot_by_cpu() {
  if (const char* s = std::getenv("OT_BF16_KERNEL")) {
    const std::string v(s);
    if (v == "dot") return true;
    if (v == "widen") return false;
    OT_CHECK(v.empty(), "environment", "OT_BF16_KERNEL", "dot or widen (the bf16 multiplier on AVX-512 BF16)", "'", v, "'");
  }
  return !cpu::features().intel;
}

bool bf16_dot_preferred() {
  switch (g_bf16_kernel.get()) {
    case 1: return true;
    case 2: return false;
    default: {
      static const bool dot = cpu::has(cpu::Isa::avx512_bf16) && bf16_dot_by_cpu();
      return dot;
    }
  }
}

Layout layout_for(DType a, DType b) {
  // AVX2 has no bf16 dot product but widens vnni pairs in registers: bf16 weights stay half the bytes.
  return a == DType::bf16 && b == DType::bf16 && cpu::has(cpu::Isa::avx2) ? Layout::bf16_vnni : Layout::f32;
}

Kernel select_kernel(Layout layout, int64_t M) {
  const bool decode = M <= decode_rows();
  if (layout == Layout::bf16_vnni) {
    if (g_amx_emulate.get() && M >= 16) return {.fn = kernel_amx_bf16_emulated, .mr = 32, .kc = 512, .pad_rows = true, .name = "amx_bf16_emulated"};
    if (cpu::has(cpu::Isa::amx) && M >= 16) return {.fn = kernel_amx_bf16, .mr = 32, .kc = 512, .pad_rows = true, .name = "amx_bf16"};
    const bool dot = cpu::has(cpu::Isa::avx512_bf16);
    // 18 KiB B chunk + 4 A tiles fit L1; row blocks of <= kDecodeRows rows (all when M is) stream on the decode kernel.
    if (dot && bf16_dot_preferred())
      return {.fn = kernel_avx512_bf16, .mr = 8, .kc = 192, .name = decode ? "avx512_bf16_decode" : "avx512_bf16",
              .decode = kernel_decode_panels_bf16, .cols = kernel_avx512_bf16_cols};
    // vdpbf16ps at half the FMA flop rate (or absent): widen to fp32 FMAs on fp32 A rows, the same
    // 18 KiB B chunk. Decode row blocks are bound by the weight stream, not the multiplier: they keep
    // the vdpbf16ps decode kernel where there is one.
    if (cpu::has(cpu::Isa::avx512))
      return {.fn = nullptr,  // fp32-A entries only (fn_f32a): A is packed as fp32
              .mr = 8,
              .kc = 192,
              .name = decode ? (dot ? "avx512_bf16_decode" : "avx2_bf16_decode") : "avx512_bf16_widen",
              .decode = dot ? kernel_decode_panels_bf16 : kernel_decode_panels_avx2_bf16,
              .cols = kernel_avx512_bf16_widen_f32a_cols,
              .fn_f32a = kernel_avx512_bf16_widen_f32a,
              .fn_f32a_spread = kernel_avx512_bf16_widen_f32a_spread};
    // 24 KiB B chunk (128 pairs x 96 bf16) fits a 32 KiB L1 with the A rows; row blocks of <= kDecodeRows
    // rows stream on the AVX2 decode kernel (two panels side by side).
    if (cpu::has(cpu::Isa::avx2))
      return {.fn = kernel_avx2_bf16, .mr = 8, .kc = 256, .name = decode ? "avx2_bf16_decode" : "avx2_bf16",
              .decode = kernel_decode_panels_avx2_bf16, .full_tiles = true, .fn_f32a = kernel_avx2_bf16_f32a};
    return {.fn = kernel_scalar_vnni, .mr = 8, .kc = 256, .name = "scalar"};
  }
  if (cpu::has(cpu::Isa::avx512)) return {.fn = kernel_avx512_f32, .mr = 8, .kc = 384, .name = "avx512_f32"};
  // A 24-column half of a 128-deep chunk (12 KiB) is what the 4-row groups sweep: both halves fit a 32 KiB L1.
  if (cpu::has(cpu::Isa::avx2)) return {.fn = kernel_avx2_f32, .mr = 8, .kc = 128, .name = "avx2_f32"};
  return {.fn = kernel_scalar_f32, .mr = 8, .kc = 256, .name = "scalar"};
}

namespace {

// A job list cut into units (see run_jobs), and for race-free calls each thread's column share.
struct Schedule {
  const Job* jobs = nullptr;
  int64_t count = 0, nb = 0, total = 0;
  std::vector<JobPlan> plans;
  std::vector<int64_t> first;   // first unit of each job
  std::vector<int64_t> zstart;  // race-free: zmm columns of real output before block ob
  bool race_free = false, same = true, fine = false;
  bool tiny = false;  // small enough for the calling thread alone (see plan)
  uint64_t call = 0;

  void plan(const Job* js, int64_t n, bool rf) {
    jobs = js, count = n, race_free = rf, same = true, fine = false;
    plans.assign(size_t(count), {});
    first.assign(size_t(count) + 1, 0);
    const int T = num_threads();
    int64_t rows = 0;
    double flops = 0, bbytes = 0;
    for (int64_t j = 0; j < count; ++j) {
      rows += jobs[j].M;
      flops += 2.0 * double(jobs[j].M) * double(jobs[j].b.N) * double(jobs[j].b.K);
      bbytes += double(jobs[j].b.Kp) * double(jobs[j].b.N) * double(layout_elt(jobs[j].b.layout));
    }
    // Waking the other threads costs ~3-5 us: a call below ~1 MFLOP and 256 KiB of weights (a
    // router's logits, a small model's decode step) is faster on the calling thread alone.
    tiny = flops <= 1e6 && bbytes <= 256.0 * 1024;
    const int drows = decode_rows();
    const bool prefill = rows > kDecodeRows * count;  // more rows per job on average than a decode-sized block
    // Output blocks per unit: a job's whole row block when that still gives >= 32 units per thread
    // (prefill of many experts: one thread packs an expert's gathered A rows once, where 8-panel
    // units had both threads pack every expert: Qwen3 T512 gate_up -2%), else 8 panels, fewer when
    // that leaves threads idle.
    auto plan_with = [&](int64_t nbv) {
      int64_t sum = 0;
      for (int64_t j = 0; j < count; ++j) {
        const Job& job = jobs[j];
        JobPlan& pl = plans[size_t(j)];
        pl.k = select_kernel(job.b.layout, job.M);
        pl.ppb = job.swiglu ? 2 : 1;
        pl.decode_rows = drows;
        pl.nob = job.b.npanels / pl.ppb;
        pl.nmb = job.M > 0 ? (job.M + kMC - 1) / kMC : 0;
        const int64_t step = pl.k.pad_rows ? pl.k.mr : 8;
        pl.mc = pl.nmb > 0 ? ((job.M + pl.nmb - 1) / pl.nmb + step - 1) / step * step : 0;
        pl.nmb = pl.mc > 0 ? (job.M + pl.mc - 1) / pl.mc : 0;  // rounding up can leave fewer blocks
        int64_t nbj = std::max<int64_t>(1, nbv / pl.ppb);
        pl.nub = (pl.nob + nbj - 1) / nbj;
        pl.units = pl.nmb * pl.nub;
        sum += pl.units;
      }
      return sum;
    };
    constexpr int64_t kWhole = int64_t(1) << 40;
    nb = kWhole;
    if (!(prefill && plan_with(kWhole) >= 32 * T))
      for (nb = 8; plan_with(nb) < 4 * T && nb > 1;) nb /= 2;
    for (int64_t j = 0; j < count; ++j) first[size_t(j) + 1] = first[size_t(j)] + plans[size_t(j)].units;
    total = first[size_t(count)];
    call = g_call.fetch_add(1, std::memory_order_relaxed);
    if (!race_free || total == 0) return;
    // Race-free: every job must map output blocks to the same columns, else run on one thread.
    same = true;
    for (int64_t j = 1; j < count; ++j) {
      const Job &a = jobs[0], &b = jobs[j];
      same = same && a.b.N == b.b.N && a.b.split == b.b.split && a.swiglu == b.swiglu && plans[0].nub == plans[size_t(j)].nub;
    }
    if (!same) return;
    // Each thread owns an equal share of the output columns and runs every job's rows on them in
    // order. Shares are whole zmm columns (16) of real output when the kernel computes column
    // subsets: N 2048 (44 panels, two of them 16 columns wide) is 64 + 64 zmm columns, where whole
    // blocks computed 22 + 22 panels (66 zmm each, 4 of them padding). Decode-sized calls (<= kDecodeRows
    // rows per job on average: the streaming kernel reads whole panels) keep whole blocks.
    // Only where that shortens the longest share by >= 2 zmm columns (Qwen3's N 2048: 66 -> 64);
    // Mixtral's N 4096 is 129 / 127 by blocks, and its 16-column split measured slower there.
    const JobPlan& p0 = plans[0];
    zstart.assign(size_t(p0.nob) + 1, 0);
    for (int64_t ob = 0; ob < p0.nob; ++ob) zstart[size_t(ob) + 1] = zstart[size_t(ob)] + real_zmm(jobs[0].b, p0, ob);
    int64_t block_max = 0;
    for (int t = 0; t < T; ++t) {
      const int64_t b0 = p0.nob * t / T, b1 = p0.nob * (t + 1) / T;
      block_max = std::max(block_max, zstart[size_t(b1)] - zstart[size_t(b0)]);
    }
    fine = p0.k.cols && prefill && block_max - (zstart.back() + T - 1) / T >= 2;
    if (!fine)
      for (int64_t ob = 0; ob <= p0.nob; ++ob) zstart[size_t(ob)] = ob;  // shares in whole blocks
  }

  int64_t job_of(int64_t u) const { return int64_t(std::upper_bound(first.begin(), first.end(), u) - first.begin()) - 1; }

  void unit(int64_t u) const {
    const int64_t j = job_of(u);
    const JobPlan& pl = plans[size_t(j)];
    int64_t r = u - first[size_t(j)], mb = r / pl.nub, ub = r % pl.nub, nbj = std::max<int64_t>(1, nb / pl.ppb);
    run_unit(jobs[j], pl, mb, ub * nbj, std::min(pl.nob, (ub + 1) * nbj), call);
  }

  // Race-free split: thread tid's share of the output as global zmm columns [z0, z1).
  void share(int tid, int nthreads, int64_t* z0, int64_t* z1) const {
    const int64_t nob = plans[0].nob, total_z = zstart.back();
    auto to_global = [&](int64_t r) {
      int64_t ob = int64_t(std::upper_bound(zstart.begin(), zstart.end(), r) - zstart.begin()) - 1;
      if (ob >= nob) return kZ * nob;
      return fine ? kZ * ob + (r - zstart[size_t(ob)]) : kZ * ob;
    };
    *z0 = to_global(total_z * tid / nthreads), *z1 = to_global(total_z * (tid + 1) / nthreads);
  }

  // Job j on the zmm columns [z0, z1) only.
  void job_share(int64_t j, int64_t z0, int64_t z1) const {
    const JobPlan& pl = plans[size_t(j)];
    const int64_t nbj = std::max<int64_t>(1, nb / pl.ppb), lo = z0 / kZ, hi = (z1 + kZ - 1) / kZ;
    for (int64_t mb = 0; mb < pl.nmb; ++mb)
      for (int64_t ob = lo; ob < hi; ob += nbj) run_unit(jobs[j], pl, mb, ob, std::min(hi, ob + nbj), call, z0, z1);
  }

  // Runs this schedule's share of thread tid. ready(j) blocks until job j may start (its inputs are
  // written); next: the shared unit counter of a dynamic schedule.
  template <class Ready>
  void run(int tid, int nthreads, std::atomic<int64_t>& next, Ready&& ready) const {
    if (!race_free) {
      for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < total;) ready(job_of(u)), unit(u);
    } else if (!same) {
      if (tid == 0)
        for (int64_t j = 0; j < count; ++j) {
          ready(j);
          for (int64_t u = first[size_t(j)]; u < first[size_t(j) + 1]; ++u) unit(u);
        }
    } else {
      int64_t z0, z1;
      share(tid, nthreads, &z0, &z1);
      for (int64_t j = 0; j < count; ++j) ready(j), job_share(j, z0, z1);
    }
  }
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void run_jobs(const Job* jobs, int64_t count, bool race_free) {
  thread_local Schedule sched_tl;
  Schedule& s = sched_tl;  // named reference: worker threads must see the caller's schedule, not their own thread_local
  s.plan(jobs, count, race_free);
  if (s.total == 0) return;
  std::atomic<int64_t> next{0};
  if (s.tiny) {
    s.run(0, 1, next, [](int64_t) {});
    return;
  }
  if (!race_free) {
    parallel_for_dynamic(s.total, 1, [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; ++u) s.unit(u);
    });
    return;
  }
  if (!s.same) {
    s.run(0, 1, next, [](int64_t) {});
    return;
  }
  parallel_region([&](int tid, int nthreads) { s.run(tid, nthreads, next, [](int64_t) {}); });
}

void run_job_chain(const Job* first, const Job* second, int64_t count, bool race_free) {
  thread_local Schedule s1_tl, s2_tl;
  thread_local std::unique_ptr<std::atomic<int64_t>[]> left_tl;
  thread_local int64_t left_cap = 0;
  Schedule &s1 = s1_tl, &s2 = s2_tl;
  s1.plan(first, count, false);
  s2.plan(second, count, race_free);
  if (count > left_cap) left_tl.reset(new std::atomic<int64_t>[size_t(count)]), left_cap = count;
  std::atomic<int64_t>* left = left_tl.get();  // units of first[j] not yet done
  for (int64_t j = 0; j < count; ++j) left[j].store(s1.plans[size_t(j)].units, std::memory_order_relaxed);
  if (s1.total + s2.total == 0) return;
  std::atomic<int64_t> next1{0}, next2{0};
  if (s1.tiny && s2.tiny) {
    s1.run(0, 1, next1, [](int64_t) {});
    s2.run(0, 1, next2, [](int64_t) {});
    return;
  }
  parallel_region([&](int tid, int nthreads) {
    // Stage 1: dynamic units; each finished unit counts down its job (release: its output is written).
    for (int64_t u; (u = next1.fetch_add(1, std::memory_order_relaxed)) < s1.total;) {
      s1.unit(u);
      left[s1.job_of(u)].fetch_sub(1, std::memory_order_release);
    }
    // Stage 2 without a barrier: every stage-1 unit has been taken, so job j's last units are running
    // on other threads and finish without waiting on anything; wait for them only where needed.
    if (s2.total > 0)
      s2.run(tid, nthreads, next2, [&](int64_t j) {
        while (left[j].load(std::memory_order_acquire) > 0) cpu_relax();
      });
  });
}

}  // namespace ot::gemm::detail
