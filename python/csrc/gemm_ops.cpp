// Matrix engine op (matmul on strided activations) and the run-time path controls.
#include "bridge.h"
#include "holders.h"
#include "ops.h"
#include "ot/cpu.h"
#include "ot/gemm.h"
#include "ot/parallel.h"
#include "src/core/row_view.h"

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

Tensor bmm(const Tensor& a, const Tensor& b) {
  const char* op = "bmm";
  auto va = view(a, op, "a"), vb = view(b, op, "b");
  OT_CHECK(va.ndim == 3, op, "a", "a 3-D tensor [B, M, K]", va.shape_str());
  OT_CHECK(vb.ndim == 3 && vb.sizes[0] == va.sizes[0] && vb.sizes[1] == va.sizes[2], op, "b",
           "[B, K, N] with a's B = " + std::to_string(va.sizes[0]) + " and K = " + std::to_string(va.sizes[2]), vb.shape_str());
  OT_CHECK(is_float(va.dtype) && vb.dtype == va.dtype, op, "b", std::string("a's dtype ") + dtype_name(va.dtype) + " (float32, bfloat16 or float16)",
           dtype_name(vb.dtype));
  const int64_t B = va.sizes[0], M = va.sizes[1], N = vb.sizes[2];
  Tensor c = empty({B, M, N}, a.scalar_type());
  auto vc = view(c, op, "c");
  auto mat = [](const TensorView& v, int64_t i) {
    return gemm::MatView{static_cast<const char*>(v.data) + size_t(i * v.strides[0]) * dtype_size(v.dtype), v.dtype, v.sizes[1], v.sizes[2],
                         v.strides[1], v.strides[2]};
  };
  // One product a task (each on its thread alone: the products of attention heads are small).
  parallel_for(B, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      gemm::MutMatView ci{static_cast<char*>(vc.data) + size_t(i * M * N) * dtype_size(vc.dtype), vc.dtype, M, N, N, 1};
      gemm::matmul(mat(va, i), mat(vb, i), ci, 1.f, 0.f);
    }
  });
  return c;
}

Tensor linear_packed(const Tensor& x, const c10::intrusive_ptr<PackedWeightHolder>& w) {
  const char* op = "linear_packed";
  OT_CHECK(w.defined(), op, "weight", "a PackedWeight", "None");
  auto vx = view(x, op, "x");
  OT_CHECK(vx.ndim >= 1, op, "x", "[..., K]", vx.shape_str());
  OT_CHECK(is_float(vx.dtype), op, "x", "float32, bfloat16 or float16", dtype_name(vx.dtype));
  const int64_t K = vx.sizes[vx.ndim - 1], M = detail::leading_rows(vx);
  OT_CHECK(K == w->K(), op, "x", "[..., K] with the weight's K = " + std::to_string(w->K()), vx.shape_str());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w->N();
  Tensor y = empty(shape, x.scalar_type());
  if (M == 0) return y;
  ot::Tensor keep;  // [..., K] as rows one stride apart (a copy only when the leading dims do not collapse)
  const TensorView rows = detail::as_rows(vx, M, K, keep);
  auto vy = view(y, op, "y");
  gemm::gemm(M, {rows.data, rows.dtype, M > 1 ? rows.strides[0] : K}, w->b, {vy.data, vy.dtype, w->N()});
  return y;
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
