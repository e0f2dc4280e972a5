// Internals of the matrix engine shared by packing, drivers, micro-kernels and epilogues.
//
// B is stored as column panels of kNR = 48 columns (three 16-float zmm registers). Inside a panel
// the layout depends on the micro-kernel family chosen at pack time:
//   f32:       [Kp][48] fp32                       (AVX-512 / AVX2 FMA, scalar)
//   bf16_vnni: [Kp/2][48][2] bf16, k-pairs interleaved  (vdpbf16ps, AMX tiles, AVX2 widening; Kp % 32 == 0)
// Panels are padded with zeros (columns past the edge, k past K), so kernels never see a tail.
// When N is even the panels of the two column halves are interleaved (g0, u0, g1, u1, ...): the
// SwiGLU epilogue then finds the gate and up tiles of the same output columns side by side.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ot/cpu.h"
#include "ot/gemm.h"
#include "ot/workspace.h"

namespace ot::gemm::detail {

// Grow-only scratch, kept per thread across calls (no allocation per call once warm).
struct Buf {
  AlignedPtr<char> p;
  size_t cap = 0;
  char* get(size_t bytes) {
    if (bytes > cap) { p = make_aligned<char>(bytes); cap = bytes; }
    return p.get();
  }
};

// Memory of packed weights. Large packings live on transparent huge pages (2 MiB aligned, length
// rounded up to whole huge pages when that wastes at most 1/8): MoE decode and small-M prefill
// stream gigabytes of weights once per call, and with 4 KiB pages every 4 KiB of the stream is a
// TLB miss (a two-level walk under virtualisation) that also stops the hardware prefetcher.
class WeightMem {
 public:
  WeightMem() = default;
  explicit WeightMem(size_t bytes);
  WeightMem(WeightMem&& o) noexcept { *this = std::move(o); }
  WeightMem& operator=(WeightMem&& o) noexcept;
  ~WeightMem();
  char* get() const { return p_; }

