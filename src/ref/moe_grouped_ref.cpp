// Grouped matmul, finalize and final-optimizer-mm references: plain loops in fp64 over the spans and rows.
#include <cmath>

#include "src/gemm/epilogue_math.h"
#include "src/moe/common.h"
#include "src/moe/grouped_plan.h"

namespace ot::moe::impl {

void gmm_ref(const GmmPlan& p, const TensorView& y) {
  std::vector<double> acc(static_cast<size_t>(p.N));
  for (const GroupSpan& s : p.spans) {
    TensorView w = p.weight.select(0, s.group);
    for (int64_t m = s.offset; m < s.offset + s.count; ++m) {
      for (int64_t n = 0; n < p.N; ++n) {
        double a = p.bias.empty() ? 0.0 : p.bias[size_t(s.group * p.N + n)];
        for (int64_t k = 0; k < p.K; ++k) a += get_as_double(p.x, m * p.K + k) * get_as_double(w, k * p.N + n);
        acc[size_t(n)] = a;
      }
      for (int64_t n = 0; n < p.n_out; ++n) {
        double v = p.act == gemm::Act::swiglu ? gemm::silu(acc[size_t(n)]) * acc[size_t(n + p.n_out)] : gemm::activate(p.act, acc[size_t(n)]);
        set_from_double(y, m * p.n_out + n, v);
      }
    }
  }
}

void finalize_ref(const FinalizePlan& p, const TensorView& out) {
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t h = 0; h < p.H; ++h) {
      double acc = 0;
      if (p.x1.defined()) acc += get_as_double(p.x1, n * p.H + h);
      if (p.x2.defined()) acc += get_as_double(p.x2, n * p.H + h);
      for (int64_t k = 0; k < p.K; ++k) {
        int64_t pos = p.mode <= 1 ? k * p.N + n : n * p.K + k;
        int64_t d = p.idx.ptr<int32_t>()[pos];
        double row = d == -1 ? 0.0 : get_as_double(p.ex, d * p.H + h);
        if (p.bias.defined()) row += get_as_double(p.bias, int64_t(p.expert_idx.ptr<int32_t>()[n * p.K + k]) * p.H + h);
        acc += (p.scales.defined() ? get_as_double(p.scales, n * p.K + k) : 1.0) * row;
      }
      set_from_double(out, n * p.H + h, acc);
    }
}

void fom_ref(const FomPlan& p, const TensorView& y) {
  const int32_t* ids = p.idx.ptr<int32_t>();
  for (int64_t t = 0; t < p.T; ++t) {
    TensorView w = p.weight.select(0, ids[t]);  // [H, I], any strides
    for (int64_t i = 0; i < p.I; ++i) {
      double s = 0;
      for (int64_t h = 0; h < p.H; ++h) s += get_as_double(p.x, t * p.H + h) * get_as_double(w, h * p.I + i);
      set_from_double(y, t * p.I + i, s);
    }
  }
}

}  // namespace ot::moe::impl
