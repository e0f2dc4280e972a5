// rms_norm_gated and rms_norm_gated_bwd (ot/gdn_layer.h): argument checks, the [rows, N] form of
// the inputs, then the ISA's row kernels over fixed blocks of rows. The weight gradient is summed
// per block and the blocks added in order, so it does not depend on the thread count.
#include <cmath>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gdn_layer.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/kernel_list.h"
#include "src/core/row_view.h"
#include "src/gdn/gdn_internal.h"
#include "src/gdn/rms_norm_gated_kernels.h"
#include "src/ref/gdn_layer_ref.h"

namespace ot::gdn {
using namespace detail;
using namespace detail::norm;
using ::ot::detail::as_rows;

namespace {

constexpr int64_t kRowBlock = 64;  // rows per job (and per partial weight gradient)

struct Args {
  int64_t rows = 0, N = 0, group = 0;
  DType x = DType::f32;  // x's (and y's) dtype
};

Args check(const TensorView& x, const TensorView& z, const TensorView& weight, const RmsNormGatedOptions& o, const char* op) {
  Args a;
  OT_CHECK(x.defined() && x.ndim >= 1, op, "x", "[..., N]", x.shape_str());
  expect_float(x.dtype, op, "x");
  OT_CHECK(z.defined() && z.shape() == x.shape(), op, "z", ::ot::detail::cat("the shape of x ", x.shape_str()), z.shape_str());
  expect_float(z.dtype, op, "z");
  a.N = x.sizes[x.ndim - 1];
  a.x = x.dtype;
  a.rows = 1;
  for (int i = 0; i + 1 < x.ndim; ++i) a.rows *= x.sizes[i];
  OT_CHECK(weight.defined() && weight.ndim == 1 && weight.sizes[0] == a.N, op, "weight", ::ot::detail::cat("[N] with N = ", a.N),
           weight.shape_str());
  expect_float(weight.dtype, op, "weight");
  a.group = o.group_size == 0 ? a.N : o.group_size;
  OT_CHECK(o.group_size >= 0 && (a.N == 0 || (a.group > 0 && a.N % a.group == 0)), op, "group_size",
           ::ot::detail::cat("0 or a divisor of N = ", a.N), o.group_size);
  OT_CHECK(std::isfinite(o.eps) && o.eps >= 0.f, op, "eps", "a finite eps >= 0", o.eps);
  return a;
}

int64_t groups_of(const Args& a) { return a.group == 0 ? 0 : a.N / a.group; }

// The forward's row kernels: the first the ISA runs and whose condition holds.
using FwdRows = void (*)(const Cfg&, In, In, Out, float*, int64_t, int64_t, float*);
using FwdKernel = cpu::KernelEntry<FwdRows, Args>;
bool whole_vector_groups(const Args& a) { return a.group % 16 == 0; }
bool whole_vector_groups_bf16(const Args& a) { return whole_vector_groups(a) && a.x == DType::bf16; }
const FwdKernel kFwdKernels[] = {
    {cpu::Isa::avx512_bf16, whole_vector_groups_bf16, fwd_rows_avx512bf16, "avx512_bf16"},
    {cpu::Isa::avx512, whole_vector_groups, fwd_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, fwd_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, fwd_rows_generic, "generic"},
};
const FwdKernel& fwd_kernel(const Args& a) { return cpu::select_kernel("rms_norm_gated", kFwdKernels, a); }

// The backward's: the AVX-512 rows also need dy in the dtype of x (dx's).
struct BwdPlan {
  Args a;
  DType x, dy;
};
using BwdRows = void (*)(const Cfg&, const Bwd&, int64_t, int64_t, float*, float*);
using BwdKernel = cpu::KernelEntry<BwdRows, BwdPlan>;
bool whole_vectors_dy_as_x(const BwdPlan& p) { return whole_vector_groups(p.a) && p.dy == p.x; }
bool whole_vectors_dy_as_x_bf16(const BwdPlan& p) { return whole_vectors_dy_as_x(p) && p.x == DType::bf16; }
const BwdKernel kBwdKernels[] = {
    {cpu::Isa::avx512_bf16, whole_vectors_dy_as_x_bf16, bwd_rows_avx512bf16, "avx512_bf16"},
    {cpu::Isa::avx512, whole_vectors_dy_as_x, bwd_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, bwd_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, bwd_rows_generic, "generic"},
};
const BwdKernel& bwd_kernel(const BwdPlan& p) { return cpu::select_kernel("rms_norm_gated_bwd", kBwdKernels, p); }

}  // namespace

RmsNormGatedOut rms_norm_gated(const TensorView& x_in, const TensorView& z_in, const TensorView& weight, const RmsNormGatedOptions& o) {
  const char* op = "rms_norm_gated";
  trace::OpScope scope(op);
  const Args a = check(x_in, z_in, weight, o, op);
  RmsNormGatedOut r;
  r.y = pooled_empty(x_in.dtype, x_in.shape());
  r.rstd = Tensor::empty(DType::f32, {a.rows, groups_of(a)});
  const bool use_ref = cpu::force_ref();
  const FwdKernel& kernel = fwd_kernel(a);
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernel.name);
  if (a.rows == 0 || a.N == 0) return r;
  Tensor kx, kz;
  const TensorView x = as_rows(x_in, a.rows, a.N, kx), z = as_rows(z_in, a.rows, a.N, kz), y = ::ot::detail::rows_view(r.y, a.rows, a.N);
  if (use_ref) {
    ref::rms_norm_gated(x, z, weight, o.eps, o.norm_before_gate, a.group, y, r.rstd);
    return r;
  }
  const std::vector<float> w = ::ot::detail::vector_f32(weight);
  const Cfg c{a.N, a.group, o.eps, o.norm_before_gate, w.data()};
  float* rstd = r.rstd.ptr<float>();
  const int64_t blocks = (a.rows + kRowBlock - 1) / kRowBlock;
  const double call_bytes = double(x.nbytes() + z.nbytes() + y.nbytes());  // (a decode step's few tokens: one thread)
  parallel_for_sized(blocks, call_bytes, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(size_t(fwd_scratch(a.N)), 0.f);
    const int64_t r0 = b0 * kRowBlock, r1 = std::min(a.rows, b1 * kRowBlock);
    kernel.fn(c, ::ot::detail::rows_in(x), ::ot::detail::rows_in(z), ::ot::detail::rows_out(y), rstd, r0, r1, buf.data());
  });
  return r;
}

