// Plain fp64 RMSNorm, add + RMSNorm and the backward, row by row, with the formulas of ot/norm.h.
#include "src/ref/rms_norm_ref.h"

#include <cmath>
#include <vector>

#include "src/ref/layer_elem.h"

namespace ot::ref {
using gdn::ref::rd;
using gdn::ref::wr;

namespace {
double rstd_of(const std::vector<double>& x, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  return 1.0 / std::sqrt(ss / double(x.size()) + eps);
}
}  // namespace

void rms_norm(const TensorView& x, const TensorView& x2, const TensorView& weight, double eps, const TensorView& x_sum,
              const TensorView& y, const TensorView& rstd) {
  const int64_t rows = x.sizes[0], N = x.sizes[1];
  std::vector<double> u(static_cast<size_t>(N));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < N; ++i) {
      u[size_t(i)] = rd(x, {r, i});
      if (x2.defined()) {  // rounded to x_sum's dtype, then read back: the value the fast path normalises
        wr(x_sum, {r, i}, u[size_t(i)] + rd(x2, {r, i}));
        u[size_t(i)] = rd(x_sum, {r, i});
      }
    }
    const double rs = rstd_of(u, eps);
    wr(rstd, {r}, rs);
    for (int64_t i = 0; i < N; ++i) wr(y, {r, i}, u[size_t(i)] * rs * rd(weight, {i}));
  }
}

void rms_norm_bwd(const TensorView& dy, const TensorView& x, const TensorView& weight, double eps, const TensorView& extra,
                  const TensorView& dx, const TensorView& dweight) {
  const int64_t rows = x.sizes[0], N = x.sizes[1];
  std::vector<double> xh(static_cast<size_t>(N)), dw(static_cast<size_t>(N), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < N; ++i) xh[size_t(i)] = rd(x, {r, i});
    const double rs = rstd_of(xh, eps);
    double dot = 0;
    for (int64_t i = 0; i < N; ++i) {
      xh[size_t(i)] *= rs;
      const double g = rd(dy, {r, i});
      dw[size_t(i)] += g * xh[size_t(i)];
      dot += g * rd(weight, {i}) * xh[size_t(i)];
    }
    const double mean = dot / double(N);
    for (int64_t i = 0; i < N; ++i) {
      double d = rs * (rd(dy, {r, i}) * rd(weight, {i}) - xh[size_t(i)] * mean);
      if (extra.defined()) d += rd(extra, {r, i});
      wr(dx, {r, i}, d);
    }
  }
  for (int64_t i = 0; i < N; ++i) wr(dweight, {i}, dw[size_t(i)]);
}

}  // namespace ot::ref
