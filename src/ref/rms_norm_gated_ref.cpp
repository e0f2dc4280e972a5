// Plain fp64 gated RMSNorm and its backward, group by group, with the formulas of ot/gdn_layer.h.
#include <cmath>
#include <vector>

#include "src/ref/gdn_layer_ref.h"
#include "src/ref/layer_elem.h"

namespace ot::gdn::ref {
namespace {
double silu_of(double z) { return z * sigmoid(z); }
double dsilu_of(double z) {
  double s = sigmoid(z);
  return s * (1 + z * (1 - s));
}
// u[i] = the group's input (x, or x silu(z) when the gate comes first); returns its 1 / rms.
double normalised_input(const TensorView& x, const TensorView& z, int64_t r, int64_t g0, int64_t group, bool norm_before_gate, double eps,
                        std::vector<double>& u) {
  double ss = 0;
  for (int64_t i = 0; i < group; ++i) {
    double v = rd(x, {r, g0 + i});
    if (!norm_before_gate) v *= silu_of(rd(z, {r, g0 + i}));
    u[size_t(i)] = v;
    ss += v * v;
  }
  return 1.0 / std::sqrt(ss / double(group) + eps);
}
}  // namespace

void rms_norm_gated(const TensorView& x, const TensorView& z, const TensorView& weight, double eps, bool norm_before_gate,
                    int64_t group, const TensorView& y, const TensorView& rstd) {
  const int64_t rows = x.sizes[0], N = x.sizes[1];
  std::vector<double> u(static_cast<size_t>(group));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < N; g0 += group) {
      double rs = normalised_input(x, z, r, g0, group, norm_before_gate, eps, u);
      if (rstd.defined()) wr(rstd, {r, g0 / group}, rs);
      for (int64_t i = 0; i < group; ++i) {
        double o = u[size_t(i)] * rs * rd(weight, {g0 + i});
        if (norm_before_gate) o *= silu_of(rd(z, {r, g0 + i}));
        wr(y, {r, g0 + i}, o);
      }
    }
}

void rms_norm_gated_bwd(const TensorView& dy, const TensorView& x, const TensorView& z, const TensorView& weight, double eps,
                        bool norm_before_gate, int64_t group, const TensorView& dx, const TensorView& dz, const TensorView& dweight) {
  const int64_t rows = x.sizes[0], N = x.sizes[1];
  std::vector<double> dw(static_cast<size_t>(N), 0.0), uh(static_cast<size_t>(group)), gu(static_cast<size_t>(group));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < N; g0 += group) {
      // u = x (before gate) or x silu(z); uh = u rstd; gu = dL/duh.
      double rs = normalised_input(x, z, r, g0, group, norm_before_gate, eps, uh), dot = 0;
      for (int64_t i = 0; i < group; ++i) {
        double zi = rd(z, {r, g0 + i}), w = rd(weight, {g0 + i}), g = rd(dy, {r, g0 + i});
        uh[size_t(i)] *= rs;
        double gate = norm_before_gate ? silu_of(zi) : 1.0;
        dw[size_t(g0 + i)] += g * uh[size_t(i)] * gate;
        gu[size_t(i)] = g * w * gate;
        if (norm_before_gate) wr(dz, {r, g0 + i}, g * w * uh[size_t(i)] * dsilu_of(zi));
        dot += gu[size_t(i)] * uh[size_t(i)];
      }
      dot /= double(group);
      for (int64_t i = 0; i < group; ++i) {
        double du = rs * (gu[size_t(i)] - uh[size_t(i)] * dot);
        if (norm_before_gate) {
          wr(dx, {r, g0 + i}, du);
        } else {
          double zi = rd(z, {r, g0 + i});
          wr(dx, {r, g0 + i}, du * silu_of(zi));
          wr(dz, {r, g0 + i}, du * rd(x, {r, g0 + i}) * dsilu_of(zi));
        }
      }
    }
  for (int64_t i = 0; i < N; ++i) wr(dweight, {i}, dw[size_t(i)]);
}

}  // namespace ot::gdn::ref
