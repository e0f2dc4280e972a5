// The small MoE language model of `ot train-moe`: byte-level embedding, L blocks of
//   x += W_mix . causal_depthwise_conv(rmsnorm(x))      (token mixing, window `window`)
//   x += moe_ffn(rmsnorm(x))                            (the library's MoE layer, fwd + bwd)
// then rmsnorm and a linear head with softmax cross-entropy. fp32 master weights; the MoE runs in
// the compute dtype (bf16 by default) on copies made each step. Matrix work: ot::gemm::matmul.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"

namespace ot::cli::train {

struct ModelConfig {
  int64_t vocab = 0, dim = 64, inter = 128, experts = 8, topk = 2, layers = 2, window = 8;
  DType dtype = DType::bf16;  // compute dtype of the MoE layers
  float aux_coeff = 0.01f;
};

// One parameter: fp32 value, its gradient and AdamW moments.
struct Param {
  Tensor w, g, m, v;
  bool decay = true;
  void init(const std::vector<int64_t>& shape, std::mt19937_64& rng, float scale, bool decay_ = true);
  void zero_grad();
};

struct Model {
  ModelConfig cfg;
  Param emb, nf, head;
  struct Block { Param n1, conv, mix, n2, router, gate, up, down; };
  std::vector<Block> blocks;
  std::vector<Param*> params();
  void init(const ModelConfig& c, uint64_t seed);
};

struct StepStats {
  double loss = 0;      // mean cross-entropy, nats per char
  double aux = 0;       // sum of the MoE aux losses
  int64_t dropped = 0;  // pairs dropped (dropless here: 0)
};
// Forward + backward of one batch: inputs/targets [B*S] (B sequences of S bytes). Fills the grads.
StepStats train_step(Model& m, const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets, int64_t B, int64_t S);
// AdamW update of every parameter (decoupled weight decay on matrices).
void adamw(Model& m, float lr, int step, float beta1 = 0.9f, float beta2 = 0.95f, float wd = 0.01f, float eps = 1e-8f);

}  // namespace ot::cli::train
