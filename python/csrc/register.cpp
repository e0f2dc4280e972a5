// THE registration file: every operator of the library as torch.ops.ops_transformer.<name>, with an
// explicit schema. Names, argument order and defaults follow torch_npu (npu_moe_* without the npu_
// prefix) for MoE and fla for GDN, so porting code is a namespace change.
#include <torch/library.h>

#include "bridge.h"
#include "ops.h"

TORCH_LIBRARY(ops_transformer, m) {
  using namespace ot::py;
  // ---- matrix engine and run-time controls
  m.def("matmul(Tensor a, Tensor b, *, float alpha=1.0, ScalarType? out_dtype=None) -> Tensor", OT_OP(matmul));
  m.def("set_max_isa(int isa) -> ()", OT_OP(set_max_isa));
  m.def("set_force_ref(bool on) -> ()", OT_OP(set_force_ref));
  m.def("isa_state() -> (int, bool)", OT_OP(isa_state));
  m.def("_cpp_call_us(str op, Tensor[] args, int iters) -> float", OT_OP(cpp_call_us));
}
