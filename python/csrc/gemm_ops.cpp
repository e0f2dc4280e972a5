// Matrix engine op (matmul on strided activations) and the run-time path controls.
#include "bridge.h"
#include "holders.h"
#include "ops.h"
#include "ot/cpu.h"
#include "ot/gemm.h"

namespace ot::py {

Tensor matmul(const Tensor& a, const Tensor& b, double alpha, c10::optional<c10::ScalarType> out_dtype) {
  auto va = view(a, "matmul", "a"), vb = view(b, "matmul", "b");
  OT_CHECK(va.ndim == 2, "matmul", "a", "a 2-D tensor", va.shape_str());
  OT_CHECK(vb.ndim == 2, "matmul", "b", "a 2-D tensor", vb.shape_str());
  OT_CHECK(is_float(va.dtype), "matmul", "a", "float32, bfloat16 or float16", dtype_name(va.dtype));
  OT_CHECK(is_float(vb.dtype), "matmul", "b", "float32, bfloat16 or float16", dtype_name(vb.dtype));
  OT_CHECK(vb.sizes[0] == va.sizes[1], "matmul", "b", "rows equal to a's columns " + std::to_string(va.sizes[1]), vb.shape_str());
  Tensor c = empty({va.sizes[0], vb.sizes[1]}, out_dtype.value_or(a.scalar_type()));
  auto vc = view(c, "matmul", "out_dtype");
  OT_CHECK(is_float(vc.dtype), "matmul", "out_dtype", "float32, bfloat16 or float16", dtype_name(vc.dtype));
  gemm::matmul(gemm::MatView::of(va), gemm::MatView::of(vb), gemm::MutMatView::of(vc), float(alpha), 0.f);
  return c;
}

PackedWeightHolder::PackedWeightHolder(const at::Tensor& w, const std::string& layout) {
  guard([&] {
    OT_CHECK(layout == "torch" || layout == "KN", "PackedWeight", "layout", "\"torch\" ([N, K]) or \"KN\"", layout);
    b = gemm::prepack(view(w, "PackedWeight", "weight"), layout == "torch" ? gemm::BLayout::NK : gemm::BLayout::KN);
    return 0;
  });
}

// torch_npu act_type codes (+ 6 = swiglu, this library's addition) -> engine epilogue.
gemm::Act act_of(int64_t act_type, const char* op) {
  switch (act_type) {
    case 0: return gemm::Act::none;
    case 1: return gemm::Act::relu;
    case 2: return gemm::Act::gelu;
    case 5: return gemm::Act::silu;
    case 6: return gemm::Act::swiglu;
    default: break;
  }
  throw ot::Error(op, "act_type", "0 none, 1 relu, 2 gelu, 5 silu or 6 swiglu (this library's addition)", std::to_string(act_type));
}

void set_max_isa(int64_t isa) {
  OT_CHECK(isa >= 0 && isa <= int64_t(cpu::Isa::amx), "set_max_isa", "isa", "0..4 (scalar, avx2, avx512, avx512_bf16, amx)", isa);
  cpu::set_max_isa(cpu::Isa(isa));
}
void set_force_ref(bool on) { cpu::set_force_ref(on); }
std::tuple<int64_t, bool> isa_state() { return {int64_t(cpu::active_isa()), cpu::force_ref()}; }

}  // namespace ot::py
