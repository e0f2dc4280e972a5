// causal_attention / causal_attention_backward (ot/attention.h): one (batch, head) a task; its q,
// k, v (and dout, o) widened into fp32 scratch rows, the [T, S] scores in the thread's scratch,
// the products on gemm::matmul (strided views, fp32 accumulation), the softmax row by row. Nothing
// of size [B, H, T, S] is allocated: an attention layer's score tensors and their element-wise ops
// were page faults and memory passes in torch (a training step's 2 MiB score tensors, ~8 of them).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ot/attention.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/attn/softmax_rows.h"
#include "src/core/elem_at.h"
#include "src/core/kernel_list.h"

namespace ot {
namespace {

struct Dims {
  int64_t B = 0, H = 0, T = 0, S = 0, D = 0;
};

void expect_heads(const TensorView& x, const char* op, const char* name, int64_t B, int64_t H, int64_t rows, int64_t D, DType dt) {
  OT_CHECK(x.defined() && x.ndim == 4 && x.sizes[0] == B && x.sizes[1] == H && (rows < 0 || x.sizes[2] == rows) && x.sizes[3] == D, op, name,
           ::ot::detail::cat("[", B, ", ", H, ", ", rows < 0 ? std::string("S") : std::to_string(rows), ", ", D, "]"),
           x.defined() ? x.shape_str() : "undefined");
  OT_CHECK(x.dtype == dt, op, name, ::ot::detail::cat("q's dtype ", dtype_name(dt)), dtype_name(x.dtype));
}

Dims check(const char* op, const TensorView& q, const TensorView& k, const TensorView& v, float scale) {
  OT_CHECK(q.defined() && q.ndim == 4, op, "q", "[B, H, T, D]", q.defined() ? q.shape_str() : "undefined");
  OT_CHECK(q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f16, op, "q", "fp32, bf16 or fp16", dtype_name(q.dtype));
  Dims d{q.sizes[0], q.sizes[1], q.sizes[2], 0, q.sizes[3]};
  expect_heads(k, op, "k", d.B, d.H, -1, d.D, q.dtype);
  d.S = k.sizes[2];
  OT_CHECK(d.S >= d.T, op, "k", ::ot::detail::cat("S >= T = ", d.T, " keys (the queries are the last T positions)"), k.shape_str());
  expect_heads(v, op, "v", d.B, d.H, d.S, d.D, q.dtype);
  OT_CHECK(std::isfinite(scale) && scale > 0.f, op, "scale", "a finite scale > 0", scale);
  return d;
}

// Rows [rows, D] of head (b, h) of x widened into dst (contiguous fp32).
void head_f32(const TensorView& x, int64_t b, int64_t h, int64_t rows, int64_t D, float* dst) {
  const char* base = elem_at(x.data, x.dtype, b * x.strides[0] + h * x.strides[1]);
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = elem_at(base, x.dtype, r * x.strides[2]);
    if (x.strides[3] == 1) {
      convert_to_f32(row, x.dtype, dst + r * D, D);
    } else {
      for (int64_t i = 0; i < D; ++i) dst[r * D + i] = float(get_as_double(TensorView(const_cast<char*>(elem_at(row, x.dtype, i * x.strides[3])), x.dtype, {1}), 0));
    }
  }
}
// fp32 rows into head (b, h) of a contiguous [B, H, rows, D] tensor.
void store_head(const float* src, Tensor& t, int64_t b, int64_t h, int64_t H, int64_t rows, int64_t D) {
  convert_from_f32(src, elem_at(t.view().data, t.dtype(), ((b * H + h) * rows) * D), t.dtype(), rows * D);
}

gemm::MatView mat(const float* p, int64_t rows, int64_t cols, int64_t ld = 0) { return {p, DType::f32, rows, cols, ld ? ld : cols, 1}; }
gemm::MutMatView mut(float* p, int64_t rows, int64_t cols, int64_t ld = 0) { return {p, DType::f32, rows, cols, ld ? ld : cols, 1}; }

// Queries in blocks of kQueryBlock rows: block [t0, t1) sees keys [0, off + t1) only, so the
// products skip the masked upper part of the scores (prefill: ~40% of the work at T = S = 128).
constexpr int64_t kQueryBlock = 32;

const cpu::KernelEntry<attn::SoftmaxRows, cpu::AnyPlan> kSoftmaxKernels[] = {
    {cpu::Isa::avx512, nullptr, attn::softmax_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, attn::softmax_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, attn::softmax_rows_generic, "generic"},
};

float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

AttentionOut causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, float scale) {
  const char* op = "causal_attention";
  trace::OpScope scope(op);
  const Dims d = check(op, q, k, v, scale);
  AttentionOut r;
  r.o = pooled_empty(q.dtype, {d.B, d.H, d.T, d.D});
  r.lse = Tensor::empty(DType::f32, {d.B, d.H, d.T});
  const double flops = 4.0 * double(d.B * d.H) * double(d.T) * double(d.S) * double(d.D);
  scope.flops(flops).args(q.shape_str() + " k " + k.shape_str());
  if (d.B * d.H * d.T == 0 || d.D == 0) {
    if (d.D == 0) std::fill(r.lse.ptr<float>(), r.lse.ptr<float>() + r.lse.numel(), 0.f);
    return r;
  }
  if (cpu::force_ref()) {
    ref::causal_attention(q, k, v, scale, r.o, r.lse);
    return r;
  }
  const int64_t off = d.S - d.T;
  const double bytes = 2.0 * double(q.nbytes() + k.nbytes() + v.nbytes());
  const attn::SoftmaxRows softmax = cpu::select_kernel(op, kSoftmaxKernels).fn;
  parallel_for_sized(d.B * d.H, bytes, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> buf;
    float* Q = scratch(buf, size_t(d.T * d.D + 2 * d.S * d.D + d.T * d.S + d.T * d.D));
    float *K = Q + d.T * d.D, *V = K + d.S * d.D, *P = V + d.S * d.D, *O = P + d.T * d.S;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / d.H, h = i % d.H;
      head_f32(q, b, h, d.T, d.D, Q);
      head_f32(k, b, h, d.S, d.D, K);
      head_f32(v, b, h, d.S, d.D, V);
      for (int64_t t0 = 0; t0 < d.T; t0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, d.T - t0), n = off + t0 + m;  // rows, keys seen
        float* Pb = P + t0 * d.S;
        gemm::matmul(mat(Q + t0 * d.D, m, d.D), mat(K, n, d.D).t(), mut(Pb, m, n, d.S), scale, 0.f);
        softmax(Pb, m, n, d.S, off + t0, r.lse.ptr<float>() + i * d.T + t0, nullptr);
        gemm::matmul(mat(Pb, m, n, d.S), mat(V, n, d.D), mut(O + t0 * d.D, m, d.D), 1.f, 0.f);
      }
      store_head(O, r.o, b, h, d.H, d.T, d.D);
    }
  });
  return r;
}

