// The quantised expert store (ot/moe/quant_experts.h): quantise each expert's [gate | up] and down,
// gather the codes and scales into [E, ...] tensors, pack them once with prepack_quantized.
#include <cstring>

#include "ot/moe/quant_experts.h"
#include "src/moe/common.h"

namespace ot::moe {

namespace {

constexpr const char* kOp = "QuantMoeExperts";

// Expert e of a stacked weight as a [rows, cols] view in x @ W orientation (torch: a transposed view).
TensorView oriented(const TensorView& w, int64_t e, bool ehi) {
  TensorView v = w.select(0, e);
  if (ehi) return v;
  return TensorView(v.data, v.dtype, {v.size(1), v.size(0)}, {v.stride(1), v.stride(0)});
}

// Byte copy of expert e's share of a [E, ...] contiguous tensor `src` (one expert) into `dst`.
void put_expert(const Tensor& src, const Tensor& dst, int64_t e) {
  const size_t n = src.view().nbytes();
  std::memcpy(static_cast<char*>(dst.view().data) + size_t(e) * n, src.view().data, n);
}

// [E] followed by the per-expert shape of `one` (which has a leading 1).
Tensor stacked_like(const Tensor& one, int64_t E) {
  std::vector<int64_t> s = one.view().shape();
  s[0] = E;
  return Tensor::empty(one.view().dtype, s);
}

struct Stack {
  QuantizedWeights all;
  void add(const QuantizedWeights& q, int64_t e, int64_t E) {
    if (e == 0) {
      all.format = q.format;
      all.group_size = q.group_size;
      all.data = stacked_like(q.data, E);
      all.scale = stacked_like(q.scale, E);
      if (q.offset.defined()) all.offset = stacked_like(q.offset, E);
    }
    put_expert(q.data, all.data, e);
    put_expert(q.scale, all.scale, e);
    if (q.offset.defined()) put_expert(q.offset, all.offset, e);
  }
};

// quantize_weights on a [K, N] view, always with a leading expert dimension of 1.
QuantizedWeights quantize_one(const TensorView& w, WeightFormat f, int64_t gs, bool sym) {
  TensorView w3(w.data, w.dtype, {1, w.size(0), w.size(1)}, {w.size(0) * w.stride(0), w.stride(0), w.stride(1)});
  return quantize_weights(w3, f, gs, sym);
}

}  // namespace

QuantMoeExperts QuantMoeExperts::quantize(const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout,
                                          WeightFormat format, int64_t group_size, bool symmetric, gemm::ActivationQuant activations) {
  const bool ehi = layout == WeightLayout::EHI;
  OT_CHECK(activations == gemm::ActivationQuant::none || format == WeightFormat::int8, kOp, "format", "int8 for int8 activations (W8A8)",
           weight_format_name(format));
  OT_CHECK(gate.ndim == 3, kOp, "gate", "[E, H, I] (EHI) or [E, I, H] (torch)", gate.shape_str());
  const int64_t E = gate.size(0), H = ehi ? gate.size(1) : gate.size(2), I = ehi ? gate.size(2) : gate.size(1);
  OT_CHECK(E >= 1 && H >= 1 && I >= 1, kOp, "gate", "E, H, I >= 1", gate.shape_str());
  OT_CHECK(up.shape() == gate.shape(), kOp, "up", detail::cat("the shape of gate ", gate.shape_str()), up.shape_str());
  const std::vector<int64_t> dshape = ehi ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, I};
  OT_CHECK(down.ndim == 3 && down.shape() == dshape, kOp, "down", ehi ? "[E, I, H]" : "[E, H, I]", down.shape_str());
  impl::check_float(kOp, "gate", gate);
  OT_CHECK(up.dtype == gate.dtype && down.dtype == gate.dtype, kOp, "up", "the dtype of gate", dtype_name(up.dtype), ", ", dtype_name(down.dtype));
  OT_CHECK(group_size == 0 || group_size == 32 || group_size == 64 || group_size == 128, kOp, "group_size", "0 (per channel), 32, 64 or 128",
           group_size);
  OT_CHECK(group_size == 0 || (H % group_size == 0 && I % group_size == 0), kOp, "group_size",
           detail::cat("a divisor of H = ", H, " and I = ", I), group_size);
  Stack gu, dn;
  Tensor cat = Tensor::empty(gate.dtype, {H, 2 * I});
  for (int64_t e = 0; e < E; ++e) {
    copy_into(oriented(gate, e, ehi), cat.view().narrow(1, 0, I));
    copy_into(oriented(up, e, ehi), cat.view().narrow(1, I, I));
    gu.add(quantize_one(cat, format, group_size, symmetric), e, E);
    dn.add(quantize_one(oriented(down, e, ehi), format, group_size, symmetric), e, E);
  }
  return from_quantized(gu.all.view(), dn.all.view(), activations);
}

QuantMoeExperts QuantMoeExperts::from_quantized(const QuantWeightView& gate_up, const QuantWeightView& down, gemm::ActivationQuant activations) {
  const QuantShape a = quant_weight_shape(kOp, gate_up), b = quant_weight_shape(kOp, down);
  OT_CHECK(a.N >= 2 && a.N % 2 == 0, kOp, "gate_up", "[E, H, 2I] codes (an even width)", a.N);
  OT_CHECK(b.G == a.G && b.K == a.N / 2 && b.N == a.K, kOp, "down", detail::cat("[E, I, H] = [", a.G, ", ", a.N / 2, ", ", a.K, "]"), "[", b.G,
           ", ", b.K, ", ", b.N, "]");
  OT_CHECK(down.format == gate_up.format && down.group_size == gate_up.group_size && down.offset.defined() == gate_up.offset.defined(), kOp,
           "down", detail::cat("the format, group size and symmetry of gate_up (", weight_format_name(gate_up.format), " g", gate_up.group_size,
                               gate_up.offset.defined() ? " asym)" : " sym)"),
           weight_format_name(down.format), " g", down.group_size, down.offset.defined() ? " asym" : " sym");
  QuantMoeExperts m;
  m.gate_up_ = std::make_shared<const gemm::PackedQuantB>(gemm::prepack_quantized(gate_up, activations));
  m.down_ = std::make_shared<const gemm::PackedQuantB>(gemm::prepack_quantized(down, activations));
  return m;
}

}  // namespace ot::moe
