// Plain fp64 AdamW step and L2 norm over tensor lists (ot/optim.h), element by element.
#include <cmath>
#include <vector>

#include "ot/optim.h"

namespace ot::optim::ref {

void adamw_step(const std::vector<TensorView>& params, const std::vector<TensorView>& grads, const std::vector<TensorView>& exp_avg,
                const std::vector<TensorView>& exp_avg_sq, const AdamW& c) {
  const double b1 = c.beta1, b2 = c.beta2, bc1 = 1 - std::pow(b1, double(c.step)), bc2 = std::sqrt(1 - std::pow(b2, double(c.step)));
  for (size_t t = 0; t < params.size(); ++t)
    for (int64_t i = 0; i < params[t].numel(); ++i) {
      const double g = get_as_double(grads[t], i) * c.grad_scale;
      double p = get_as_double(params[t], i) * (1 - double(c.lr) * c.weight_decay);
      const double m = b1 * get_as_double(exp_avg[t], i) + (1 - b1) * g;
      const double v = b2 * get_as_double(exp_avg_sq[t], i) + (1 - b2) * g * g;
      p -= double(c.lr) / bc1 * m / (std::sqrt(v) / bc2 + c.eps);
      set_from_double(params[t], i, p);
      set_from_double(exp_avg[t], i, m);
      set_from_double(exp_avg_sq[t], i, v);
    }
}

double multi_tensor_l2_norm(const std::vector<TensorView>& tensors) {
  double s = 0;
  for (const TensorView& t : tensors)
    for (int64_t i = 0; i < t.numel(); ++i) s += get_as_double(t, i) * get_as_double(t, i);
  return std::sqrt(s);
}

}  // namespace ot::optim::ref
