// Plain references of grouped matmul, finalize routing and the final optimizer mm
// (ot/moe/grouped.h). The caller validates the arguments.
#pragma once
#include "ot/moe/grouped.h"

namespace ot::moe::refimpl {

Tensor grouped_matmul(const TensorView& x, const TensorView& weight, const TensorView& group_list, GroupListType type, const TensorView& bias,
                      gemm::Act act);
// drop_pad_mode 0/1: expanded_row_idx k-major ([k * N + n]), 2/3: token-major ([n * K + k]).
Tensor finalize_routing(const TensorView& expanded_x, const TensorView& expanded_row_idx, const TensorView& x1, const TensorView& x2,
                        const TensorView& bias, const TensorView& scales, const TensorView& expert_idx, int drop_pad_mode);
Tensor final_optimizer_mm(const TensorView& x, const TensorView& weight, const TensorView& token_expert_idx);

}  // namespace ot::moe::refimpl
