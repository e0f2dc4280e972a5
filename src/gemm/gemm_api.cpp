// Entry points of the matrix engine. PROVISIONAL portable implementation (fp32 packing, plain
// loops); the per-ISA micro-kernels replace the bodies behind the same API.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/gemm/epilogue_math.h"

namespace ot::gemm {

struct PackedB::Impl {
  int64_t K = 0, N = 0;
  DType dtype = DType::f32;
  cpu::Isa isa = cpu::Isa::scalar;
  std::vector<float> kn;  // [K][N] fp32
};

PackedB::PackedB() = default;
PackedB::~PackedB() = default;
PackedB::PackedB(PackedB&&) noexcept = default;
PackedB& PackedB::operator=(PackedB&&) noexcept = default;
int64_t PackedB::K() const { return impl_ ? impl_->K : 0; }
int64_t PackedB::N() const { return impl_ ? impl_->N : 0; }
DType PackedB::dtype() const { return impl_ ? impl_->dtype : DType::f32; }
cpu::Isa PackedB::isa() const { return impl_ ? impl_->isa : cpu::Isa::scalar; }
size_t PackedB::bytes() const { return impl_ ? impl_->kn.size() * sizeof(float) : 0; }

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

PackedB prepack(const TensorView& b, BLayout layout) {
  OT_CHECK(b.ndim == 2, "prepack", "b", "a 2-D weight", b.shape_str());
  OT_CHECK(is_float(b.dtype), "prepack", "b", "bf16, fp16 or fp32", dtype_name(b.dtype));
  PackedB p;
  p.impl_ = std::make_unique<PackedB::Impl>();
  auto& im = *p.impl_;
  im.K = layout == BLayout::KN ? b.sizes[0] : b.sizes[1];
  im.N = layout == BLayout::KN ? b.sizes[1] : b.sizes[0];
  im.dtype = b.dtype;
  im.kn.resize(size_t(im.K * im.N));
  TensorView dst(im.kn.data(), DType::f32, {im.K, im.N});
  copy_into(layout == BLayout::KN ? b : TensorView(b.data, b.dtype, {im.K, im.N}, {b.strides[1], b.strides[0]}), dst);
  return p;
}

static void load_row_f32(const void* p, DType t, float* dst, int64_t n) { convert_to_f32(p, t, dst, n); }

static void gemm_rows(int64_t m0, int64_t m1, const AOperand& a, const PackedB::Impl& b, const COperand& c, const Epilogue& ep) {
  int64_t K = b.K, N = b.N, n_out = ep.act == Act::swiglu ? N / 2 : N;
  std::vector<float> arow(static_cast<size_t>(K)), acc(static_cast<size_t>(N)), out(static_cast<size_t>(n_out)), cur(static_cast<size_t>(n_out));
  size_t es = dtype_size(a.dtype);
  for (int64_t m = m0; m < m1; ++m) {
    int64_t r = a.rows ? a.rows[m] : m;
    load_row_f32(static_cast<const char*>(a.data) + r * a.ld * es, a.dtype, arow.data(), K);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < K; ++k) {
      float av = arow[size_t(k)];
      const float* brow = b.kn.data() + k * N;
      for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += av * brow[n];
    }
    for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += ep.bias ? ep.bias[n] : 0.f;
    for (int64_t n = 0; n < n_out; ++n) {
      float v = ep.act == Act::swiglu ? silu(acc[size_t(n)]) * acc[size_t(n + n_out)] : activate(ep.act, acc[size_t(n)]);
      out[size_t(n)] = ep.row_scale ? v * ep.row_scale[m] : v;
    }
    int64_t crow = ep.scatter_rows ? ep.scatter_rows[m] : m;
    void* cp = static_cast<char*>(c.data) + crow * c.ld * int64_t(dtype_size(c.dtype));
    if (ep.accumulate) {
      load_row_f32(cp, c.dtype, cur.data(), n_out);
      for (int64_t n = 0; n < n_out; ++n) out[size_t(n)] += cur[size_t(n)];
    }
    convert_from_f32(out.data(), cp, c.dtype, n_out);
  }
}

void gemm(int64_t M, const AOperand& a, const PackedB& b, const COperand& c, const Epilogue& ep) {
  if (M <= 0) return;
  // Scatter-accumulate may hit the same C row from two A rows: keep it on one thread.
  if (ep.scatter_rows && ep.accumulate) { gemm_rows(0, M, a, *b.impl(), c, ep); return; }
  parallel_for(M, [&](int64_t m0, int64_t m1) { gemm_rows(m0, m1, a, *b.impl(), c, ep); });
}

void grouped_gemm(const Group* groups, int64_t count) {
  for (int64_t g = 0; g < count; ++g) gemm(groups[g].M, groups[g].a, *groups[g].b, groups[g].c, groups[g].ep);
}

void matmul(const MatView& a, const MatView& b, const MutMatView& c, float alpha, float beta) { ref::matmul(a, b, c, alpha, beta); }

const char* kernel_name(DType, DType, int64_t) { return "portable"; }

}  // namespace ot::gemm
