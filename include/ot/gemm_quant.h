// Grouped GEMM on weight-only quantised experts (ot/quant_weights.h): activations fp32 / bf16 /
// fp16 times int8 or int4 codes with fp32 scales (and offsets), fp32 accumulation, the engine's
// epilogue (bias, activation incl. SwiGLU, output dtype). The weights are packed once
// (prepack_quantized) into 32-column panels that carry each K group's scales beside its codes;
// the micro-kernels turn codes into fp32 in registers (no dequantised copy of the weights).
#pragma once
#include <cstdint>
#include <memory>

#include "ot/gemm.h"
#include "ot/quant_weights.h"

namespace ot::gemm {

// What the activations become inside the quantised GEMM.
//   none: weight-only. fp32 activations stay fp32; bf16 / fp16 ones are rounded to int16 against a
//         scale per 32 k (error <= 2^-16 of the block's largest |a|, below their own rounding).
//   int8_per_token (W8A8, int8 weights only): each activation row is quantised once per call with
//         quantize_row_i8_dynamic (ot/quant.h: d = max|row| / 127 over all of K, q = round half to
//         even of a / d; a row with a NaN or Inf gives NaN outputs), or taken as given int8 codes with
//         per-row scales (QuantGroup::a_scale). Products are exact int32 sums (vpdpbusd), scaled
//         once per K group. Lossy against weight-only (~0.5-1% relative for Gaussian rows): the
//         reference quantises the activations the same way, then multiplies in fp32.
enum class ActivationQuant : uint8_t { none, int8_per_token };

class PackedQuantB {
 public:
  PackedQuantB();
  ~PackedQuantB();
  PackedQuantB(PackedQuantB&&) noexcept;
  PackedQuantB& operator=(PackedQuantB&&) noexcept;
  int64_t G() const;  // experts
  int64_t K() const;
  int64_t N() const;
  WeightFormat format() const;
  int64_t group_size() const;  // 0: per output channel
  bool has_offset() const;
  ActivationQuant activation_quant() const;  // chosen at packing: the panels' layout differs
  size_t bytes() const;         // packed size, scales included (for bandwidth accounting)
  size_t expert_bytes() const;  // one expert's share of bytes()
  bool empty() const { return impl_ == nullptr; }
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
  friend PackedQuantB prepack_quantized(const QuantWeightView&, ActivationQuant);
};

// w: validated by quant_weight_shape (ot::Error from "prepack_quantized" naming the argument).
// int8_per_token needs int8 codes and K groups of at most 65536 rows (the int32 sums' range).
PackedQuantB prepack_quantized(const QuantWeightView& w, ActivationQuant activations = ActivationQuant::none);

// One expert's GEMM: C[M, N'] = epilogue(A[M, K] x W[expert]); N' = N / 2 for SwiGLU ([gate | up],
// N even). A row i at a + (a_rows ? a_rows[i] : i) * lda (elements, f32 / bf16 / f16; a_rows gathers
// token rows, as AOperand::rows), C rows at c.data + i * c.ld.
struct QuantGroup {
  int64_t M = 0;
  const void* a = nullptr;
  DType a_dtype = DType::f32;
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;  // [M] or null
  // a_dtype i8 (int8_per_token packs only): codes already quantised per row, row i's scale at
  // a_scale[a_rows ? a_rows[i] : i] (EP dispatch's quant_int8 rows feed the experts as they arrive).
  const float* a_scale = nullptr;
  int64_t expert = 0;
  COperand c;
  const float* bias = nullptr;  // [N] (the pre-activation width)
  Act act = Act::none;
};
// Groups must write disjoint C rows. Runs on all threads (inline inside a parallel region).
void grouped_gemm_quant(const PackedQuantB& b, const QuantGroup* groups, int64_t count);

// Name of the micro-kernel grouped_gemm_quant runs for this format under the active ISA cap.
const char* quant_kernel_name(WeightFormat f, ActivationQuant activations = ActivationQuant::none);

}  // namespace ot::gemm
