// SwiGLU FFNs over row spans for the training path (see ffn_bwd_common.h), on the weights as
// stored (NN forward, NT and TN backward: no weight is ever packed whole), with one vectorised
// SwiGLU pass between the projections. Two schedules (FfnSchedule): each projection one grouped
// engine call over all spans, or each span's whole chain on one thread.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "ot/gemm.h"
#include "ot/parallel.h"
#include "ot/workspace.h"
#include "src/core/elem_at.h"
#include "src/moe/bwd_common.h"
#include "src/moe/ffn_bwd_common.h"

namespace ot::moe::bwd {

namespace {

int64_t rows_of(const std::vector<Span>& spans) {
  int64_t n = 0;
  for (const Span& s : spans) n = std::max(n, s.offset + s.count);
  return n;
}

// C [n, N] (fp32, row stride ldc) (+)= A [n, K] x W (NN: W [K][N]) or A x W^T (NT: W [N][K]).
gemm::NtJob job(int64_t n, int64_t N, const void* a, DType dt, int64_t lda, const char* w, int64_t K, int64_t ldw, float* c, int64_t ldc,
                bool acc) {
  gemm::NtJob j;
  j.M = n;
  j.N = N;
  j.a = {a, dt, lda, nullptr};
  j.w_dtype = dt;
  j.w[0] = {w, K, ldw};
  j.c = c;
  j.ldc = ldc;
  j.accumulate = acc;
  return j;
}

// Rows [row0, row0 + rows) of an [A, H] row operand: the rows themselves, or (gather) copied from
// their source rows into per-thread scratch `slot` -- in the expert-major schedule one expert's
// rows, straight into L2 where its chain reads them, instead of a separate pass over all rows
// through memory.
struct RowsOf {
  const char* base;
  int64_t row0, ld;
  DType dt;
  RowsOf(const void* src, const int32_t* gather, DType dt_, int64_t H, int64_t r0, int64_t rows, int slot) : row0(0), ld(H), dt(dt_) {
    base = static_cast<const char*>(src);
    if (!gather || rows == 0) return;
    const size_t rb = size_t(H) * dtype_size(dt);
    void* buf = scratch(slot, size_t(rows) * rb);
    gather_rows(src, rb, gather + r0, rows, buf);
    base = static_cast<const char*>(buf);
    row0 = r0;
  }
  const char* row(int64_t i) const { return elem_at(base, dt, (i - row0) * ld); }
};

}  // namespace

namespace {

// The forward of spans [s0, s1) (rows [row0, row0 + rows) of f); z in fp32 and a live in
// per-thread scratch indexed from row0.
void spans_forward(const FfnRowsForward& f, const Span* s0, const Span* s1, int64_t row0, int64_t rows) {
  const int64_t H = f.H, I = f.I;
  const DType dt = f.dt;
  float* zf = static_cast<float*>(scratch(6, size_t(rows * 2 * I) * 4));
  void* a = scratch(7, size_t(rows * I) * dtype_size(dt));
  const RowsOf xr(f.xs, f.gather, dt, H, row0, rows, 0);
  thread_local std::vector<gemm::NtJob> jobs;
  jobs.clear();
  for (const Span* s = s0; s != s1; ++s) {  // z = [x Wg | x Wu]
    const char* x = xr.row(s->offset);
    float* z = zf + (s->offset - row0) * 2 * I;
    jobs.push_back(job(s->count, I, x, dt, H, weight_of(f.w.g, s->group), H, weight_ld(f.w.g), z, 2 * I, false));
    jobs.push_back(job(s->count, I, x, dt, H, weight_of(f.w.u, s->group), H, weight_ld(f.w.u), z + I, 2 * I, false));
  }
  gemm::grouped_gemm_nn(jobs.data(), int64_t(jobs.size()));
  SwigluFwd p;  // z stored in dt, a = silu(g) u from it
  p.N = I;
  p.z = zf; p.zt = DType::f32; p.ldz = 2 * I;
  p.zo = elem_at(f.z, dt, row0 * 2 * I); p.zot = dt; p.ldzo = 2 * I;
  p.a = a; p.at = dt; p.lda = I;
  swiglu_forward(p, rows);
  jobs.clear();
  for (const Span* s = s0; s != s1; ++s)
    jobs.push_back(job(s->count, H, elem_at(a, dt, (s->offset - row0) * I), dt, I, weight_of(f.w.d, s->group), I, weight_ld(f.w.d),
                       f.out + s->offset * H, H, f.out_acc));
  gemm::grouped_gemm_nn(jobs.data(), int64_t(jobs.size()));
}

// Runs fn over the spans: each span's chain on one thread, largest first (a small dynamic tail),
// or all spans at once (fn then makes grouped calls over every thread).
void run_spans(const std::vector<Span>& spans, bool expert_major, FnRef<void(const Span*, const Span*, int64_t, int64_t)> fn) {
  if (!expert_major) {
    fn(spans.data(), spans.data() + spans.size(), 0, rows_of(spans));
    return;
  }
  std::vector<Span> order = spans;
  std::stable_sort(order.begin(), order.end(), [](const Span& a, const Span& b) { return a.count > b.count; });
  parallel_for_dynamic(int64_t(order.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(&order[size_t(i)], &order[size_t(i)] + 1, order[size_t(i)].offset, order[size_t(i)].count);
  });
}

}  // namespace

void ffn_rows_forward(const FfnRowsForward& f) {
  run_spans(f.spans, ffn_schedule_for(f.spans, f.H, f.I, f.G) == FfnSchedule::expert_major,
            [&](const Span* s0, const Span* s1, int64_t row0, int64_t rows) { spans_forward(f, s0, s1, row0, rows); });
}

namespace {

// The backward of spans [s0, s1) (rows [row0, row0 + rows) of f), each projection one grouped
// engine call over these spans; g, dz and w a live in per-thread scratch indexed from row0.
void spans_backward(const FfnRowsBackward& f, const Span* s0, const Span* s1, int64_t row0, int64_t rows) {
  const int64_t H = f.H, I = f.I;
  const DType dt = f.dt;
  float* gr = static_cast<float*>(scratch(2, size_t(rows * I) * 4));
  void* dz = scratch(3, size_t(rows * 2 * I) * dtype_size(dt));
  void* aw = scratch(4, size_t(rows * I) * dtype_size(dt));
  const RowsOf xr(f.xs, f.gather, dt, H, row0, rows, 0), dyr(f.dys, f.gather, dt, H, row0, rows, 1);
  // g = dy Wd^T: the gradient of the down projection's input (before the routed weight)
  thread_local std::vector<gemm::NtJob> nt;
  nt.clear();
  for (const Span* s = s0; s != s1; ++s)
    nt.push_back(job(s->count, I, dyr.row(s->offset), dt, H, weight_of(f.w.d, s->group), H, weight_ld(f.w.d),
                     gr + (s->offset - row0) * I, I, false));
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
  SwigluBwd p;
  p.N = I;
  p.z = elem_at(f.z, dt, row0 * 2 * I); p.zt = dt; p.ldz = 2 * I;
  p.dy = gr; p.dyt = DType::f32; p.lddy = I;
  p.scale = f.scale ? f.scale + row0 : nullptr;
  p.dz = dz; p.dzt = dt; p.lddz = 2 * I;
  p.dot = f.dot ? f.dot + row0 : nullptr;
  p.aw = aw; p.ldaw = I;
  swiglu_backward(p, rows);
  // The three weight gradients in one call (K = each span's rows); dWg and dWu are adjacent jobs
  // on the same x rows, so the TN form packs x^T once for both.
  thread_local std::vector<gemm::TnJob> tn;
  tn.clear();
  const int64_t gsz = H * I;
  for (const Span* s = s0; s != s1; ++s) {
    const int64_t r = s->offset - row0, n = s->count, e = s->group;
    const char* x = xr.row(s->offset);
    tn.push_back({n, I, H, elem_at(aw, dt, r * I), dyr.row(s->offset), dt, dt, I, H, elem_at(f.dd, f.gdt, e * gsz), H, f.acc, f.gdt});
    tn.push_back({n, H, I, x, elem_at(dz, dt, r * 2 * I), dt, dt, H, 2 * I, elem_at(f.dg, f.gdt, e * gsz), I, f.acc, f.gdt});
    tn.push_back({n, H, I, x, elem_at(dz, dt, r * 2 * I + I), dt, dt, H, 2 * I, elem_at(f.du, f.gdt, e * gsz), I, f.acc, f.gdt});
  }
  gemm::grouped_gemm_tn(tn.data(), int64_t(tn.size()));
  // dx rows = dz_gate Wg^T + dz_up Wu^T (two K segments of one job)
  nt.clear();
  for (const Span* s = s0; s != s1; ++s) {
    gemm::NtJob j = job(s->count, H, elem_at(dz, dt, (s->offset - row0) * 2 * I), dt, 2 * I, weight_of(f.w.g, s->group), I, weight_ld(f.w.g),
                        f.dx + s->offset * H, H, f.dx_acc);
    j.w[1] = {weight_of(f.w.u, s->group), I, weight_ld(f.w.u)};
    nt.push_back(j);
  }
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
}

std::atomic<int> g_schedule{int(FfnSchedule::automatic)};

}  // namespace

void set_ffn_schedule(FfnSchedule s) { g_schedule.store(int(s)); }

FfnSchedule ffn_schedule_for(const std::vector<Span>& spans, int64_t H, int64_t I, int64_t G) {
  const auto forced = FfnSchedule(g_schedule.load());
  if (forced != FfnSchedule::automatic) return forced == FfnSchedule::expert_major && !groups_distinct(spans, G) ? FfnSchedule::per_call : forced;
  const int64_t threads = num_threads(), n = int64_t(spans.size());
  if (threads <= 1 || n < 4 * threads || !groups_distinct(spans, G)) return FfnSchedule::per_call;
  int64_t rows = 0, most = 0;
  for (const Span& s : spans) rows += s.count, most = std::max(most, s.count);
  // One expert's chain per thread pays when its row buffers (x, dy, dz, g: ~rows x (H + 3I)
  // bf16/fp32) stay in L2 and no single expert is a large part of the work (dynamic tail).
  const int64_t mean = rows / n, bytes = mean * (2 * H + 8 * I);
  return bytes <= kExpertChainL2 && most * 2 * threads <= rows ? FfnSchedule::expert_major : FfnSchedule::per_call;
}

void ffn_rows_backward(const FfnRowsBackward& f) {
  const int64_t H = f.H, I = f.I;
  // Expert-major: one thread runs one expert's whole chain (nested engine calls run inline), so
  // its intermediates stay in L2, nothing is packed out of cache, there is no join between the
  // stages, and one thread's gradient stores (TN) overlap the other's dot products (NT).
  run_spans(f.spans, ffn_schedule_for(f.spans, H, I, f.G) == FfnSchedule::expert_major,
            [&](const Span* s0, const Span* s1, int64_t row0, int64_t rows) { spans_backward(f, s0, s1, row0, rows); });
  const int64_t gsz = H * I;
  if (f.acc) return;
  std::vector<char> used(static_cast<size_t>(f.G), 0);
  for (const Span& s : f.spans) used[size_t(s.group)] = 1;
  const size_t bytes = size_t(gsz) * dtype_size(f.gdt);
  parallel_rows(f.G, gsz, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      if (!used[size_t(e)])
        for (void* t : {f.dg, f.du, f.dd}) std::memset(elem_at(t, f.gdt, e * gsz), 0, bytes);
  });
}

}  // namespace ot::moe::bwd
