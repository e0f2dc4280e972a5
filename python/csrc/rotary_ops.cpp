// Rotary embedding (include/ot/rotary.h) as torch ops: rotary_mul(x, cos, sin) (torch_npu's
// npu_rotary_mul, rotate-half form) and its backward.
#include "bridge.h"
#include "ops.h"
#include "ot/rotary.h"

namespace ot::py {

Tensor rotary_mul(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = "rotary_mul";
  return wrap(ot::rotary_mul(view(x, op, "x"), view(cos, op, "cos"), view(sin, op, "sin")));
}

Tensor rotary_mul_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin) {
  const char* op = "rotary_mul_backward";
  return wrap(ot::rotary_mul_backward(view(dy, op, "x"), view(cos, op, "cos"), view(sin, op, "sin")));
}

}  // namespace ot::py
