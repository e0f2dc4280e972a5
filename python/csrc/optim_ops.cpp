// Multi-tensor optimizer steps (include/ot/optim.h) as torch ops: adamw_step updates params,
// exp_avg and exp_avg_sq in place; multi_tensor_l2_norm for gradient clipping.
#include <vector>

#include "bridge.h"
#include "ops.h"
#include "ot/optim.h"

namespace ot::py {
namespace {
std::vector<ot::TensorView> views(at::TensorList ts, const char* op, const char* arg) {
  std::vector<ot::TensorView> v;
  v.reserve(ts.size());
  for (const at::Tensor& t : ts) v.push_back(view(t, op, arg));
  return v;
}
}  // namespace

void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step, double grad_scale) {
  const char* op = "adamw_step";
  optim::AdamW c;
  c.lr = float(lr), c.beta1 = float(beta1), c.beta2 = float(beta2), c.eps = float(eps), c.weight_decay = float(weight_decay);
  c.step = step, c.grad_scale = float(grad_scale);
  optim::adamw_step(views(params, op, "params"), views(grads, op, "grads"), views(exp_avg, op, "exp_avg"),
                    views(exp_avg_sq, op, "exp_avg_sq"), c);
}

double multi_tensor_l2_norm(at::TensorList tensors) {
  return optim::multi_tensor_l2_norm(views(tensors, "multi_tensor_l2_norm", "tensors"));
}

}  // namespace ot::py
