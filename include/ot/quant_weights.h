// Weight-only quantisation of expert weights w[G, K, N] (torch_npu's "antiquant" convention):
//
//   w[g, k, n] ~= (q[g, k, n] + offset[g, j, n]) * scale[g, j, n],   j = k / group_size
//
// group_size 0: one group over all of K (per output channel): scale, offset [G, N].
// group_size 32, 64 or 128: groups of that many K rows: scale, offset [G, K / group_size, N]
// (K a multiple of group_size).
// Formats (codes q):
//   int8: q in [-128, 127], data i8 [G, K, N].
//   int4: q in [-8, 7], data u8 [G, K, (N + 1) / 2], two codes a byte: byte (g, k, j) holds column
//         2j in its low nibble and column 2j + 1 in its high nibble, each as a 4-bit two's-complement
//         code; for odd N the last high nibble of each row is 0.
// offset absent: symmetric. scale and offset are float tensors (fp32, bf16 or fp16; the quantiser
// returns fp32).
#pragma once
#include <cstdint>

#include "ot/tensor.h"

namespace ot {

enum class WeightFormat : uint8_t { int8, int4 };
const char* weight_format_name(WeightFormat f);

// Views of quantised weights as operators take them (torch_npu: weight, antiquant_scale,
// antiquant_offset, antiquant_group_size). data's dtype must match format (int8: i8, int4: u8).
struct QuantWeightView {
  TensorView data, scale, offset;  // offset undefined: symmetric
  WeightFormat format = WeightFormat::int8;
  int64_t group_size = 0;
};

struct QuantizedWeights {
  Tensor data, scale, offset;  // offset undefined: symmetric
  WeightFormat format = WeightFormat::int8;
  int64_t group_size = 0;
  QuantWeightView view() const { return {data.view(), scale.view(), offset.view(), format, group_size}; }
};

// Quantises fp32 / bf16 / fp16 weights w [G, K, N] (or [K, N], taken as G = 1), per group of K rows
// and output column (a group is all of K when group_size is 0):
//   symmetric:  scale = max|w| / qmax (qmax 127 or 7), no offset;
//   asymmetric: scale = (max w - min w) / (qmax - qmin) (255 or 15), offset = min w / scale - qmin,
//               so the group's min and max map to qmin and qmax; a constant group c gets
//               scale = |c| (1 when c = 0) and the same offset formula.
//   q = clamp(round(w / scale - offset), qmin, qmax) in fp32, round to nearest with ties away from
//   zero (std::round); a zero scale gives q = 0.
// ot::Error (naming the argument) for: w not 2-D/3-D or not a float dtype, a non-finite value,
// group_size not 0/32/64/128 or not dividing K.
QuantizedWeights quantize_weights(const TensorView& w, WeightFormat format, int64_t group_size, bool symmetric);
// The codes of w for given scales (and offsets, optional): the rounding and clamp above. For
// calibrated scales; quantize_weights is this with its own scales.
QuantizedWeights quantize_weights_with(const TensorView& w, const TensorView& scale, const TensorView& offset, WeightFormat format,
                                       int64_t group_size);

// (q + offset) * scale in fp32, [G, K, N]: the plain dequantisation the references multiply with.
// Validates like the operators (quant_weight_shape).
Tensor dequantize_weights(const QuantWeightView& w);

// G, K, N of validated quantised weights; ot::Error from `op` naming the argument otherwise
// (data dtype vs format, int4 packed width, scale / offset shape and dtype, group_size, NaN/Inf or
// zero-size scales and offsets).
struct QuantShape { int64_t G = 0, K = 0, N = 0, groups = 1, group_len = 0; };  // group_len: K rows per group
QuantShape quant_weight_shape(const char* op, const QuantWeightView& w);

}  // namespace ot
