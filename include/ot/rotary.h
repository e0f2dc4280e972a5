// Rotary position embedding in the rotate-half form (HF's apply_rotary_pos_emb, torch_npu's
// npu_rotary_mul): y = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]].
// x [..., T, D] (D even) fp32 / bf16 / fp16 with any strides; cos, sin [T, D] (fp32 or x's dtype),
// the same for every leading index; y contiguous in x's dtype, computed in fp32 and rounded once.
// The backward is the rotation by the opposite angle: dx = rotary_mul(dy, cos, -sin)
// (rotary_mul_backward, no gradient for cos and sin).
#pragma once
#include "ot/tensor.h"

namespace ot {

Tensor rotary_mul(const TensorView& x, const TensorView& cos, const TensorView& sin);
Tensor rotary_mul_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin);

namespace ref {
// fp64: x [rows, T, D] view, y likewise (allocated by the caller); sign -1 rotates backwards.
void rotary_mul(const TensorView& x, const TensorView& cos, const TensorView& sin, double sign, const TensorView& y);
}  // namespace ref

}  // namespace ot
