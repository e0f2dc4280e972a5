// Plain reference of moe_ffn (ot/moe/ffn.h) on the unpacked weights. The caller validates the
// arguments; the reference takes its own router decisions, capacity and expert loop.
#pragma once
#include "ot/moe/ffn.h"

namespace ot::moe::refimpl {

// gate/up [E, H, I], down [E, I, H]; shared_*: the shared expert's [H, Is] / [Is, H] (or [1, ..]) weights.
// int8_rows: the routed experts' inputs (x, and the intermediate) are quantised per token to int8
// and dequantised before their products (W8A8 experts); shared_int8_rows: the shared expert's too.
// The shared expert (opt.shared or opt.shared_quant) is given by its unpacked weights.
MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight, const TensorView& gate, const TensorView& up, const TensorView& down,
                     const MoeFfnOptions& o, const TensorView& shared_gate, const TensorView& shared_up, const TensorView& shared_down,
                     bool int8_rows = false, bool shared_int8_rows = false);

// The router stage of moe_ffn on fp32 logits [T, E]: the reference router of o.router, then the
// optional renormalisation of the k weights (norm_topk_prob).
GatingResult ffn_router(const TensorView& logits, const MoeFfnOptions& o);
// Expert capacity of a moe_ffn call: ceil(T * k / E * capacity_factor) when the factor is > 0,
// else expert_capacity (-1: dropless).
int64_t ffn_capacity(const MoeFfnOptions& o, int64_t T, int64_t E);

}  // namespace ot::moe::refimpl
