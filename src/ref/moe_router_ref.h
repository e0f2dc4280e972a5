// Plain references of the three routers (ot/moe/router.h), in fp64. The caller validates the
// arguments (including finite rows that allow at least k experts).
#pragma once
#include <cstdint>

#include "ot/moe/router.h"

namespace ot::moe::refimpl {

GatingResult gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed);
GatingResult gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                                     const TensorView& allowed);
GatingResult gating_top_k(const TensorView& x, const GatingTopKOptions& opt);

}  // namespace ot::moe::refimpl