AttentionGrads causal_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& o, const TensorView& lse, float scale) {
  const char* op = "causal_attention_backward";
  trace::OpScope scope(op);
  const Dims d = check(op, q, k, v, scale);
  expect_heads(dout, op, "dout", d.B, d.H, d.T, d.D, q.dtype);
  expect_heads(o, op, "o", d.B, d.H, d.T, d.D, q.dtype);
  OT_CHECK(lse.defined() && lse.dtype == DType::f32 && lse.ndim == 3 && lse.sizes[0] == d.B && lse.sizes[1] == d.H && lse.sizes[2] == d.T &&
               lse.is_contiguous(),
           op, "lse", ::ot::detail::cat("the forward's contiguous fp32 [", d.B, ", ", d.H, ", ", d.T, "]"), lse.defined() ? lse.shape_str() : "undefined");
  AttentionGrads g;
  g.dq = pooled_empty(q.dtype, {d.B, d.H, d.T, d.D});
  g.dk = pooled_empty(q.dtype, {d.B, d.H, d.S, d.D});
  g.dv = pooled_empty(q.dtype, {d.B, d.H, d.S, d.D});
  const double flops = 10.0 * double(d.B * d.H) * double(d.T) * double(d.S) * double(d.D);
  scope.flops(flops).args(q.shape_str() + " k " + k.shape_str());
  if (d.B * d.H == 0 || d.D == 0 || d.S == 0) return g;
  if (d.T == 0) {  // no query: no gradient reaches k or v
    std::fill(static_cast<char*>(g.dk.view().data), static_cast<char*>(g.dk.view().data) + g.dk.view().nbytes(), 0);
    std::fill(static_cast<char*>(g.dv.view().data), static_cast<char*>(g.dv.view().data) + g.dv.view().nbytes(), 0);
    return g;
  }
  if (cpu::force_ref()) {
    ref::causal_attention_backward(dout, q, k, v, scale, g.dq, g.dk, g.dv);
    return g;
  }
  const int64_t off = d.S - d.T, T = d.T, S = d.S, D = d.D;
  const double bytes = 3.0 * double(q.nbytes() + k.nbytes() + v.nbytes() + o.nbytes());
  const attn::SoftmaxRows softmax = cpu::select_kernel(op, kSoftmaxKernels).fn;
  parallel_for_sized(d.B * d.H, bytes, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> buf;
    float* Q = scratch(buf, size_t(3 * T * D + 2 * S * D + 2 * T * S + T + T * D + 2 * S * D));
    float *K = Q + T * D, *V = K + S * D, *dO = V + S * D, *O = dO + T * D, *P = O + T * D, *dS = P + T * S, *Di = dS + T * S;
    float *dQ = Di + T, *dK = dQ + T * D, *dV = dK + S * D;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / d.H, h = i % d.H;
      head_f32(q, b, h, T, D, Q);
      head_f32(k, b, h, S, D, K);
      head_f32(v, b, h, S, D, V);
      head_f32(dout, b, h, T, D, dO);
      head_f32(o, b, h, T, D, O);
      for (int64_t t = 0; t < T; ++t) {
        float s = 0.f;
        for (int64_t c = 0; c < D; ++c) s += dO[t * D + c] * O[t * D + c];
        Di[t] = s;
      }
      std::fill(dK, dK + 2 * S * D, 0.f);  // dK and dV: each query block adds its keys' share
      for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, T - t0), n = off + t0 + m;
        float *Pb = P + t0 * S, *dSb = dS + t0 * S;
        gemm::matmul(mat(Q + t0 * D, m, D), mat(K, n, D).t(), mut(Pb, m, n, S), scale, 0.f);
        softmax(Pb, m, n, S, off + t0, nullptr, lse.ptr<float>() + i * T + t0);
        gemm::matmul(mat(dO + t0 * D, m, D), mat(V, n, D).t(), mut(dSb, m, n, S), 1.f, 0.f);  // dP
        for (int64_t t = 0; t < m; ++t)
          for (int64_t j = 0; j < n; ++j) dSb[t * S + j] = Pb[t * S + j] * (dSb[t * S + j] - Di[t0 + t]);
        gemm::matmul(mat(dSb, m, n, S), mat(K, n, D), mut(dQ + t0 * D, m, D), scale, 0.f);
        gemm::matmul(mat(dSb, m, n, S).t(), mat(Q + t0 * D, m, D), mut(dK, n, D), scale, 1.f);
        gemm::matmul(mat(Pb, m, n, S).t(), mat(dO + t0 * D, m, D), mut(dV, n, D), 1.f, 1.f);
      }
      store_head(dQ, g.dq, b, h, d.H, T, D);
      store_head(dK, g.dk, b, h, d.H, S, D);
      store_head(dV, g.dv, b, h, d.H, S, D);
    }
  });
  return g;
}

}  // namespace ot
