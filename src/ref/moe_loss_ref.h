// Plain references of the load-balancing losses (ot/moe/loss.h), term by term in fp64. The caller
// validates the arguments.
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot::moe::refimpl {

float aux_loss(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff);
float z_loss(const TensorView& logits, float coeff, const TensorView& mask);

}  // namespace ot::moe::refimpl
