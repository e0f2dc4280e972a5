// moe_ffn's validation and router stage, shared by the fast path and the reference.
#pragma once
#include "ot/moe/ffn.h"

namespace ot::moe::impl {
struct FfnPlan {
  int64_t T = 0, H = 0, E = 0, K = 0, cap = -1;
};
FfnPlan plan_ffn(const TensorView& x, int64_t router_h, int64_t router_e, int64_t H, int64_t I, DType wdt, int64_t E, const MoeFfnOptions& o,
                 int64_t shared_h, DType shared_dt);
// Expert capacity of a moe_ffn call: moe_capacity(T, k, E, capacity_factor) when the factor is > 0,
// else expert_capacity. A NaN, infinite or negative factor is an error (it used to fall through to
// dropless silently).
int64_t ffn_capacity(const char* op, const MoeFfnOptions& o, int64_t T, int64_t E);
GatingResult run_router(const TensorView& logits, const MoeFfnOptions& o);
}  // namespace ot::moe::impl
