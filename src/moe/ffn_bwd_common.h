// Pieces shared by moe_ffn_forward_train and moe_ffn_backward.
#pragma once
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "src/moe/bwd_common.h"

namespace ot::moe::bwd {

struct FfnDims { int64_t T = 0, H = 0, E = 0, K = 0, I = 0, Is = 0; };
void check_ffn(const char* op, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o, FfnDims& d);
// One span per expert with kept rows (rows [offset, offset + count) of the sorted order).
std::vector<Span> expert_spans(const RoutingPlan& p);
// Sub-matrix [r0, r0 + nr) x [c0, c0 + nc) of a 2-D view.
gemm::MatView sub(const TensorView& v, int64_t r0, int64_t nr, int64_t c0, int64_t nc);
gemm::MutMatView msub(const TensorView& v, int64_t r0, int64_t nr, int64_t c0, int64_t nc);
// out[i] = src[rows[i]] (same dtype).
Tensor gather_rows(const TensorView& src, const int32_t* rows, int64_t n);
// a = silu(gate) * up rounded to z's dtype (as the forward stores it); with `scaled`, also
// scale[i] * a[i] (same dtype).
Tensor swiglu_rows(const TensorView& z, const float* scale, Tensor* scaled);
// z[r0 + i, :] = [v Wg | v Wu] for the n rows of v.
void gate_up(const gemm::MatView& v, const TensorView& wg, const TensorView& wu, const TensorView& z, int64_t r0);
// v itself when its last dim is contiguous (rows addressable by one stride), else a contiguous
// copy held in `hold` (2-D or 3-D weight views).
TensorView row_major(const TensorView& v, Tensor& hold);
// Sorted row of each flat (t, k) slot, -1 when the pair was dropped.
std::vector<int32_t> row_of_slot(const RoutingPlan& p, int64_t TK);
// The router stage of moe_ffn through the public routers (gating_top_k with its scores).
GatingResult route(const TensorView& logits, const MoeFfnOptions& o);

}  // namespace ot::moe::bwd
