// Entry points of the matrix engine: validation, the reference route, tracing, and the hand-over
// to the blocked driver (driver.cpp) with the micro-kernel chosen for the active ISA.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "ot/workspace.h"
#include "src/gemm/internal.h"
#include "src/gemm/small.h"

namespace ot::gemm {

using namespace detail;

struct PackedB::Impl {
  Panels geom;
  detail::WeightMem mem;
  DType dtype = DType::f32;
  cpu::Isa isa = cpu::Isa::scalar;
};

PackedB::PackedB() = default;
PackedB::~PackedB() = default;
PackedB::PackedB(PackedB&&) noexcept = default;
PackedB& PackedB::operator=(PackedB&&) noexcept = default;
int64_t PackedB::K() const { return impl_ ? impl_->geom.K : 0; }
int64_t PackedB::N() const { return impl_ ? impl_->geom.N : 0; }
DType PackedB::dtype() const { return impl_ ? impl_->dtype : DType::f32; }
cpu::Isa PackedB::isa() const { return impl_ ? impl_->isa : cpu::Isa::scalar; }
size_t PackedB::bytes() const { return impl_ ? impl_->geom.panel_bytes() * size_t(impl_->geom.npanels) : 0; }

const char* act_name(Act a) {
  switch (a) {
    case Act::none: return "none";
    case Act::relu: return "relu";
    case Act::gelu: return "gelu";
    case Act::silu: return "silu";
    case Act::swiglu: return "swiglu";
  }
  return "?";
}

MatView MatView::of(const TensorView& v) {
  OT_CHECK(v.ndim == 2, "gemm", "matrix", "a 2-D view", v.shape_str());
  return {v.data, v.dtype, v.sizes[0], v.sizes[1], v.strides[0], v.strides[1]};
}
MutMatView MutMatView::of(const TensorView& v) {
  OT_CHECK(v.ndim == 2, "gemm", "matrix", "a 2-D view", v.shape_str());
  return {v.data, v.dtype, v.sizes[0], v.sizes[1], v.strides[0], v.strides[1]};
}

static bool out_dtype_ok(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

PackedB prepack(const TensorView& b, BLayout layout) {
  OT_CHECK(b.ndim == 2, "prepack", "b", "a 2-D weight", b.shape_str());
  OT_CHECK(is_float(b.dtype), "prepack", "b", "bf16, fp16 or fp32", dtype_name(b.dtype));
  int64_t K = layout == BLayout::KN ? b.sizes[0] : b.sizes[1];
  int64_t N = layout == BLayout::KN ? b.sizes[1] : b.sizes[0];
  OT_CHECK(K * N == 0 || b.data != nullptr, "prepack", "b", "non-null data", "nullptr");
  PackedB p;
  p.impl_ = std::make_unique<PackedB::Impl>();
  auto& im = *p.impl_;
  Panels& g = im.geom;
  // bf16 weights keep bf16 (vnni pairs) when the CPU has a bf16 dot product; everything else fp32.
  g.layout = layout_for(b.dtype == DType::bf16 ? DType::bf16 : DType::f32, b.dtype);
  g.K = K, g.N = N, g.Kp = pad_k(g.layout, K);
  g.split = N >= 2 && N % 2 == 0;
  g.npanels = panel_count(N, g.split);
  im.dtype = b.dtype;
  const cpu::Isa top = cpu::active_isa();
  im.isa = g.layout == Layout::bf16_vnni ? top : std::min(top, cpu::Isa::avx512);
  im.mem = detail::WeightMem(g.panel_bytes() * size_t(g.npanels));
  g.data = im.mem.get();
  int64_t rs = layout == BLayout::KN ? b.strides[0] : b.strides[1];
  int64_t cs = layout == BLayout::KN ? b.strides[1] : b.strides[0];
  char* dst = im.mem.get();
  parallel_for(g.npanels, [&](int64_t p0, int64_t p1) { pack_b(b.data, b.dtype, rs, cs, g, dst, p0, p1); });
  return p;
}

static EpiArgs epi_args(const AOperand& a, const COperand& c, const Epilogue& ep) {
  EpiArgs e;
  e.a_scale = a.scale;
  e.a_rows = a.rows;
  e.bias = ep.bias;
  e.act = ep.act;
  e.row_scale = ep.row_scale;
  e.scatter_rows = ep.scatter_rows;
  e.beta = ep.accumulate ? 1.f : 0.f;
  e.c = c.data;
  e.c_dtype = c.dtype;
  e.ldc = c.ld;
  return e;
}

static void check_gemm(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep, const char* op) {
  OT_CHECK(M >= 0, op, "M", ">= 0", M);
  OT_CHECK(!b.empty(), op, "b", "a prepacked weight", "empty PackedB");
  OT_CHECK(is_float(a.dtype) || a.dtype == DType::i8, op, "a", "bf16, fp16, fp32 or i8 (with a.scale)", dtype_name(a.dtype));
  OT_CHECK(a.dtype != DType::i8 || a.scale != nullptr || M == 0, op, "a.scale", "per-row scales for an i8 A", "nullptr");
  OT_CHECK(out_dtype_ok(c.dtype), op, "c", "fp32, bf16 or fp16 output", dtype_name(c.dtype));
  int64_t N = b.N(), K = b.K();
  OT_CHECK(ep.act != Act::swiglu || N % 2 == 0, op, "b", "an even N ([gate | up]) for swiglu", N);
  int64_t n_out = ep.act == Act::swiglu ? N / 2 : N;
  if (M == 0 || n_out == 0) return;
  OT_CHECK(K == 0 || a.data != nullptr, op, "a", "non-null data", "nullptr");
  OT_CHECK(c.data != nullptr, op, "c", "non-null data", "nullptr");
  OT_CHECK(a.ld >= K || (M == 1 && !a.rows), op, "a.ld", ">= K = " + std::to_string(K), a.ld);
  OT_CHECK(c.ld >= n_out || (M == 1 && !ep.scatter_rows), op, "c.ld", ">= output width " + std::to_string(n_out), c.ld);
}

static detail::Job make_job(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep) {
  detail::Job j;
  j.M = M;
  j.a = {a.data, a.dtype, a.ld, 1, a.rows};
  j.b = b.impl()->geom;
  j.epi = epi_args(a, c, ep);
  j.swiglu = ep.act == Act::swiglu;
  return j;
}

// Reference route for packed weights: unpack (exact) and run the plain reference.
static void gemm_reference(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep) {
  const Panels& g = b.impl()->geom;
  std::vector<float> kn(size_t(g.K * g.N));
  unpack_b(g, kn.data());
  ref::gemm(M, a, TensorView(kn.data(), DType::f32, {g.K, g.N}), BLayout::KN, c, ep);
}

void gemm(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep) {
  check_gemm(M, a, b, c, ep, "gemm");
  trace::OpScope scope("gemm");
  const char* kname = cpu::force_ref() ? "ref" : select_kernel(b.impl()->geom.layout, M).name;
  scope.kernel(kname).flops(2.0 * double(M) * double(b.N()) * double(b.K()));
  if (scope.active())
    scope.args("M=" + std::to_string(M) + " N=" + std::to_string(b.N()) + " K=" + std::to_string(b.K()) + " a=" + dtype_name(a.dtype) +
               " b=" + dtype_name(b.dtype()) + " c=" + dtype_name(c.dtype) + " act=" + act_name(ep.act));
  if (M == 0) return;
  if (cpu::force_ref()) { gemm_reference(M, a, b, c, ep); return; }
  detail::Job job = make_job(M, a, b, c, ep);
  run_jobs(&job, 1, ep.scatter_rows && ep.accumulate);
}

void grouped_gemm(const Group* groups, int64_t count) {
  OT_CHECK(count >= 0 && (count == 0 || groups), "grouped_gemm", "groups", "an array of count groups", count);
  double flops = 0;
  bool race = false;
  for (int64_t g = 0; g < count; ++g) {
    const Group& gr = groups[g];
    OT_CHECK(gr.b != nullptr, "grouped_gemm", "groups[].b", "a prepacked weight", "nullptr");
    check_gemm(gr.M, gr.a, *gr.b, gr.c, gr.ep, "grouped_gemm");
    flops += 2.0 * double(gr.M) * double(gr.b->N()) * double(gr.b->K());
    race = race || (gr.ep.scatter_rows && gr.ep.accumulate);
  }
  trace::OpScope scope("grouped_gemm");
  scope.kernel(cpu::force_ref() ? "ref" : count ? select_kernel(groups[0].b->impl()->geom.layout, 64).name : "none").flops(flops);
  if (scope.active()) scope.args("groups=" + std::to_string(count));
  if (cpu::force_ref()) {
    for (int64_t g = 0; g < count; ++g)
      if (groups[g].M > 0) gemm_reference(groups[g].M, groups[g].a, *groups[g].b, groups[g].c, groups[g].ep);
    return;
  }
  thread_local std::vector<detail::Job> jobs_tl;
  std::vector<detail::Job>& jobs = jobs_tl;
  jobs.clear();
  for (int64_t g = 0; g < count; ++g)
    if (groups[g].M > 0) jobs.push_back(make_job(groups[g].M, groups[g].a, *groups[g].b, groups[g].c, groups[g].ep));
  run_jobs(jobs.data(), int64_t(jobs.size()), race);
}

void grouped_gemm_chain(const Group* first, const Group* second, int64_t count) {
  const char* op = "grouped_gemm_chain";
  OT_CHECK(count >= 0 && (count == 0 || (first && second)), op, "groups", "two arrays of count groups", count);
  double flops = 0;
  bool race1 = false, race2 = false;
  for (int64_t g = 0; g < count; ++g)
    for (const Group* gr : {first + g, second + g}) {
      OT_CHECK(gr->b != nullptr, op, "groups[].b", "a prepacked weight", "nullptr");
      check_gemm(gr->M, gr->a, *gr->b, gr->c, gr->ep, op);
      flops += 2.0 * double(gr->M) * double(gr->b->N()) * double(gr->b->K());
      (gr == first + g ? race1 : race2) |= gr->ep.scatter_rows && gr->ep.accumulate;
    }
  if (cpu::force_ref() || race1) {  // a scatter-accumulating first stage needs its own race-free pass
    grouped_gemm(first, count);
    grouped_gemm(second, count);
    return;
  }
  trace::OpScope scope(op);
  scope.kernel(count ? select_kernel(first[0].b->impl()->geom.layout, 64).name : "none").flops(flops);
  if (scope.active()) scope.args("groups=" + std::to_string(count));
  thread_local std::vector<detail::Job> j1_tl, j2_tl;
  std::vector<detail::Job>&j1 = j1_tl, &j2 = j2_tl;
  j1.clear(), j2.clear();
  for (int64_t g = 0; g < count; ++g)  // pairs stay aligned: a pair runs when either GEMM has rows
    if (first[g].M > 0 || second[g].M > 0) {
      j1.push_back(make_job(first[g].M, first[g].a, *first[g].b, first[g].c, first[g].ep));
      j2.push_back(make_job(second[g].M, second[g].a, *second[g].b, second[g].c, second[g].ep));
    }
  run_job_chain(j1.data(), j2.data(), int64_t(j1.size()), race2);
}

void matmul(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) {
  OT_CHECK(is_float(a.dtype), "matmul", "a", "bf16, fp16 or fp32", dtype_name(a.dtype));
  OT_CHECK(is_float(b.dtype), "matmul", "b", "bf16, fp16 or fp32", dtype_name(b.dtype));
  OT_CHECK(out_dtype_ok(c.dtype), "matmul", "c", "fp32, bf16 or fp16", dtype_name(c.dtype));
  OT_CHECK(a.cols == b.rows, "matmul", "b", "rows == a.cols = " + std::to_string(a.cols), b.rows);
  OT_CHECK(c.rows == a.rows && c.cols == b.cols, "matmul", "c", "[" + std::to_string(a.rows) + ", " + std::to_string(b.cols) + "]",
           "[" + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "]");
  OT_CHECK(a.rows >= 0 && a.cols >= 0 && b.cols >= 0, "matmul", "shape", "non-negative sizes", a.rows);
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  trace::OpScope scope("matmul");
  scope.flops(2.0 * double(M) * double(N) * double(K));
  if (M == 0 || N == 0) return;
  if (cpu::force_ref()) {
    scope.kernel("ref");
    ref::matmul(a, b, c, alpha, beta);
    return;
  }
  if (detail::small_f32_takes(a, b, c)) {
    scope.kernel("small_f32");
    detail::small_f32(a, b, c, alpha, beta);
    return;
  }
  detail::Job job;
  Panels& g = job.b;
  g.layout = layout_for(a.dtype, b.dtype);
  g.K = K, g.N = N, g.Kp = pad_k(g.layout, K);
  g.npanels = panel_count(N, false);
  // B packed on the fly into this thread's scratch (no allocation once warm).
  thread_local AlignedPtr<char> bbuf;
  thread_local size_t bcap = 0;
  size_t need = std::max<size_t>(64, g.panel_bytes() * size_t(g.npanels));
  if (need > bcap) { bbuf = make_aligned<char>(need); bcap = need; }
  pack_b(b.data, b.dtype, b.rs, b.cs, g, bbuf.get(), 0, g.npanels);
  g.data = bbuf.get();
  job.M = M;
  job.a = {a.data, a.dtype, a.rs, a.cs, nullptr};
  job.epi.alpha = alpha;
  job.epi.beta = beta;
  job.epi.c = c.data;
  job.epi.c_dtype = c.dtype;
  job.epi.ldc = c.rs;
  job.epi.csc = c.cs;
  scope.kernel(select_kernel(g.layout, M).name);
  run_jobs(&job, 1, false);
}

const char* kernel_name(DType a, DType b, int64_t M) {
  if (cpu::force_ref()) return "ref";
  return select_kernel(layout_for(a == DType::bf16 || a == DType::f32 || a == DType::i8 ? DType::bf16 : a, b), M).name;
}

}  // namespace ot::gemm
