// Load-balancing losses and capacity (spec section 11, Megatron's definitions).
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot::moe {

// Switch/GShard: coeff * E / (K * T^2) * sum_i (sum_t probs[t,i]) * tokens_per_expert[i].
// probs [T, E] float; tokens_per_expert [E] int32/int64 (may be global counts); T = probs rows.
float moe_aux_loss(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff = 1.f);
// ST-MoE z-loss: coeff * mean_t logsumexp(logits[t])^2; mask [T] u8 (optional) selects valid tokens.
float moe_z_loss(const TensorView& logits, float coeff = 1.f, const TensorView& mask = {});
// Megatron get_capacity: ceil(T * K / E * capacity_factor), at least min_capacity.
int64_t moe_capacity(int64_t tokens, int64_t k, int64_t experts, double capacity_factor, int64_t min_capacity = 0);

namespace ref {
float moe_aux_loss(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff = 1.f);
float moe_z_loss(const TensorView& logits, float coeff = 1.f, const TensorView& mask = {});
}  // namespace ref

}  // namespace ot::moe
