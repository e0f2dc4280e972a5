// moe_ffn on weight-only quantised experts (ot/quant_weights.h): the same layer as ot/moe/ffn.h
// (router, top-k, gate/up GEMM with SwiGLU, down GEMM, weighted combine) with the expert weights
// stored as int8 (per output channel) or int4 (groups of 32, 64 or 128 K rows), symmetric or with
// offsets, and dequantised in registers by the quantised grouped GEMM (ot/gemm_quant.h).
#pragma once
#include <cstdint>
#include <memory>

#include "ot/gemm_quant.h"
#include "ot/moe/ffn.h"
#include "ot/quant_weights.h"

namespace ot::moe {

// All E experts packed once: gate_up [E, H, 2I] (gate half, then up half, quantised per column, so
// the same codes as quantising gate and up on their own) and down [E, I, H]. Copies share the packed
// weights. Immutable: replacing an expert means building a new store.
class QuantMoeExperts {
 public:
  QuantMoeExperts() = default;
  // Quantises fp32/bf16/fp16 experts (the layouts of MoeExperts::from_stacked) with
  // quantize_weights(w, format, group_size, symmetric), one expert at a time. group_size must
  // divide H (gate/up) and I (down). ot::Error from "QuantMoeExperts" naming the argument.
  // activations int8_per_token (int8 only): W8A8 experts (ot/gemm_quant.h), packed for it.
  static QuantMoeExperts quantize(const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout, WeightFormat format,
                                  int64_t group_size, bool symmetric, gemm::ActivationQuant activations = gemm::ActivationQuant::none);
  // Already quantised weights (quantize_weights' output): gate_up [E, H, 2I], down [E, I, H], of one
  // format, group size and symmetry.
  static QuantMoeExperts from_quantized(const QuantWeightView& gate_up, const QuantWeightView& down,
                                        gemm::ActivationQuant activations = gemm::ActivationQuant::none);

  int64_t num_experts() const { return gate_up_ ? gate_up_->G() : 0; }
  int64_t hidden() const { return gate_up_ ? gate_up_->K() : 0; }
  int64_t intermediate() const { return gate_up_ ? gate_up_->N() / 2 : 0; }
  WeightFormat format() const { return gate_up_ ? gate_up_->format() : WeightFormat::int8; }
  int64_t group_size() const { return gate_up_ ? gate_up_->group_size() : 0; }
  bool symmetric() const { return !gate_up_ || !gate_up_->has_offset(); }
  gemm::ActivationQuant activation_quant() const { return gate_up_ ? gate_up_->activation_quant() : gemm::ActivationQuant::none; }
  bool empty() const { return gate_up_ == nullptr; }
  const gemm::PackedQuantB& gate_up() const { return *gate_up_; }
  const gemm::PackedQuantB& down() const { return *down_; }
  size_t expert_bytes() const { return gate_up_ ? gate_up_->expert_bytes() + down_->expert_bytes() : 0; }  // packed, scales included

 private:
  std::shared_ptr<const gemm::PackedQuantB> gate_up_, down_;
};

// Rows of the quantised store as moe_expert_ffn takes them (ExpertRows); x [*, H] bf16/fp16/fp32,
// out [*, H] float, accumulate as there. A W8A8 store also takes int8 rows with x_scale [x rows]
// fp32 (row r is x[r, :] * x_scale[r]: the EP dispatch's quant_int8 rows), used as its int8
// activations without a float round trip; h is then kept in out's dtype.
void moe_expert_ffn(const TensorView& x, const QuantMoeExperts& experts, const ExpertRows& rows, const TensorView& out, bool accumulate,
                    const TensorView& x_scale = {});

// moe_ffn (ot/moe/ffn.h) on quantised experts: x [T, H] bf16/fp16/fp32, y in x's dtype; the shared
// expert (opt.shared) stays an unquantised MoeExperts in x's dtype. Every argument is checked before
// any output is written.
MoeFfnResult moe_ffn(const TensorView& x, const gemm::PackedB& router, const QuantMoeExperts& experts, const MoeFfnOptions& opt = {});

namespace ref {
// dequantize_weights, split gate_up into gate and up, then the plain moe_ffn reference (for
// int8_per_token with the routed experts' input rows quantised per token and dequantised).
MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight, const QuantWeightView& gate_up, const QuantWeightView& down,
                     const MoeFfnOptions& opt = {}, const TensorView& shared_gate = {}, const TensorView& shared_up = {},
                     const TensorView& shared_down = {}, gemm::ActivationQuant activations = gemm::ActivationQuant::none);
}  // namespace ref

}  // namespace ot::moe