RmsNormGatedGrads rms_norm_gated_bwd(const TensorView& dy_in, const TensorView& x_in, const TensorView& z_in, const TensorView& weight,
                                     const TensorView& rstd, const RmsNormGatedOptions& o) {
  const char* op = "rms_norm_gated_bwd";
  trace::OpScope scope(op);
  const Args a = check(x_in, z_in, weight, o, op);
  OT_CHECK(dy_in.defined() && dy_in.shape() == x_in.shape(), op, "dy", ::ot::detail::cat("the shape of x ", x_in.shape_str()),
           dy_in.shape_str());
  expect_float(dy_in.dtype, op, "dy");
  if (rstd.defined())
    OT_CHECK(rstd.dtype == DType::f32 && rstd.ndim == 2 && rstd.sizes[0] == a.rows && rstd.sizes[1] == groups_of(a) && rstd.is_contiguous(),
             op, "rstd", ::ot::detail::cat("the forward's contiguous fp32 [", a.rows, ", ", groups_of(a), "]"), rstd.shape_str());
  RmsNormGatedGrads g;
  g.dx = pooled_empty(x_in.dtype, x_in.shape());
  g.dz = pooled_empty(z_in.dtype, z_in.shape());
  g.dweight = Tensor::zeros(DType::f32, {a.N});
  const bool use_ref = cpu::force_ref();
  const BwdKernel& kernel = bwd_kernel({a, x_in.dtype, dy_in.dtype});
  if (scope.active()) scope.args(x_in.shape_str()).kernel(use_ref ? "ref" : kernel.name);
  if (a.rows == 0 || a.N == 0) return g;
  Tensor kx, kz, kd;
  const TensorView x = as_rows(x_in, a.rows, a.N, kx), z = as_rows(z_in, a.rows, a.N, kz), dy = as_rows(dy_in, a.rows, a.N, kd);
  const TensorView dx = ::ot::detail::rows_view(g.dx, a.rows, a.N), dz = ::ot::detail::rows_view(g.dz, a.rows, a.N);
  if (use_ref) {
    ref::rms_norm_gated_bwd(dy, x, z, weight, o.eps, o.norm_before_gate, a.group, dx, dz, g.dweight);
    return g;
  }
  const std::vector<float> w = ::ot::detail::vector_f32(weight);
  const Cfg c{a.N, a.group, o.eps, o.norm_before_gate, w.data()};
  const int64_t blocks = (a.rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial(size_t(blocks * a.N), 0.f);
  const Bwd b{::ot::detail::rows_in(dy), ::ot::detail::rows_in(x), ::ot::detail::rows_in(z), ::ot::detail::rows_out(dx), ::ot::detail::rows_out(dz), rstd.defined() ? rstd.ptr<float>() : nullptr};
  parallel_for_sized(blocks, double(dy.nbytes() + x.nbytes() + z.nbytes() + dx.nbytes() + dz.nbytes()), [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(size_t(bwd_scratch(a.N)), 0.f);
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t r0 = k * kRowBlock, r1 = std::min(a.rows, r0 + kRowBlock);
      float* dw = partial.data() + k * a.N;
      kernel.fn(c, b, r0, r1, dw, buf.data());
    }
  });
  float* dw = g.dweight.ptr<float>();
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t i = 0; i < a.N; ++i) dw[i] += partial[size_t(k * a.N + i)];
  return g;
}

}  // namespace ot::gdn
