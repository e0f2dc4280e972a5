// RMSNorm (include/ot/norm.h) as torch ops, with torch_npu's names and outputs: rms_norm -> (y, rstd),
// add_rms_norm -> (y, rstd, x_sum), and the backward -> (dx, dweight fp32).
#include "bridge.h"
#include "ops.h"
#include "ot/norm.h"

namespace ot::py {

std::tuple<Tensor, Tensor> rms_norm(const Tensor& x, const Tensor& gamma, double epsilon) {
  const char* op = "rms_norm";
  auto r = ot::rms_norm(view(x, op, "x"), view(gamma, op, "gamma"), float(epsilon));
  return {wrap(r.y), wrap(r.rstd)};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm(const Tensor& x1, const Tensor& x2, const Tensor& gamma, double epsilon) {
  const char* op = "add_rms_norm";
  auto r = ot::add_rms_norm(view(x1, op, "x1"), view(x2, op, "x2"), view(gamma, op, "gamma"), float(epsilon));
  return {wrap(r.y), wrap(r.rstd), wrap(r.x_sum)};
}

std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const OptTensor& rstd, double epsilon,
                                             const OptTensor& dx_extra) {
  const char* op = "rms_norm_backward";
  auto g = ot::rms_norm_bwd(view(dy, op, "dy"), view(x, op, "x"), view(gamma, op, "gamma"), view(rstd, op, "rstd"), float(epsilon),
                            view(dx_extra, op, "dx_extra"));
  return {wrap(g.dx), wrap(g.dweight)};
}

}  // namespace ot::py
