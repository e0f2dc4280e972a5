// moe_ffn's validation and router stage, shared by the fast path and the reference.
#pragma once
#include <functional>
#include <string>

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
// The checks moe_expert_ffn makes on out (a contiguous float [*, H]) and on its rows (offsets,
// expert range, gather/scatter ids), for either expert store.
void check_out_and_rows(const char* op, const TensorView& out, int64_t H, const ExpertRows& rows, int64_t E, int64_t x_rows);
// The expert store a moe_ffn call runs on (bf16/fp16/fp32 MoeExperts or QuantMoeExperts): its
// intermediate size, the kernel name the trace shows for experts of `rows` rows, and the grouped
// FFN that adds every routed row's weighted output into acc [T, H] fp32 (and, given a shared
// expert, every token's shared-expert output, before the routed rows).
struct FfnExperts {
  int64_t intermediate = 0;
  std::function<std::string(int64_t rows)> kernel;
  std::function<void(const TensorView& x, const ExpertRows& rows, const TensorView& acc, const MoeExperts* shared)> run;
};
// acc += the shared expert (expert 0 of shared, weight 1) on every row of x.
void shared_ffn(const TensorView& x, const MoeExperts& shared, const TensorView& acc);
// acc += the shared expert (expert 0 of shared, every row of x) and the routed rows of ex, in one
// grouped GEMM chain.
void shared_and_routed_ffn(const TensorView& x, const MoeExperts& shared, const MoeExperts& ex, const ExpertRows& rows, const TensorView& acc);
// moe_ffn after plan_ffn: router GEMM, gating, routing plan, residual / shared expert, the experts,
// the cast to x's dtype.
MoeFfnResult run_ffn(const FfnPlan& p, const TensorView& x, const gemm::PackedB& router, const MoeFfnOptions& o, const FfnExperts& ex);
}  // namespace ot::moe::impl
