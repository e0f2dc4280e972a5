// MoE backward (training): gradients of the grouped matmul and its activation epilogue.
// Shape letters: M rows (tokens x k, sorted by expert), K in features, N out features, G groups.
// Conventions: activations' gradients come back in the activation dtype; weight and bias gradients
// are fp32 (master-weight precision); compute accumulates in fp32 (reference: fp64). Every entry
// point validates all arguments (ot::Error naming the argument) before writing anything, and
// OT_FORCE_REF=1 routes to ot::moe::ref.
#pragma once
#include <cstdint>

#include "ot/gemm.h"
#include "ot/tensor.h"

namespace ot::moe {

// ---- activation epilogue ----------------------------------------------------------------------
// Gradient of y = act(z) with respect to z. For Act::swiglu, z [M, 2N] = [gate | up] and
// y = silu(gate) * up [M, N]; otherwise z and y are [M, N]. dz: z's shape, f32/bf16/f16.
void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);

// ---- grouped_matmul_backward --------------------------------------------------------------------
// Forward (moe grouped_matmul, M-split): for the rows r of group g, y[r] = act(x[r] @ W[g] + b[g]).
//   dz     = act'(z) * dy            z = x @ W + b is recomputed (one grouped GEMM) unless given:
//                                    storing z costs M x N per layer, recomputing it costs the
//                                    forward's FLOPs again, so callers that keep it pass it in.
//   dx[r]  = dz[r] @ W[g]^T          (matmul on the transposed weight view, no copy)
//   dW[g]  = x_g^T @ dz_g            (matmul on the transposed activation view)
//   db[g]  = sum of dz_g's rows
// group_list: [G] cumsum (type 0) / count (type 1) or [G', 2] (group, count) (type 2), int32 or
// int64, covering all M rows. Groups with no rows get zero weight/bias gradients.
struct GroupedMatmulBackwardOptions {
  int group_list_type = 0;        // 0 cumsum, 1 count, 2 key-value
  gemm::Act act = gemm::Act::none;
  TensorView bias;                // [G, N] forward bias (float), used to recompute z
  TensorView pre_act;             // [M, N] stored z (skips the recompute), any float dtype
  bool need_dx = true, need_dweight = true, need_dbias = false;
  // Optional caller buffers (e.g. fp32 gradient accumulators, or a transposed view of a torch
  // [G, N, K] gradient). When given, the gradient goes there (added when accumulate) and the
  // matching result tensor stays empty.
  TensorView dweight_out;         // [G, K, N] float, any strides
  TensorView dbias_out;           // [G, N] float
  bool accumulate = false;
};
struct GroupedMatmulGrads {
  Tensor dx;       // [M, K] x's dtype
  Tensor dweight;  // [G, K, N] fp32
  Tensor dbias;    // [G, N] fp32
};
// dy [M, N'] (N' = N, or N/2 for swiglu) in x's dtype; x [M, K]; weight [G, K, N] (strided views
// accepted, e.g. torch's [G, N, K] transposed).
GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt = {});

namespace ref {
void act_backward(gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);
GroupedMatmulGrads grouped_matmul_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                                           const TensorView& group_list, const GroupedMatmulBackwardOptions& opt = {});
}  // namespace ref

}  // namespace ot::moe
