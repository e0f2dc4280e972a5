// Argument checks and fp32 block preparation shared by causal_conv1d_fn, its backward and its
// decode step (causal_conv1d.cpp, causal_conv1d_update.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ot/gdn.h"
#include "ot/gdn_layer.h"
#include "src/gdn/causal_conv1d_kernels.h"

namespace ot::gdn::detail::conv {

// weight [D, W] with W in [2, kMaxWidth]; bias [D] when defined; both float. Returns W.
int64_t check_weight_bias(const TensorView& weight, const TensorView& bias, int64_t D, const char* op);
// A [N, D, W-1] state tensor in x's dtype or fp32 (`arg` names it).
void check_state(const TensorView& s, int64_t N, int64_t D, int64_t W, DType x_dtype, const char* op, const char* arg,
                 bool any_float = false);

// Weights and bias of every channel block in fp32, channel-minor: block i at w + i * W * kBlock and
// bias + i * kBlock, zero past D.
struct PackedWeights {
  int64_t D = 0, W = 0, blocks = 0;
  std::vector<float> w, bias;
  Block block(int64_t i, bool silu) const {
    return {std::min(kBlock, D - i * kBlock), W, w.data() + i * W * kBlock, bias.data() + i * kBlock, silu};
  }
};
PackedWeights pack_weights(const TensorView& weight, const TensorView& bias);

// State rows [W-1][kBlock] of sequence n, channels c0.. of a [N, D, W-1] tensor, and back.
void gather_state(const TensorView& s, int64_t n, int64_t c0, int64_t nc, int64_t W, float* dst);
void scatter_state(const float* src, const TensorView& s, int64_t n, int64_t c0, int64_t nc, int64_t W);

}  // namespace ot::gdn::detail::conv
