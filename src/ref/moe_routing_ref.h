// Plain references of the routing operators (ot/moe/routing.h): the OT_FORCE_REF path and the
// tests' ground truth. The caller validates the arguments; the reference derives everything else
// (sort orders, capacity slots, counts, quantisation) from the public inputs itself.
#pragma once
#include <cstdint>

#include "ot/moe/routing.h"

namespace ot::moe::refimpl {

InitRoutingResult init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num);
InitRoutingV2Result init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o);
TokenPermuteResult token_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens, bool padded);
Tensor token_unpermute(const TensorView& permuted, const TensorView& sorted_indices, const TensorView& probs, bool padded,
                       int64_t restore_rows);
Tensor compute_expert_tokens(const TensorView& sorted_experts, int64_t num_experts);
ReRoutingResult re_routing(const TensorView& tokens, const TensorView& expert_token_num_per_rank, const TensorView& per_token_scales);

}  // namespace ot::moe::refimpl
