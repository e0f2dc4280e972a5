// Optimizer steps over many tensors in one call (the per-parameter loop of torch.optim runs ~10
// element-wise ops per tensor: for a model of many small tensors that is dispatch, not memory).
//   adamw_step: torch.optim.AdamW's update (decoupled weight decay, bias corrections, no amsgrad),
//     in place, for every i: p *= 1 - lr wd; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
//     p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps); step counts from 1.
//     grad_scale multiplies g first (the factor of a gradient clip, 1 for none).
//   multi_tensor_l2_norm: sqrt of the sum of squares over all the tensors (fp64 partial sums in a fixed order:
//     the same bits whatever the thread count), for clip_grad_norm.
// Parameters, gradients and both moments fp32 and contiguous, each list the same shapes; nothing is
// written when an argument is wrong.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/tensor.h"

namespace ot::optim {

struct AdamW {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 1e-2f;
  int64_t step = 1;
  float grad_scale = 1.f;
};
void adamw_step(const std::vector<TensorView>& params, const std::vector<TensorView>& grads, const std::vector<TensorView>& exp_avg,
                const std::vector<TensorView>& exp_avg_sq, const AdamW& c);
double multi_tensor_l2_norm(const std::vector<TensorView>& tensors);

// fp64 references (the OT_FORCE_REF path and the tests' ground truth).
namespace ref {
void adamw_step(const std::vector<TensorView>& params, const std::vector<TensorView>& grads, const std::vector<TensorView>& exp_avg,
                const std::vector<TensorView>& exp_avg_sq, const AdamW& c);
double multi_tensor_l2_norm(const std::vector<TensorView>& tensors);
}  // namespace ref

}  // namespace ot::optim
