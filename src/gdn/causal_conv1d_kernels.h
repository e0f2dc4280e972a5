// The inner kernels of the causal depthwise conv1d (causal_conv1d.cpp drives them): one channel
// block of one sequence (forward) or of every sequence (backward) at a time, compiled once per ISA
// from causal_conv1d_kernels.inc. The caller prepares the block's weights, bias and states in fp32,
// channel-minor ([k][c]), so every inner loop runs over kBlock contiguous channels.
#pragma once
#include <cstdint>

#include "ot/tensor.h"
#include "src/core/elem_at.h"
#include "src/core/kernel_list.h"

namespace ot::gdn::detail::conv {

inline constexpr int64_t kBlock = 256;   // channels per job (rows of 512 contiguous bf16 bytes per token)
inline constexpr int64_t kMaxWidth = 8;  // kernel widths 2..8

// Tokens of one sequence for channels c0 .. c0 + nc - 1: token t at p + t * st elements.
using Rows = StridedRows;
using OutRows = StridedOutRows;

struct Block {
  int64_t nc = 0, W = 0;       // channels in this block (<= kBlock), kernel width
  const float* w = nullptr;    // [W][kBlock]: w[k * kBlock + c] = weight[c0 + c, k], zero past nc
  const float* bias = nullptr; // [kBlock] (zeros without a bias)
  bool silu = false;
};

// y[t] = act(bias + sum_k w[k] s[t + k]) over the stream s = init (W-1 rows, null: zeros), x.
// fin (null: not wanted) receives the stream's last W-1 rows, [W-1][kBlock].
struct FwdSeq {
  Rows x;
  OutRows y;
  int64_t len = 0;
  const float* init = nullptr;
  float* fin = nullptr;
};
// The backward of one sequence: dy in, dx out; dfin ([W-1][kBlock], null: zeros) is the gradient
// of the final state, dinit ([W-1][kBlock], null: not wanted) receives the initial state's. dw
// ([W][kBlock]) and db ([kBlock]) are accumulated (the caller visits sequences in a fixed order).
struct BwdSeq {
  Rows x, dy;
  OutRows dx;
  int64_t len = 0;
  const float* init = nullptr;
  const float* dfin = nullptr;
  float* dinit = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
};

#define OT_CONV_DECLARE(ns)                             \
  namespace ns {                                        \
  void fwd_seq(const Block& b, const FwdSeq& s);       \
  void bwd_seq(const Block& b, const BwdSeq& s);       \
  }
OT_CONV_DECLARE(generic)
OT_CONV_DECLARE(avx2)
#undef OT_CONV_DECLARE

struct SeqKernels {
  void (*fwd_seq)(const Block& b, const FwdSeq& s);
  void (*bwd_seq)(const Block& b, const BwdSeq& s);
};
// The ISA's kernels (the list is in causal_conv1d.cpp; causal_conv1d_update shares it).
const cpu::KernelEntry<SeqKernels, cpu::AnyPlan>& seq_kernels();

}  // namespace ot::gdn::detail::conv
