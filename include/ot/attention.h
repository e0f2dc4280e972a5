// Causal softmax attention of one layer's heads (the full-attention layers of a hybrid model), the
// score matrix of a head kept in the thread's cache instead of [B, H, T, S] tensors in memory:
//   o[t] = sum_j softmax_j(scale q[t] . k[j]) v[j],  j <= (S - T) + t
// q [B, H, T, D]; k, v [B, H, S, D] (S >= T: the queries are the last T positions, as in a decode
// step or a prefill on a KV cache); fp32 / bf16 / fp16, any strides, one dtype; computed in fp32.
// Returns o [B, H, T, D] in q's dtype and lse [B, H, T] fp32 (each row's log-sum-exp) for the
// backward, which recomputes the probabilities from it: dq, dk, dv in q's dtype.
#pragma once
#include "ot/tensor.h"

namespace ot {

struct AttentionOut {
  Tensor o, lse;
};
AttentionOut causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, float scale);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads causal_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& o, const TensorView& lse, float scale);

namespace ref {
// fp64, every argument checked by the entry points; outputs allocated by the caller (o, dq, dk, dv
// [B, H, *, D], lse [B, H, T]).
void causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, double scale, const TensorView& o, const TensorView& lse);
void causal_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v, double scale,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv);
}  // namespace ref

}  // namespace ot
