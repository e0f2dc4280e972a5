// grouped_matmul_backward: per group, dz = act'(z) * dy, dx = dz @ W^T, dW = x^T @ dz, db = sum(dz).
// dx is the engine's NT form on W as stored and dW its TN form (K = the group's rows), each one
// grouped call over all groups; strided weights / non-fp32 gradient buffers use gemm::matmul on
// transposed views.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace bwd {
void for_each_span(const std::vector<Span>& spans, bool distinct_groups, FnRef<void(const Span&)> fn) {
  // Many groups: one group per thread at a time (each matmul single-threaded, dynamic balance).
  // Few groups or repeated ids (key-value may list a group twice): each matmul uses all threads.
  if (distinct_groups && int64_t(spans.size()) >= 2 * num_threads()) {
    parallel_for_dynamic(int64_t(spans.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(spans[size_t(i)]);
    });
  } else {
    for (const auto& s : spans) fn(s);
  }
}

bool groups_distinct(const std::vector<Span>& spans, int64_t G) {
  std::vector<char> seen(static_cast<size_t>(G), 0);
  for (const auto& s : spans) {
    if (seen[size_t(s.group)]) return false;
    seen[size_t(s.group)] = 1;
  }
  return true;
}

static gemm::MatView rows_of(const TensorView& v, int64_t r0, int64_t n) {
  return {static_cast<const char*>(v.data) + r0 * v.strides[0] * int64_t(dtype_size(v.dtype)), v.dtype, n, v.sizes[1], v.strides[0],
          v.strides[1]};
}
static gemm::MutMatView mut_rows_of(const TensorView& v, int64_t r0, int64_t n) {
  return {static_cast<char*>(v.data) + r0 * v.strides[0] * int64_t(dtype_size(v.dtype)), v.dtype, n, v.sizes[1], v.strides[0],
          v.strides[1]};
}

// Zeroes a float view of any strides (groups without rows).
static void zero_view(const TensorView& v) {
  if (v.is_contiguous()) { std::memset(v.data, 0, v.nbytes()); return; }
  Tensor z = Tensor::zeros(v.dtype, v.shape());
  copy_into(z, v);
}
}  // namespace bwd

GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt) {
  const char* op = "grouped_matmul_backward";
  auto p = bwd::plan_grouped_matmul_backward(op, dy, x, w, group_list, opt);
  if (cpu::force_ref()) return ref::grouped_matmul_backward(dy, x, w, group_list, opt);
  const int64_t M = p.M, K = p.K, N = p.N, G = p.G;
  trace::OpScope scope("grouped_matmul_backward");
  if (scope.active()) scope.kernel(gemm::kernel_name(x.dtype, w.dtype, M)).args(x.shape_str() + " x " + w.shape_str() + " " + gemm::act_name(opt.act));
  scope.flops(2.0 * M * K * N * ((opt.need_dx ? 1 : 0) + (opt.need_dweight ? 1 : 0) + (opt.act != gemm::Act::none && !opt.pre_act.defined() ? 1 : 0)));
  // Parallel over groups only when they are distinct and the work pays for the threads.
  const bool distinct = bwd::groups_distinct(p.spans, G) && M * K * N >= (int64_t(1) << 18);

  // dz: dy itself without activation; otherwise act'(z) * dy in dy's dtype (keeps bf16 GEMMs bf16).
  TensorView dz = dy;
  Tensor dz_hold, z_hold;
  if (opt.act != gemm::Act::none) {
    TensorView z = opt.pre_act;
    if (!z.defined()) {  // recompute z = x @ W + b per group, fp32 as in the forward's accumulator
      z_hold = pooled_empty(DType::f32, {M, N});
      z = z_hold;
      bwd::for_each_span(p.spans, distinct, [&](const bwd::Span& s) {
        gemm::matmul(bwd::rows_of(x, s.offset, s.count), gemm::MatView::of(w.select(0, s.group)), bwd::mut_rows_of(z, s.offset, s.count));
        if (opt.bias.defined()) {
          std::vector<float> b(static_cast<size_t>(N));
          for (int64_t n = 0; n < N; ++n) b[size_t(n)] = float(get_as_double(opt.bias, s.group * N + n));
          for (int64_t m = s.offset; m < s.offset + s.count; ++m)
            for (int64_t n = 0; n < N; ++n) z_hold.ptr<float>()[m * N + n] += b[size_t(n)];
        }
      });
    }
    dz_hold = pooled_empty(dy.dtype, {M, N});
    dz = dz_hold;
    bwd::parallel_rows(M, N * 8, [&](int64_t m0, int64_t m1) {
      bwd::act_backward_rows(opt.act, m0, m1, N, z.data, z.dtype, z.strides[0], dy.data, dy.dtype, dy.strides[0], dz.data, dz.dtype, N);
    });
  }

  GroupedMatmulGrads r;
  auto row_ptr = [](const TensorView& v, int64_t r) { return static_cast<const char*>(v.data) + r * v.strides[0] * int64_t(dtype_size(v.dtype)); };
  if (opt.need_dx) {
    r.dx = pooled_empty(x.dtype, {M, K});
    if (w.strides[2] == 1) {
      // NT on W [K, N] as stored (rows k, N contiguous): dx = dz W^T, fp32 then x's dtype.
      Tensor dxf = x.dtype == DType::f32 ? r.dx : pooled_empty(DType::f32, {M, K});
      std::vector<gemm::NtJob> jobs;
      for (const auto& s : p.spans) {
        gemm::NtJob j;
        j.M = s.count;
        j.N = K;
        j.a = {row_ptr(dz, s.offset), dz.dtype, dz.strides[0], nullptr};
        j.w_dtype = w.dtype;
        j.w[0] = {static_cast<const char*>(w.data) + s.group * w.strides[0] * int64_t(dtype_size(w.dtype)), N, w.strides[1]};
        j.c = dxf.ptr<float>() + s.offset * K;
        j.ldc = K;
        jobs.push_back(j);
      }
      gemm::grouped_gemm_nt(jobs.data(), int64_t(jobs.size()));
      if (x.dtype != DType::f32) convert_from_f32(dxf.ptr<float>(), r.dx.view().data, x.dtype, M * K);
    } else {
      bwd::for_each_span(p.spans, distinct, [&](const bwd::Span& s) {
        gemm::matmul(bwd::rows_of(dz, s.offset, s.count), gemm::MatView::of(w.select(0, s.group)).t(),
                     bwd::mut_rows_of(r.dx, s.offset, s.count));
      });
    }
  }
  std::vector<char> seen(static_cast<size_t>(G), 0);
  for (const auto& s : p.spans) seen[size_t(s.group)] = 1;
  if (opt.need_dweight) {
    TensorView dw = opt.dweight_out;
    if (!dw.defined()) { r.dweight = Tensor::empty(DType::f32, {G, K, N}); dw = r.dweight; }
    const bool acc = opt.accumulate && opt.dweight_out.defined();
    // With repeated ids the spans run one after another, so the second one adds.
    std::vector<char> written(static_cast<size_t>(G), 0);
    if (dw.dtype == DType::f32 && dw.strides[2] == 1) {
      // TN: dW[g] = x_g^T dz_g with K = the group's rows; one grouped call when groups are distinct.
      const bool all = bwd::groups_distinct(p.spans, G);
      std::vector<gemm::TnJob> jobs;
      for (const auto& s : p.spans) {
        jobs.push_back({s.count, K, N, row_ptr(x, s.offset), row_ptr(dz, s.offset), x.dtype, dz.dtype, x.strides[0], dz.strides[0],
                        dw.ptr<float>() + s.group * dw.strides[0], dw.strides[1], acc || written[size_t(s.group)]});
        written[size_t(s.group)] = 1;
        if (!all) { gemm::grouped_gemm_tn(&jobs.back(), 1); jobs.clear(); }
      }
      gemm::grouped_gemm_tn(jobs.data(), int64_t(jobs.size()));
    } else {
      bwd::for_each_span(p.spans, distinct, [&](const bwd::Span& s) {
        float beta = acc || written[size_t(s.group)] ? 1.f : 0.f;
        written[size_t(s.group)] = 1;
        gemm::matmul(bwd::rows_of(x, s.offset, s.count).t(), bwd::rows_of(dz, s.offset, s.count),
                     gemm::MutMatView::of(dw.select(0, s.group)), 1.f, beta);
      });
    }
    if (!acc)
      for (int64_t g = 0; g < G; ++g)
        if (!seen[size_t(g)]) bwd::zero_view(dw.select(0, g));
  }
  if (opt.need_dbias) {
    TensorView db = opt.dbias_out;
    if (!db.defined()) { r.dbias = Tensor::empty(DType::f32, {G, N}); db = r.dbias; }
    const bool acc = opt.accumulate && opt.dbias_out.defined();
    bwd::parallel_rows(G, M * N / std::max<int64_t>(G, 1) + N, [&](int64_t g0, int64_t g1) {
      std::vector<float> sum(static_cast<size_t>(N)), row(static_cast<size_t>(N));
      for (int64_t g = g0; g < g1; ++g) {
        if (!seen[size_t(g)] && acc) continue;
        std::fill(sum.begin(), sum.end(), 0.f);
        for (const auto& s : p.spans) {
          if (s.group != g) continue;
          for (int64_t m = s.offset; m < s.offset + s.count; ++m) {
            convert_to_f32(static_cast<const char*>(dz.data) + m * dz.strides[0] * int64_t(dtype_size(dz.dtype)), dz.dtype, row.data(), N);
            for (int64_t n = 0; n < N; ++n) sum[size_t(n)] += row[size_t(n)];
          }
        }
        for (int64_t n = 0; n < N; ++n) {
          int64_t flat = g * N + n;
          set_from_double(db, flat, sum[size_t(n)] + (acc ? get_as_double(db, flat) : 0.0));
        }
      }
    });
  }
  return r;
}

}  // namespace ot::moe
