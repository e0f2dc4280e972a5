// SwiGLU FFNs over row spans for the training path (see ffn_bwd_common.h): every projection is
// one grouped engine call over all spans, on the weights as stored (NN forward, NT and TN
// backward: no weight is ever packed whole), with one vectorised SwiGLU pass in between.
#include <algorithm>
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

}  // namespace

void ffn_rows_forward(const FfnRowsForward& f) {
  const int64_t A = rows_of(f.spans), H = f.H, I = f.I;
  const DType dt = f.dt;
  float* zf = static_cast<float*>(scratch(6, size_t(A * 2 * I) * 4));
  void* a = scratch(7, size_t(A * I) * dtype_size(dt));
  std::vector<gemm::NtJob> jobs;
  for (const Span& s : f.spans) {  // z = [x Wg | x Wu]
    const char* x = elem_at(f.xs, dt, s.offset * H);
    jobs.push_back(job(s.count, I, x, dt, H, weight_of(f.w.g, s.group), H, weight_ld(f.w.g), zf + s.offset * 2 * I, 2 * I, false));
    jobs.push_back(job(s.count, I, x, dt, H, weight_of(f.w.u, s.group), H, weight_ld(f.w.u), zf + s.offset * 2 * I + I, 2 * I, false));
  }
  gemm::grouped_gemm_nn(jobs.data(), int64_t(jobs.size()));
  SwigluFwd p;  // z stored in dt, a = silu(g) u from it
  p.N = I;
  p.z = zf; p.zt = DType::f32; p.ldz = 2 * I;
  p.zo = f.z; p.zot = dt; p.ldzo = 2 * I;
  p.a = a; p.at = dt; p.lda = I;
  swiglu_forward(p, A);
  jobs.clear();
  for (const Span& s : f.spans)
    jobs.push_back(job(s.count, H, elem_at(a, dt, s.offset * I), dt, I, weight_of(f.w.d, s.group), I, weight_ld(f.w.d), f.out + s.offset * H, H, f.out_acc));
  gemm::grouped_gemm_nn(jobs.data(), int64_t(jobs.size()));
}

void ffn_rows_backward(const FfnRowsBackward& f) {
  const int64_t A = rows_of(f.spans), H = f.H, I = f.I;
  const DType dt = f.dt;
  float* gr = static_cast<float*>(scratch(2, size_t(A * I) * 4));
  void* dz = scratch(3, size_t(A * 2 * I) * dtype_size(dt));
  void* aw = scratch(4, size_t(A * I) * dtype_size(dt));
  // g = dy Wd^T: the gradient of the down projection's input (before the routed weight)
  std::vector<gemm::NtJob> nt;
  for (const Span& s : f.spans)
    nt.push_back(job(s.count, I, elem_at(f.dys, dt, s.offset * H), dt, H, weight_of(f.w.d, s.group), H, weight_ld(f.w.d), gr + s.offset * I, I, false));
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
  SwigluBwd p;
  p.N = I;
  p.z = f.z; p.zt = dt; p.ldz = 2 * I;
  p.dy = gr; p.dyt = DType::f32; p.lddy = I;
  p.scale = f.scale;
  p.dz = dz; p.dzt = dt; p.lddz = 2 * I;
  p.dot = f.dot;
  p.aw = aw; p.ldaw = I;
  swiglu_backward(p, A);
  // The three weight gradients in one call (K = each span's rows).
  std::vector<gemm::TnJob> tn;
  const int64_t gsz = H * I;
  for (const Span& s : f.spans) {
    const int64_t r = s.offset, n = s.count, e = s.group;
    const char* x = elem_at(f.xs, dt, r * H);
    tn.push_back({n, I, H, elem_at(aw, dt, r * I), elem_at(f.dys, dt, r * H), dt, dt, I, H, elem_at(f.dd, f.gdt, e * gsz), H, f.acc, f.gdt});
    tn.push_back({n, H, I, x, elem_at(dz, dt, r * 2 * I), dt, dt, H, 2 * I, elem_at(f.dg, f.gdt, e * gsz), I, f.acc, f.gdt});
    tn.push_back({n, H, I, x, elem_at(dz, dt, r * 2 * I + I), dt, dt, H, 2 * I, elem_at(f.du, f.gdt, e * gsz), I, f.acc, f.gdt});
  }
  gemm::grouped_gemm_tn(tn.data(), int64_t(tn.size()));
  // dx rows = dz_gate Wg^T + dz_up Wu^T (two K segments of one job)
  nt.clear();
  for (const Span& s : f.spans) {
    gemm::NtJob j = job(s.count, H, elem_at(dz, dt, s.offset * 2 * I), dt, 2 * I, weight_of(f.w.g, s.group), I, weight_ld(f.w.g), f.dx + s.offset * H, H,
                        f.dx_acc);
    j.w[1] = {weight_of(f.w.u, s.group), I, weight_ld(f.w.u)};
    nt.push_back(j);
  }
  gemm::grouped_gemm_nt(nt.data(), int64_t(nt.size()));
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