 private:
  void release();
  char* p_ = nullptr;
  size_t len_ = 0;   // mapped length (0: heap allocation)
};

inline constexpr int kNR = 48;

enum class Layout : uint8_t { f32, bf16_vnni };
inline size_t layout_elt(Layout l) { return l == Layout::f32 ? 4 : 2; }
inline int64_t pad_k(Layout l, int64_t K) { return l == Layout::f32 ? K : (K + 31) / 32 * 32; }

// Non-owning description of packed B (owned by PackedB::Impl or by a matmul's scratch).
struct Panels {
  const char* data = nullptr;
  Layout layout = Layout::f32;
  int64_t K = 0, Kp = 0, N = 0;
  bool split = false;  // halves interleaved (N even)
  int64_t npanels = 0;
  size_t panel_bytes() const { return size_t(Kp) * kNR * layout_elt(layout); }
  const char* panel(int64_t p) const { return data + size_t(p) * panel_bytes(); }
  // First column of B held by panel p and how many of its 48 columns are real.
  void cols(int64_t p, int64_t* col0, int* width) const {
    int64_t span = split ? N / 2 : N, base = 0, i = p;
    if (split) { base = (p & 1) * span; i = p >> 1; }
    *col0 = base + i * kNR;
    int64_t w = span - i * kNR;
    *width = int(w < kNR ? w : kNR);
  }
};
int64_t panel_count(int64_t N, bool split);

// Packs panels [p0, p1) of a strided B (element (k, n) at data + k*rs + n*cs) into `dst` (the
// start of panel 0; every byte of those panels is written, padding included).
void pack_b(const void* data, DType dt, int64_t rs, int64_t cs, const Panels& geom, char* dst, int64_t p0, int64_t p1);
// Inverse of pack_b into fp32 [K][N] (for the reference route of packed weights).
void unpack_b(const Panels& geom, float* dst);

// Micro-kernel: C tile[mr][48] (fp32, row stride ldc) (+)= A[mr][kc] x Bpanel[kc][48].
// a: packed row-major A (fp32 or bf16 by layout), row stride lda elements; b: panel data at k.
// kc is a multiple of 2 (vnni) or 32 (AMX). load_c: accumulate onto the tile instead of overwriting.
using KernelFn = void (*)(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
// The same product on zmm columns [j0, j0+nz) of the panel only (16 columns each; b and c at the
// panel / tile start): a partial last panel, or a panel shared by two threads of a column split.
using KernelColsFn = void (*)(int mr, int j0, int nz, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
struct Kernel {
  KernelFn fn = nullptr;  // A in B's layout; null where the kernel takes only fp32 A (fn_f32a)
  int mr = 8;            // rows per call (AMX: 32, and the A block is zero-padded to it)
  int64_t kc = 256;      // K block that keeps a B panel chunk in L1
  bool pad_rows = false; // the kernel always computes mr rows
  const char* name = "scalar";
  // Decode (a row block of <= kDecodeRows rows, one tile over whole panels), when set: runs n panels
  // at once (the driver passes a unit's panels, up to 16 a call), tiles[i] (row stride ldc) = A x panels[i].
  void (*decode)(int mr, int64_t kc, const void* a, int64_t lda, const char* const* panels, float* const* tiles, int n, int64_t ldc) = nullptr;
  KernelColsFn cols = nullptr;  // column subset of fn (of fn_f32a when that is set), when set (else fn computes the whole panel)
  // Row tiles of mr rows and one shorter last tile, instead of balanced heights (the AVX2 bf16
  // kernel: its 4-row groups are fast, its 3- and 2-row ones latency-bound; see kernel_avx2_bf16).
  bool full_tiles = false;
  // When set: fn on A packed as fp32 (B still in its layout), which every caller then packs, except
  // for decode row blocks (the AVX2 bf16 kernel broadcasts fp32 A rows instead of widening them per
  // call; the widening kernel has no other entry).
  KernelFn fn_f32a = nullptr;
  // fn_f32a that, instead of its own prefetch a fixed distance ahead, spreads `pf_lines` cache-line
  // prefetches (into L2) from `pf` over its k loop: the driver gives each row tile of a K chunk its
  // share of the next chunk, so the weight stream is fetched evenly across the tiles that reuse it.
  void (*fn_f32a_spread)(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c, const char* pf,
                         int64_t pf_lines) = nullptr;
};
constexpr int kDecodeRows = 3;  // the most rows the decode kernel serves
// Row blocks of up to this many rows (0..kDecodeRows; knob gemm.decode_rows, default kDecodeRows)
// stream on the decode kernel; read once per call.
int decode_rows();
// Far prefetch distance, in k pairs (0: none), of the kernels that stream whole panels (the decode
// pair tile and single-tile row blocks of the widening kernel): besides their near prefetch into
// L1 they fetch the panel this far ahead into L2 (knob gemm.far_pf; by default 128 pairs = 24 KiB on
// Intel, 0 elsewhere). Read once per kernel call.
int64_t far_prefetch_pairs();
// The kernel for a layout under the active ISA cap (M lets decode-sized calls avoid AMX).
Kernel select_kernel(Layout layout, int64_t M);
// Whether bf16 panels run on vdpbf16ps (else the widening kernel): knob gemm.bf16_kernel, by default
// the measured vdpbf16ps / FMA flop ratio (rate_loops.h; Intel without AMX: no; AMD Zen 4/5: yes).
bool bf16_dot_preferred();
Layout layout_for(DType a, DType b);  // what prepack/matmul pack into under the active ISA

// Calls f(std::integral_constant<int, R>{}) with R = mr (1..8; larger -> 8): the register-tile
// kernels are templates on their row count.
template <class F> inline void with_mr(int mr, F&& f) {
  switch (mr) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// The AVX2 kernels' row split (16 ymm registers hold at most 4 rows of accumulators): an mr-row
// tile (mr <= 8) as at most two balanced groups of <= 4 rows (8 = 4 + 4, 5 = 3 + 2), or with
// fours_first a group of 4 and the rest (5 = 4 + 1); f(std::integral_constant<int, R>{}, first_row)
// for each group.
template <class F> inline void in_row_groups_of_4(int mr, F&& f, bool fours_first = false) {
  auto group = [&](int rows, int first) {
    switch (rows) {
      case 1: f(std::integral_constant<int, 1>{}, first); break;
      case 2: f(std::integral_constant<int, 2>{}, first); break;
      case 3: f(std::integral_constant<int, 3>{}, first); break;
      default: f(std::integral_constant<int, 4>{}, first); break;
    }
  };
  const int r0 = mr <= 4 ? mr : fours_first ? 4 : (mr + 1) / 2;  // the second group has mr - r0 (<= r0) rows
  group(r0, 0);
  if (mr > r0) group(mr - r0, r0);
}

void kernel_scalar_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_scalar_vnni(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_avx2_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_avx512_f32(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_avx2_bf16_f32a(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);  // fp32 A
void kernel_avx2_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_avx512_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_avx512_bf16_cols(int mr, int j0, int nz, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
void kernel_decode_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);  // mr <= 2 streamed
void kernel_decode_panels_bf16(int mr, int64_t kc, const void* a, int64_t lda, const char* const* panels, float* const* tiles, int n, int64_t ldc);
void kernel_decode_panels_avx2_bf16(int mr, int64_t kc, const void* a, int64_t lda, const char* const* panels, float* const* tiles, int n,
                                    int64_t ldc);
void kernel_avx512_bf16_widen_f32a(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);  // fp32 A
void kernel_avx512_bf16_widen_f32a_spread(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c,
                                          const char* pf, int64_t pf_lines);
void kernel_avx512_bf16_widen_f32a_cols(int mr, int j0, int nz, int64_t kc, const void* a, int64_t lda, const void* b, float* c,
                                        int64_t ldc, bool load_c);
void kernel_amx_bf16(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);
// The same kernel on the software model of the tile unit (amx_emulator.h; knob gemm.amx_emulate).
void kernel_amx_bf16_emulated(int mr, int64_t kc, const void* a, int64_t lda, const void* b, float* c, int64_t ldc, bool load_c);

// Everything the epilogue needs: out = alpha*a_scale*acc (+bias) -> act -> *row_scale -> (+ beta*C).
struct EpiArgs {
  const float* a_scale = nullptr;  // quantised A: acc of logical row m is scaled by a_scale[a_rows ? a_rows[m] : m]
  const int32_t* a_rows = nullptr;
  const float* bias = nullptr;
  Act act = Act::none;
  const float* row_scale = nullptr;
  const int32_t* scatter_rows = nullptr;
  float alpha = 1.f, beta = 0.f;  // beta == 0: C is not read
  void* c = nullptr;
  DType c_dtype = DType::f32;
  int64_t ldc = 0, csc = 1;
};
// One output block: rows [m0, m0+rows) of the logical M, tile t (and u = up tile for SwiGLU) with
// row stride ldt, written to output columns [col0, col0+width); bias read at bcol (gate) / ucol (up).
struct EpiBlock {
  int64_t m0 = 0;
  int rows = 0;
  const float* t = nullptr;
  const float* u = nullptr;
  int64_t ldt = 0;
  int64_t col0 = 0, bcol = 0, ucol = 0;
  int width = 0;
};
// The accumulator multiplier of logical row m: alpha times the quantised A row's scale.
inline float acc_scale(const EpiArgs& e, int64_t m) {
  return e.a_scale ? e.alpha * e.a_scale[e.a_rows ? e.a_rows[m] : m] : e.alpha;
}
void epilogue_scalar(const EpiArgs& e, const EpiBlock& b);
void epilogue_avx2(const EpiArgs& e, const EpiBlock& b);
void epilogue_avx512(const EpiArgs& e, const EpiBlock& b);
// Prefetches (into L2) the C elements that rows [m0, m0+rows) x columns [col0, col0+width) of an
// epilogue will read (through scatter_rows when set).
void prefetch_c(const EpiArgs& e, int64_t m0, int rows, int64_t col0, int width);

// Packs rows [m0, m0+mc) of the logical A (row i at a.data + (rows ? rows[i] : i)*rs, columns by cs)
// into row-major fp32 or bf16 with row stride lda (>= K, zero padding up to lda; rows up to mc_pad).
// i8 sources convert exactly (every int8 is a bf16); their scale is applied by the epilogue.
struct ASource {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rs = 0, cs = 1;
  const int32_t* rows = nullptr;
};
void pack_a(const ASource& a, int64_t m0, int64_t mc, int64_t mc_pad, int64_t K, Layout layout, void* dst, int64_t lda);

// One GEMM job for the drivers.
struct Job {
  int64_t M = 0;
  ASource a;
  Panels b;
  EpiArgs epi;
  bool swiglu = false;
};
// Runs jobs over threads. race_free: jobs may write the same C elements (scatter-accumulate), so
// output columns are split between threads instead of rows (at 16-column granularity when the
// kernel computes column subsets and the rows are not decode-sized). Runs inline inside a parallel region.
void run_jobs(const Job* jobs, int64_t count, bool race_free);
// first[j] then second[j] for every j, where second[j] reads what first[j] writes (an expert's
// gate/up then its down GEMM), in one parallel region without a barrier between the stages: a thread
// out of first-stage units starts its second-stage work on the jobs whose first stage is done.
// race_free applies to the second jobs (the first ones must not overlap in C).
void run_job_chain(const Job* first, const Job* second, int64_t count, bool race_free);

}  // namespace ot::gemm::detail
