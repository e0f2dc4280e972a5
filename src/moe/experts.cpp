// The prepacked expert store: one PackedB pair per expert, so experts can be replaced, added or
// removed without touching the others.
#include "ot/moe/ffn.h"
#include "src/moe/common.h"

namespace ot::moe {

static const char* kOp = "MoeExperts";

MoeExperts::MoeExperts(int64_t hidden, int64_t intermediate) : hidden_(hidden), inter_(intermediate), fixed_shape_(true) {
  OT_CHECK(hidden >= 1, kOp, "hidden", "H >= 1", hidden);
  OT_CHECK(intermediate >= 1, kOp, "intermediate", "I >= 1", intermediate);
}

// The shape and dtype an expert must have: an empty store takes them from the expert (H and I stay
// as given when the store was constructed with them), a non-empty one keeps its own. Checks e and
// the dtype before anything is packed; nothing is changed here.
MoeExperts::Shape MoeExperts::shape_for(int64_t e, int64_t h, int64_t i, DType dt) const {
  OT_CHECK(e >= 0 && e <= num_experts(), kOp, "e", detail::cat("0 <= e <= E = ", num_experts(), " (E appends)"), e);
  if (experts_.empty()) {
    Shape s{fixed_shape_ ? hidden_ : h, fixed_shape_ ? inter_ : i, dt};
    OT_CHECK(s.h >= 1 && s.i >= 1, kOp, "gate", "a weight with H >= 1 and I >= 1", "H ", s.h, ", I ", s.i);
    return s;
  }
  OT_CHECK(dt == dtype_, kOp, "weights", detail::cat("the store's dtype ", dtype_name(dtype_)), dtype_name(dt));
  return {hidden_, inter_, dtype_};
}

// Commits one checked and packed expert; the only place the store changes on set.
void MoeExperts::put(int64_t e, Expert ex, const Shape& s) {
  if (e == num_experts()) experts_.push_back(std::move(ex)); else experts_[size_t(e)] = std::move(ex);
  hidden_ = s.h;
  inter_ = s.i;
  dtype_ = s.dt;
}

static void check_w(const char* arg, const TensorView& w, int64_t r, int64_t c) {
  impl::check_float(kOp, arg, w);
  OT_CHECK(w.ndim == 2 && w.size(0) == r && w.size(1) == c, kOp, arg, detail::cat("[", r, ", ", c, "]"), w.shape_str());
}

void MoeExperts::set(int64_t e, const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout) {
  OT_CHECK(gate.ndim == 2, kOp, "gate", "a 2-D weight", gate.shape_str());
  bool ehi = layout == WeightLayout::EHI;
  const Shape s = shape_for(e, ehi ? gate.size(0) : gate.size(1), ehi ? gate.size(1) : gate.size(0), gate.dtype);
  const int64_t H = s.h, I = s.i;
  check_w("gate", gate, ehi ? H : I, ehi ? I : H);
  check_w("up", up, ehi ? H : I, ehi ? I : H);
  check_w("down", down, ehi ? I : H, ehi ? H : I);
  OT_CHECK(up.dtype == gate.dtype && down.dtype == gate.dtype, kOp, "up", "the dtype of gate", dtype_name(up.dtype), ", ", dtype_name(down.dtype));
  // [gate | up] as one B so the SwiGLU is the GEMM's epilogue.
  Tensor gu = Tensor::empty(gate.dtype, ehi ? std::vector<int64_t>{H, 2 * I} : std::vector<int64_t>{2 * I, H});
  copy_into(gate, gu.view().narrow(ehi ? 1 : 0, 0, I));
  copy_into(up, gu.view().narrow(ehi ? 1 : 0, I, I));
  gemm::BLayout bl = ehi ? gemm::BLayout::KN : gemm::BLayout::NK;
  Expert ex{std::make_shared<const gemm::PackedB>(gemm::prepack(gu, bl)), std::make_shared<const gemm::PackedB>(gemm::prepack(down, bl))};
  put(e, std::move(ex), s);
}

void MoeExperts::set_fused(int64_t e, const TensorView& gate_up, const TensorView& down, WeightLayout layout) {
  OT_CHECK(gate_up.ndim == 2, kOp, "gate_up", "a 2-D weight", gate_up.shape_str());
  bool ehi = layout == WeightLayout::EHI;
  const int64_t two_i = ehi ? gate_up.size(1) : gate_up.size(0);
  OT_CHECK(two_i % 2 == 0, kOp, "gate_up", "an even 2I (gate half, up half)", gate_up.shape_str());
  const Shape s = shape_for(e, ehi ? gate_up.size(0) : gate_up.size(1), two_i / 2, gate_up.dtype);
  const int64_t H = s.h, I = s.i;
  check_w("gate_up", gate_up, ehi ? H : 2 * I, ehi ? 2 * I : H);
  check_w("down", down, ehi ? I : H, ehi ? H : I);
  OT_CHECK(down.dtype == gate_up.dtype, kOp, "down", "the dtype of gate_up", dtype_name(down.dtype));
  gemm::BLayout bl = ehi ? gemm::BLayout::KN : gemm::BLayout::NK;
  Expert ex{std::make_shared<const gemm::PackedB>(gemm::prepack(gate_up, bl)), std::make_shared<const gemm::PackedB>(gemm::prepack(down, bl))};
  put(e, std::move(ex), s);
}

void MoeExperts::remove(int64_t e) {
  OT_CHECK(e >= 0 && e < num_experts(), kOp, "e", detail::cat("an expert id in [0, ", num_experts(), ")"), e);
  experts_.erase(experts_.begin() + e);
}

size_t MoeExperts::expert_bytes(int64_t e) const { return gate_up(e).bytes() + down(e).bytes(); }

MoeExperts MoeExperts::from_stacked(const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout) {
  OT_CHECK(gate.ndim == 3, kOp, "gate", "[E, H, I] (EHI) or [E, I, H] (torch)", gate.shape_str());
  OT_CHECK(up.ndim == 3 && up.size(0) == gate.size(0), kOp, "up", detail::cat("[E, ...] with E = ", gate.size(0)), up.shape_str());
  OT_CHECK(down.ndim == 3 && down.size(0) == gate.size(0), kOp, "down", detail::cat("[E, ...] with E = ", gate.size(0)), down.shape_str());
  MoeExperts m;
  for (int64_t e = 0; e < gate.size(0); ++e) m.set(e, gate.select(0, e), up.select(0, e), down.select(0, e), layout);
  return m;
}

MoeExperts MoeExperts::from_fused(const TensorView& gate_up, const TensorView& down, WeightLayout layout) {
  OT_CHECK(gate_up.ndim == 3, kOp, "gate_up", "[E, H, 2I] (EHI) or [E, 2I, H] (torch)", gate_up.shape_str());
  OT_CHECK(down.ndim == 3 && down.size(0) == gate_up.size(0), kOp, "down", detail::cat("[E, ...] with E = ", gate_up.size(0)), down.shape_str());
  MoeExperts m;
  for (int64_t e = 0; e < gate_up.size(0); ++e) m.set_fused(e, gate_up.select(0, e), down.select(0, e), layout);
  return m;
}

}  // namespace ot::moe
