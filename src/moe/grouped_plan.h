// Validated grouped matmul / finalize / final-optimizer-mm calls, executed by the fast paths.
#pragma once
#include <vector>

#include "ot/moe/grouped.h"

namespace ot::moe::impl {

struct GmmPlan {
  int64_t M = 0, K = 0, N = 0, G = 0, n_out = 0;
  gemm::Act act = gemm::Act::none;
  std::vector<GroupSpan> spans;
  std::vector<float> bias;  // [G, N] fp32 or empty
  Tensor hx;
  TensorView x, weight;     // x contiguous; weight as given ([G, K, N] with any strides)
};
GmmPlan plan_gmm(const char* op, const TensorView& x, int64_t G, int64_t K, int64_t N, DType wdt, const TensorView& group_list,
                 GroupListType type, const TensorView& bias, gemm::Act act);

struct FinalizePlan {
  int64_t N = 0, K = 1, H = 0, R = 0, E = 0;
  int mode = 0;
  Tensor h[7];
  TensorView ex, idx, x1, x2, bias, scales, expert_idx;  // contiguous
};
FinalizePlan plan_finalize(const char* op, const TensorView& expanded_x, const TensorView& expanded_row_idx, const TensorView& x1,
                           const TensorView& x2, const TensorView& bias, const TensorView& scales, const TensorView& expert_idx, int mode);

// moe_final_optimizer_mm: y[t] = x[t] @ weight[idx[t]].
struct FomPlan {
  int64_t T = 0, H = 0, I = 0, E = 0;
  Tensor hx, hi;
  TensorView x, idx, weight;  // x, idx contiguous; weight [E, H, I] as given
};

}  // namespace ot::moe::impl
