// MoE backward ops (include/ot/moe_bwd.h): used by the autograd Functions of ops_transformer.moe.
#include "bridge.h"
#include "ops.h"
#include "ot/moe_bwd.h"

namespace ot::py {

std::tuple<OptTensor, OptTensor, OptTensor> grouped_matmul_backward(
    const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& group_list, int64_t group_list_type,
    int64_t act_type, const OptTensor& bias, const OptTensor& pre_act, bool need_dx, bool need_dweight, bool need_dbias) {
  const char* op = "grouped_matmul_backward";
  moe::GroupedMatmulBackwardOptions o;
  o.group_list_type = int(group_list_type);
  o.act = act_of(act_type, op);
  OptTensor b32;
  if (bias && bias->defined()) b32 = bias->to(c10::ScalarType::Float);
  o.bias = view(b32, op, "bias");
  o.pre_act = view(pre_act, op, "pre_act");
  o.need_dx = need_dx;
  o.need_dweight = need_dweight;
  o.need_dbias = need_dbias;
  auto r = moe::grouped_matmul_backward(view(grad_y, op, "grad_y"), view(x, op, "x"), view(weight, op, "weight"),
                                        view(group_list, op, "group_list"), o);
  return {wrap_opt(r.dx), wrap_opt(r.dweight), wrap_opt(r.dbias)};
}

Tensor moe_act_backward(int64_t act_type, const Tensor& z, const Tensor& dy) {
  const char* op = "moe_act_backward";
  auto a = act_of(act_type, op);
  auto vz = view(z, op, "z");
  Tensor dz = empty(std::vector<int64_t>(z.sizes().begin(), z.sizes().end()), z.scalar_type());
  moe::act_backward(a, vz, view(dy, op, "dy"), view(dz, op, "z"));
  return dz;
}

}  // namespace ot::py
